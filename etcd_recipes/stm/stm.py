""":class:`STM` and :func:`run_stm`: multi-key optimistic transactions with Go's isolation
levels. What they guarantee and what they do not: see :mod:`etcd_recipes.stm`.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from .._core.keys import key_bytes
from .._core.txn import AnyOp, Cmp, Compare, Op, PutOp
from .._core.validate import check_choice, check_count
from ..client import check_client
from ..errors import CompactedError, InvalidArgumentTypeError, StmConflictError, UsageError
from ..types import KeyValue, RangeResult

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["STM", "Isolation", "run_stm"]

R = TypeVar("R")

DEFAULT_MAX_RETRIES = 100
"""How many times a run retries after a conflict before :class:`StmConflictError`."""

_MAX_PAUSE = 0.05  # seconds: the longest random pause between two attempts


class Isolation(enum.Enum):
    """The isolation level of a run -- Go's ``concurrency.Isolation``, with its semantics.

    * ``SERIALIZABLE_SNAPSHOT`` (the default): every read comes from one snapshot, the store
      revision of the run's first read; the commit succeeds only if no key the run read *or
      wrote* changed since that snapshot. Serializable, and a blind write to a key someone
      else changed meanwhile is a conflict too (no lost write of a key read by others later).
    * ``SERIALIZABLE``: reads from one snapshot as above, but only the keys the run **read**
      are checked at commit: a blind write (a key written, never read) never conflicts.
    * ``REPEATABLE_READS``: every read goes to the latest revision (two keys may come from
      different revisions) and is cached, so a key read twice returns the same value; the
      commit succeeds only if no key the run read changed since it was read.
    * ``READ_COMMITTED``: reads go to the latest revision and are cached; the commit checks
      nothing and always succeeds -- concurrent read-modify-writes can lose updates.

    Example::

        from etcd_recipes import Isolation

        assert Isolation("serializable") is Isolation.SERIALIZABLE
    """

    SERIALIZABLE_SNAPSHOT = "serializable-snapshot"
    SERIALIZABLE = "serializable"
    REPEATABLE_READS = "repeatable-reads"
    READ_COMMITTED = "read-committed"


_SNAPSHOT_LEVELS = (Isolation.SERIALIZABLE_SNAPSHOT, Isolation.SERIALIZABLE)


@dataclass(frozen=True)
class _Read:
    kv: KeyValue | None
    revision: int  # the store revision the read was served at


class STM:
    """A software transactional memory over ``client``: :meth:`run` runs an ``apply`` that
    reads and writes keys through it, commits its writes in one transaction and retries it on
    conflict. :func:`run_stm` is the one-call form.

    The instance is reusable (one run at a time). It holds no lease, no watch and no task, so
    it needs no closing. In the blocking facade this is the form to use: ``apply`` is a plain
    function, called in a worker thread with the blocking twin of this instance.

    Example::

        from etcd_recipes import STM

        stm = STM(client)
        await client.put(f"{prefix}/a", b"10")

        async def move(tx):
            a = int(await tx.get(f"{prefix}/a") or b"0")
            tx.put(f"{prefix}/a", str(a - 3))
            tx.put(f"{prefix}/b", str(3))
            return a - 3

        print(await stm.run(move))  # 7
        print((await client.get(f"{prefix}/b")).text, stm.attempts)  # 3 1

    :param isolation: see :class:`Isolation`.
    :param max_retries: retries after a conflict before :class:`StmConflictError`; ``None``
        retries forever (Go's behaviour).
    :param prefetch: keys read at the start of every attempt, all at one revision.
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        isolation: Isolation = Isolation.SERIALIZABLE_SNAPSHOT,
        max_retries: int | None = DEFAULT_MAX_RETRIES,
        prefetch: Sequence[bytes | str] = (),
    ) -> None:
        self._client = check_client(client)
        self.isolation: Isolation = check_choice(isolation, Isolation, what="isolation")
        """The isolation level of every run."""
        self.max_retries: int | None = (
            None if max_retries is None else check_count(max_retries, what="max_retries", minimum=0)
        )
        """Retries after a conflict before giving up (``None``: no limit)."""
        if isinstance(prefetch, (str, bytes)):
            raise InvalidArgumentTypeError("prefetch must be a sequence of keys, not one key")
        self.prefetch: tuple[bytes, ...] = tuple(key_bytes(k) for k in prefetch)
        """Keys read at the start of every attempt."""
        self.attempts: int = 0
        """How many times ``apply`` ran in the current (or last) run."""
        self.revision: int = 0
        """The revision the last run committed at (0 before, or when it wrote and read nothing)."""
        self._running = False
        self._reads: dict[bytes, _Read] = {}
        self._writes: dict[bytes, AnyOp] = {}
        self._prefetched: dict[bytes, _Read] = {}
        self._snapshot = 0  # the snapshot revision of the attempt (snapshot levels), 0: none
        self._doomed = False  # a read failed (compacted): the attempt must run again

    # ---------------------------------------------------------------- the run

    async def run(self, apply: Callable[..., Awaitable[R]]) -> R:
        """Run ``apply(self)`` until its writes commit; its result.

        ``apply`` may run several times (once per attempt); an exception it raises ends the
        run with nothing written. Raises :class:`StmConflictError` after ``max_retries``
        retries, and :class:`UsageError` when this instance is already running.

        Example::

            from etcd_recipes import STM

            async def claim(tx):
                if await tx.get(f"{prefix}/owner") is None:
                    tx.put(f"{prefix}/owner", "me")
                    return True
                return False

            stm = STM(client)
            print(await stm.run(claim), await stm.run(claim))  # True False
        """
        if self._running:
            raise UsageError("this STM is already running an apply (one run at a time)")
        if not callable(apply):
            raise InvalidArgumentTypeError(f"apply must be callable, not {apply!r}")
        self._running = True
        self._prefetched = {}
        self.attempts = 0
        try:
            while True:
                self._reset()
                self.attempts += 1
                try:
                    for key in self.prefetch:
                        await self._fetch(key)
                    result = await apply(self)
                    if not self._doomed and await self._commit():
                        return result
                except CompactedError:
                    if not self._doomed:
                        raise
                    self._prefetched = {}
                retries = self.attempts - 1
                if self.max_retries is not None and retries >= self.max_retries:
                    raise StmConflictError(
                        f"STM ({self.isolation.value}): still conflicting after "
                        f"{self.attempts} attempts",
                        attempts=self.attempts,
                    )
                pause = min(_MAX_PAUSE, 0.001 * 2 ** min(retries, 6))
                await asyncio.sleep(random.uniform(0, pause))
        finally:
            self._reset()
            self._prefetched = {}
            self._running = False

    def _reset(self) -> None:
        self._reads = {}
        self._writes = {}
        self._snapshot = 0
        self._doomed = False

    async def _commit(self) -> bool:
        """Commit the buffered writes guarded by the isolation level's compares."""
        level = self.isolation
        compares: list[Compare] = []
        if level is not Isolation.READ_COMMITTED:
            for key, read in self._reads.items():
                compares.append(Cmp.mod_revision(key) == (read.kv.mod_revision if read.kv else 0))
        if level is Isolation.SERIALIZABLE_SNAPSHOT and self._snapshot:
            compares += [Cmp.mod_revision(key) < self._snapshot + 1 for key in self._writes]
        if not compares and not self._writes:
            self.revision = 0
            return True
        keys = list(self._reads) if level in _SNAPSHOT_LEVELS else []
        result = await self._client.txn(
            compares, list(self._writes.values()), [Op.get(key) for key in keys]
        )
        if result.succeeded:
            self.revision = result.revision
            return True
        # Go's prefetch: the failure branch read the keys again, at one revision; the next
        # attempt starts from these values instead of reading them one by one.
        self._prefetched = {}
        for key, resp in zip(keys, result.responses):
            if isinstance(resp, RangeResult):
                self._prefetched[key] = _Read(resp.kvs[0] if resp.kvs else None, result.revision)
        return False

    # ---------------------------------------------------------------- reads

    def _check_running(self) -> None:
        if not self._running:
            raise UsageError("use the STM inside apply (STM.run or run_stm), not outside it")
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a blocking caller's thread got the async object
            raise UsageError(
                "this is the async STM, called from a thread: in etcd_recipes.sync use "
                "STM(client, ...).run(apply), whose apply gets the blocking STM"
            ) from None

    async def _fetch(self, key: bytes) -> _Read:
        cached = self._reads.get(key)
        if cached is not None:
            return cached
        snapshot_level = self.isolation in _SNAPSHOT_LEVELS
        read = self._prefetched.pop(key, None)
        if read is not None and snapshot_level and self._snapshot not in (0, read.revision):
            read = None  # prefetched at another revision than this attempt's snapshot
        if read is None:
            at = self._snapshot if snapshot_level else 0
            try:
                found = await self._client.range(key, revision=at)
            except CompactedError:
                self._doomed = True  # the snapshot is gone: this attempt must run again
                raise
            read = _Read(found.kvs[0] if found.kvs else None, at or found.revision)
        if snapshot_level and not self._snapshot:
            self._snapshot = read.revision
        self._reads[key] = read
        return read

    async def get(self, key: bytes | str) -> bytes | None:
        """The key's value as this run sees it (``None`` when it does not exist): what the run
        wrote to it, else what it read (see :class:`Isolation` for which revision).

        Example::

            from etcd_recipes import STM

            async def read(tx):
                tx.put(f"{prefix}/k", "mine")
                return await tx.get(f"{prefix}/k")  # the run's own write

            print(await STM(client).run(read))  # b'mine'
        """
        k = key_bytes(key)
        self._check_running()
        write = self._writes.get(k)
        if write is not None:
            return write.value if isinstance(write, PutOp) else None  # None: it deleted it
        read = await self._fetch(k)
        return read.kv.value if read.kv is not None else None

    async def rev(self, key: bytes | str) -> int:
        """The mod revision of the key as the run read it (0 when it does not exist); reads
        it if the run has not yet (a run's own writes have no revision yet)."""
        k = key_bytes(key)
        self._check_running()
        read = await self._fetch(k)
        return read.kv.mod_revision if read.kv is not None else 0

    # ---------------------------------------------------------------- writes

    def put(self, key: bytes | str, value: bytes | str, *, lease: int = 0) -> None:
        """Buffer a write of ``value`` (``str`` is UTF-8), optionally on ``lease``; it is
        committed with the run's other writes, or not at all."""
        op = Op.put(key, value, lease=lease)  # bad input is reported first, in any state
        self._check_running()
        self._writes.pop(op.key, None)  # the last write of a key is committed, in order
        self._writes[op.key] = op

    def delete(self, key: bytes | str) -> None:
        """Buffer the deletion of ``key``; committed with the run's other writes."""
        op = Op.delete(key)
        self._check_running()
        self._writes.pop(op.key, None)
        self._writes[op.key] = op

    def __repr__(self) -> str:
        state = "running" if self._running else "idle"
        return (
            f"<STM {self.isolation.value} {state} attempts={self.attempts} "
            f"reads={len(self._reads)} writes={len(self._writes)}>"
        )


async def run_stm(
    client: EtcdClient,
    apply: Callable[..., Awaitable[R]],
    *,
    isolation: Isolation = Isolation.SERIALIZABLE_SNAPSHOT,
    max_retries: int | None = DEFAULT_MAX_RETRIES,
    prefetch: Sequence[bytes | str] = (),
) -> R:
    """Run ``apply(stm)`` as a software transaction and return its result: ``apply`` reads
    with ``await stm.get(key)`` and writes with ``stm.put`` / ``stm.delete``; the writes
    commit in one transaction, and ``apply`` runs again on a conflict (Go's
    ``concurrency.NewSTM``). The arguments are :class:`STM`'s; the runnable example is on
    :mod:`etcd_recipes.stm` and the STM docs page.

    In the blocking facade ``apply`` is a plain function, called in a worker thread with the
    blocking twin of the STM (the same as ``STM(client, ...).run(apply)``).

    A transfer between two accounts, for instance (not run here: the STM docs page runs one)::

        async def transfer(stm):
            alice = int(await stm.get("/accounts/alice") or b"0")
            bob = int(await stm.get("/accounts/bob") or b"0")
            stm.put("/accounts/alice", str(alice - 30))
            stm.put("/accounts/bob", str(bob + 30))

        await run_stm(client, transfer, isolation=Isolation.SERIALIZABLE)
    """
    stm = STM(client, isolation=isolation, max_retries=max_retries, prefetch=prefetch)
    return await stm.run(apply)
