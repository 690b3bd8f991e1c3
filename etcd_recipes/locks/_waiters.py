"""The locks family's wait queue: one read of the keys queued before ours (by create revision,
our own key checked in the same read), and the wait for one predecessor's deletion that gives
up when our lease is lost. Package-private.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._recipe.waiting import wait_for_change
from ..client.lease import AcquisitionLease
from ..events import WatchRecoveryEvent
from ..types import EventType, KeyValue, SortOrder, SortTarget, WatchEvent
from ._session import _Requeue
from .hold import LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient


_T = TypeVar("_T")


@dataclass
class _Queue:
    """One read of a wait queue: the keys created before ours (newest first) and ours."""

    earlier: list[KeyValue]
    own: KeyValue | None  # our key, if it still exists (with our create revision)
    revision: int


async def _read_queue(
    client: EtcdClient, prefix: str, key: str, mine: int, *, limit: int = 0
) -> _Queue:
    """Read, in one plain Range, the keys under ``prefix`` created up to revision ``mine``
    (newest first, keys only, ``limit`` of them besides ours) -- our own key ``key`` among them
    when it lies under ``prefix`` and still exists.

    Deliberately a plain Range, not a read-only transaction: etcd 3.5.0 and 3.5.1 panic (and
    exit) when a client cancels a read-only Txn in flight, and waiters are cancelled routinely.
    """
    found = await client.range(
        prefix,
        prefix=True,
        limit=limit + 1 if limit else 0,
        sort_target=SortTarget.CREATE,
        sort_order=SortOrder.DESCEND,
        keys_only=True,
        max_create_revision=mine,
    )
    kvs = list(found.kvs)
    own_key = key.encode()
    # Our key, among the keys created at our revision (a semaphore acquisition of several
    # permits creates them in one transaction).
    own = next((kv for kv in kvs if kv.create_revision == mine and kv.key == own_key), None)
    earlier = [kv for kv in kvs if kv.create_revision < mine]
    return _Queue(earlier[:limit] if limit else earlier, own, found.revision)


async def _wait_unless_lost(lease: AcquisitionLease, wait: Awaitable[_T]) -> tuple[bool, _T | None]:
    """Await ``wait``; ``(False, None)`` -- with the wait cancelled -- if ``lease`` is lost first.

    Both helper tasks are finished before this returns or raises (cancellation included).
    """
    waiter = asyncio.ensure_future(wait)
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, lost):
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(waiter, lost, return_exceptions=True)
    if waiter.cancelled():
        return False, None
    return True, waiter.result()


async def _wait_for_deletion(
    client: EtcdClient,
    lease: AcquisitionLease,
    kv: KeyValue,
    after_revision: int,
    on_recovery: Callable[[WatchRecoveryEvent], Any],
) -> None:
    """Wait until ``kv`` (seen at ``after_revision``) is deleted, watching from
    ``after_revision + 1``. Raises :class:`_Requeue` if our ``lease`` is lost meanwhile."""

    async def probe() -> tuple[bool, int]:
        now = await client.range(kv.key, keys_only=True)
        gone = not now.kvs or now.kvs[0].create_revision != kv.create_revision
        return gone, now.revision

    def deleted(event: WatchEvent) -> bool:
        return event.type is EventType.DELETE

    ok, _ = await _wait_unless_lost(
        lease,
        wait_for_change(
            client,
            kv.key,
            after_revision=after_revision,
            trigger=deleted,
            probe=probe,
            no_put=True,
            on_recovery=on_recovery,
        ),
    )
    if not ok:
        raise _Requeue(f"lease {lease.id:x} was lost while waiting")


def _first_below(kvs: Sequence[KeyValue], revision: int) -> KeyValue | None:
    for kv in kvs:
        if 0 < kv.create_revision < revision:
            return kv
    return None


async def _participants(
    client: EtcdClient, prefix: str, admitted: Callable[[int, KeyValue], bool]
) -> list[LockParticipant]:
    """Every key under ``prefix``, oldest first (one read), ``admitted(rank, kv)`` telling
    which hold the lock; ``admitted`` is asked in order and sees every earlier key."""
    found = await client.range(
        prefix, prefix=True, sort_target=SortTarget.CREATE, sort_order=SortOrder.ASCEND
    )
    return [
        LockParticipant(kv.key, kv.lease, kv.create_revision, admitted(rank, kv), kv.value)
        for rank, kv in enumerate(found.kvs)
    ]
