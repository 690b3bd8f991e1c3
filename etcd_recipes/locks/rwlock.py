""":class:`DistributedReadWriteLock` and its two :class:`ReadWriteLockView` sides, in the JVM
library's layout (``<path>/read-<client_id>:<token>``, ``<path>/write-...``). What it
guarantees and what it does not: see :mod:`etcd_recipes.locks`.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from .._core.caller import Caller
from .._core.keys import append_to_path, random_token
from .._core.validate import check_ttl
from .._recipe.recipe import Recipe
from ..errors import InvalidArgumentError, LeaseEventError, LockUpgradeError
from ..events import LeaseEvent, LeaseResumed, LeaseSuspended
from ..types import KeyValue
from ._base import _LockBase, _Queued
from ._holds import _Held
from ._session import _Session
from ._waiters import _participants
from .hold import DEFAULT_TTL, LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedReadWriteLock", "ReadWriteLockView"]


class ReadWriteLockView(_Queued):
    """The read or the write side of a :class:`DistributedReadWriteLock`, with the lock
    surface of :class:`DistributedMutex` (``acquire``/``release``, ``async with``,
    ``with_lock``, fencing, lock-lost listeners of its own).

    Example::

        from etcd_recipes import DistributedReadWriteLock

        rw = DistributedReadWriteLock(client, f"{prefix}/catalog")
        async with rw.read_lock:
            print("reading")  # shared with other readers
        async with rw.write_lock.with_lock(timeout=5) as hold:
            print("writing, token", hold.fencing_token)  # exclusive
        await rw.aclose()
    """

    def __init__(self, lock: DistributedReadWriteLock, mode: str) -> None:
        if mode not in ("read", "write"):
            raise InvalidArgumentError(f"mode must be 'read' or 'write', not {mode!r}")
        _LockBase.__init__(self, lock, lock._session, f"{lock.exception_context}.{mode}_lock")
        self._rw = lock
        self._mode = mode
        base = append_to_path(lock.path, "")
        self._own_prefix = f"{base}{mode}-"
        self._conflicts = base if mode == "write" else f"{base}write-"

    @property
    def mode(self) -> str:
        """``"read"`` or ``"write"``."""
        return self._mode

    def _new_key(self, lease_id: int) -> tuple[str, bytes]:
        token = f"{self._rw.client_id}:{random_token()}"
        return f"{self._own_prefix}{token}", self._rw.client_id.encode()

    def _reuse(self, task: Caller) -> _Held | None:
        if self._mode == "write":
            if task in self._rw.read_lock._holds:
                raise LockUpgradeError(
                    f"{self._name}: the caller holds the read lock; upgrading is not allowed"
                )
            return None
        write = self._rw.write_lock._holds.get(task)
        if write is not None and write.is_valid:
            return write.held  # downgrade: the read shares the write's key
        return None

    async def __aenter__(self) -> ReadWriteLockView:
        """Acquire this side for the body (waits as long as it takes; see :meth:`with_lock`)."""
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._exit(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<ReadWriteLockView {self._name} {self._describe()}>"

    async def is_locked(self) -> bool:
        """Whether anyone holds (or waits for) this side: one count-only read, advisory."""
        self._rw._check_open()
        return (await self._rw._client.count(self._own_prefix)) > 0


class DistributedReadWriteLock(Recipe):
    """A distributed read-write lock: many readers or one writer, FIFO by arrival.

    ``read_lock`` and ``write_lock`` are views with the mutex surface. A queued writer blocks
    readers that arrive after it (no writer starvation). A task holding the write lock may
    take the read lock (downgrade): the read then shares the write's key, which stays until
    both are released -- so other readers get in only after that, and no writer can slip in
    between. A task holding the read lock that asks for the write lock gets
    :class:`LockUpgradeError`.

    Example::

        from etcd_recipes import DistributedReadWriteLock

        rw = DistributedReadWriteLock(client, f"{prefix}/catalog")
        async with rw.write_lock:
            await client.put(f"{prefix}/catalog-data", "rebuilt")
        async with rw.read_lock:
            print((await client.get(f"{prefix}/catalog-data")).text)
        await rw.aclose()

    :param lease_ttl: seconds; how long a hold outlives this process if it dies holding it.
    :param metrics_name: the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """The acquisition lease's TTL in whole seconds."""
        self._session = _Session(client, self.lease_ttl, self.path, self._on_lease_event)
        self.read_lock: ReadWriteLockView = ReadWriteLockView(self, "read")
        """The shared side."""
        self.write_lock: ReadWriteLockView = ReadWriteLockView(self, "write")
        """The exclusive side."""

    async def contenders(self) -> list[LockParticipant]:
        """Every reader and writer holding or waiting, in line order (one read, advisory);
        ``is_holder`` marks the readers with no writer ahead of them, or the writer first in
        line. A participant's side is in its key (``.../read-...``, ``.../write-...``).

        Example::

            from etcd_recipes import DistributedReadWriteLock

            rw = DistributedReadWriteLock(client, f"{prefix}/catalog")
            async with rw.read_lock:
                (me,) = await rw.contenders()
                print(b"/read-" in me.key, me.is_holder)  # True True
            await rw.aclose()
        """
        self._check_open()
        base = self.read_lock._conflicts.removesuffix("write-")
        reads, writes = (f"{base}{mode}-".encode() for mode in ("read", "write"))
        writer_ahead = False

        def admitted(rank: int, kv: KeyValue) -> bool:
            nonlocal writer_ahead
            ok = not writer_ahead if kv.key.startswith(reads) else rank == 0
            writer_ahead = writer_ahead or kv.key.startswith(writes)
            return ok

        return await _participants(self._client, base, admitted)

    async def holders(self) -> list[LockParticipant]:
        """The participants that hold the lock now (readers, or one writer); one read.

        Example::

            from etcd_recipes import DistributedReadWriteLock

            rw = DistributedReadWriteLock(client, f"{prefix}/catalog")
            async with rw.write_lock:
                print(len(await rw.holders()))  # 1
            await rw.aclose()
        """
        return [p for p in await self.contenders() if p.is_holder]

    def __repr__(self) -> str:
        read, write = self.read_lock._describe(), self.write_lock._describe()
        state = "closed" if self.is_closed else f"read: {read}, write: {write}"
        return f"<{self.exception_context} {state} {self.connection_state.value}>"

    def _on_lease_event(self, event: LeaseEvent) -> None:
        if isinstance(event, LeaseSuspended):
            self._on_recovery_event(event)
            self._record_exception(LeaseEventError(event), "lease")
        elif isinstance(event, LeaseResumed):
            self._on_recovery_event(event)  # keep-alives answered again: out of SUSPENDED

    async def _do_close(self) -> None:
        await self.read_lock._close_view()
        await self.write_lock._close_view()
        await self._session.close()
