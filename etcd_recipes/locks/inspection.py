"""Read-only inspection of locks and semaphores at a path, for operators: :func:`mutex_state`
and :func:`semaphore_state` (the ``etcd-recipes lock`` and ``semaphore show`` commands use them).

A mutex's keys are ``<path>/<lease id in hex>``, each on the lease it names (the layout of
``etcdctl lock``, Go's ``concurrency.Mutex`` and :class:`~etcd_recipes.DistributedMutex`);
:func:`mutex_state` sets apart every other key under ``<path>/`` as ``foreign``, so an operator
command never takes a plain key, or another recipe's, for a lock holder.

It reads the semaphore's own keys (``<path>/permits``, the 4-byte big-endian permit count,
and ``<path>/holders/``, one key per acquisition, waiters included -- see
:mod:`etcd_recipes.locks.semaphore`), with the key names the semaphore itself builds.

Guaranteed: one read transaction (permit count and holder keys at one revision); nothing is
written and no lease is taken; holders and waiters are told apart by the semaphore's own rule
(keys by create revision, the keys of one acquisition of several permits together, hold a
permit while they fit in ``permits``).

Not guaranteed: the answer is stale once returned (advisory); a waiter that is being admitted
right now may still show as a waiter.

Example::

    from etcd_recipes import DistributedSemaphore
    from etcd_recipes.locks.inspection import semaphore_state

    semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
    async with semaphore:
        state = await semaphore_state(client, f"{prefix}/uploads")
        assert state is not None and state.permits == 2 and len(state.holders) == 1
    await semaphore.aclose()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.txn import Op
from .._core.validate import check_path
from ..client import check_client
from ..codecs import INT32
from ..errors import CodecError, InvalidArgumentError
from ..types import RangeResult, SortOrder, SortTarget
from ._permits import _admitted
from .hold import LockParticipant
from .mutex import DistributedMutex
from .semaphore import DistributedSemaphore

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["MutexState", "SemaphoreState", "mutex_state", "semaphore_state"]


@dataclass(frozen=True)
class MutexState:
    """A mutex as of one read at ``revision``: its contenders in line order (``holder`` first,
    then ``waiters``), counting only keys in the lock layout (``<path>/<lease hex>`` on that
    lease), and ``foreign``: every other key under ``<path>/`` (plain keys, keys at a deeper
    level, another recipe's), oldest first. A path with foreign keys is not a lock an operator
    should act on: the mutex itself would wait for them.

    Example::

        from etcd_recipes.locks.inspection import mutex_state

        state = await mutex_state(client, f"{prefix}/report-lock")
        print(state.holder, state.waiters, state.foreign)  # None [] []
    """

    path: str
    holder: LockParticipant | None
    waiters: list[LockParticipant]
    foreign: list[LockParticipant]
    revision: int

    @property
    def is_lock(self) -> bool:
        """Whether the path holds lock keys and nothing else (what a lock command may act on)."""
        return self.holder is not None and not self.foreign


async def mutex_state(client: EtcdClient, path: str) -> MutexState:
    """The mutex at ``path`` (one read): its contenders in the lock layout and every foreign
    key under ``<path>/``. Nothing is written.

    Example::

        from etcd_recipes import DistributedMutex
        from etcd_recipes.locks.inspection import mutex_state

        mutex = DistributedMutex(client, f"{prefix}/report-lock")
        async with mutex:
            await client.put(f"{prefix}/report-lock/config", b"not a holder")
            state = await mutex_state(client, f"{prefix}/report-lock")
            assert state.holder is not None and state.holder.key == mutex.hold.key
            assert [p.key for p in state.foreign] == [f"{prefix}/report-lock/config".encode()]
            assert not state.is_lock
        await mutex.aclose()
    """
    client, path = check_client(client), check_path(path)
    probe = DistributedMutex(client, path)  # for its key layout only: never used
    try:
        found = await client.range(
            probe._conflicts,
            prefix=True,
            sort_target=SortTarget.CREATE,
            sort_order=SortOrder.ASCEND,
        )
        line: list[LockParticipant] = []
        foreign: list[LockParticipant] = []
        for kv in found.kvs:
            in_layout = kv.lease != 0 and kv.key == probe._new_key(kv.lease)[0].encode()
            entry = LockParticipant(kv.key, kv.lease, kv.create_revision, False, kv.value)
            (line if in_layout else foreign).append(entry)
    finally:
        await probe.aclose()
    if line:
        first = line[0]
        line[0] = LockParticipant(
            first.key, first.lease_id, first.create_revision, True, first.value
        )
    return MutexState(path, line[0] if line else None, line[1:], foreign, found.revision)


@dataclass(frozen=True)
class SemaphoreState:
    """A semaphore as of one read at ``revision``: its ``permits`` (``None`` when the count key
    is missing: no instance has used the path yet, or it was deleted), the ``holders`` (at most
    ``permits``) and the ``waiters`` in line order.

    Example::

        from etcd_recipes.locks.inspection import semaphore_state

        state = await semaphore_state(client, f"{prefix}/uploads")
        if state is not None:
            print(state.permits, [h.value for h in state.holders], len(state.waiters))
    """

    path: str
    permits: int | None
    holders: list[LockParticipant]
    waiters: list[LockParticipant]
    revision: int


async def semaphore_state(client: EtcdClient, path: str) -> SemaphoreState | None:
    """The semaphore at ``path`` (one read), or ``None`` when it has neither a permit count
    nor holder keys. Raises :class:`~etcd_recipes.errors.InvalidArgumentError` when the
    ``permits`` key is not a 4-byte count (``path`` is not a semaphore).

    Example::

        from etcd_recipes.locks.inspection import semaphore_state

        assert await semaphore_state(client, f"{prefix}/nothing-here") is None
    """
    client, path = check_client(client), check_path(path)
    probe = DistributedSemaphore(client, path, 1)  # for its key names only: never used
    try:
        permits_key, holders = probe._permits_key, probe._holders
    finally:
        await probe.aclose()
    count, keys = (
        await client.txn(
            [],
            [
                Op.get(permits_key),
                Op.get(
                    holders,
                    prefix=True,
                    sort_target=SortTarget.CREATE,
                    sort_order=SortOrder.ASCEND,
                ),
            ],
        )
    ).responses
    assert isinstance(count, RangeResult)
    assert isinstance(keys, RangeResult)
    if not count.kvs and not keys.kvs:
        return None
    permits = None
    if count.kvs:
        try:
            permits = INT32.decode(count.kvs[0].value)
        except CodecError:
            raise InvalidArgumentError(
                f"{path} is not a semaphore: {permits_key} holds {count.kvs[0].value[:16]!r}, "
                "not a 4-byte permit count"
            ) from None
    # One acquisition of n permits is n keys at one create revision, admitted together.
    admitted = _admitted(keys.kvs, permits) if permits is not None else [False] * len(keys.kvs)
    line = [
        LockParticipant(kv.key, kv.lease, kv.create_revision, holds, kv.value)
        for kv, holds in zip(keys.kvs, admitted)
    ]
    return SemaphoreState(
        path,
        permits,
        [p for p in line if p.is_holder],
        [p for p in line if not p.is_holder],
        count.revision,
    )
