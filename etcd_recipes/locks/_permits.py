"""The semaphore's wait queue: queueing an acquisition of ``n`` permits as ``n`` holder keys
created in one transaction, waiting until it is admitted, and deleting its keys. Package-private
(moved out of ``semaphore.py``, which keeps the public surface).

An acquisition of ``n`` permits is ``n`` keys -- ``<holders>/<client id>:<7 chars>`` and, for
``n > 1``, the same name plus ``.2`` ... ``.n`` -- created in one transaction, so they share one
create revision and one lease. Its *rank* is the number of holder keys created before it; it is
admitted when ``rank + n <= permits``. A client that counts keys (the Kotlin library, an older
version of this one) counts ``n`` for it, so the limit holds across them all: the newest admitted
acquisition has at most ``permits - n`` older keys, and every admitted one is among them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._core.keys import random_token
from .._core.logctx import library_logger
from .._core.shield import abort_guard, settled
from .._core.txn import Cmp, Op
from .._recipe.hold import Hold
from .._recipe.waiting import wait_for_change
from ..client.lease_pool import LeaseCheckout, PooledLease
from ..errors import PermitLostError
from ..types import EventType, KeyValue, SortOrder, SortTarget, WatchEvent
from ._holds import _Held
from ._session import _Busy, _leased_txn, _monitor_soon, _range, _Requeue, _Session
from ._waiters import _read_queue, _wait_unless_lost
from .hold import LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient
    from .semaphore import DistributedSemaphore

log = library_logger("etcd_recipes.semaphore")


def _admitted(kvs: list[KeyValue], permits: int) -> list[bool]:
    """For holder keys in create-revision order: whether each holds a permit. The keys of one
    acquisition share a create revision and are admitted together, when the keys older than
    them and theirs fit in ``permits``."""
    sizes: dict[int, int] = {}
    for kv in kvs:
        sizes[kv.create_revision] = sizes.get(kv.create_revision, 0) + 1
    older: dict[int, int] = {}
    count = 0
    for revision, size in sizes.items():  # insertion order: oldest first
        older[revision] = count
        count += size
    return [older[kv.create_revision] + sizes[kv.create_revision] <= permits for kv in kvs]


async def _participants(client: EtcdClient, holders: str, permits: int) -> list[LockParticipant]:
    """Every holder key, oldest first (one read), with whether it holds a permit now."""
    found = await client.range(
        holders, prefix=True, sort_target=SortTarget.CREATE, sort_order=SortOrder.ASCEND
    )
    return [
        LockParticipant(kv.key, kv.lease, kv.create_revision, admitted, kv.value)
        for kv, admitted in zip(found.kvs, _admitted(found.kvs, permits))
    ]


def _group_keys(lead: str, n: int) -> tuple[str, ...]:
    """The ``n`` holder keys of one acquisition: the lead key, then ``<lead>.2`` ... ``.n``."""
    return (lead, *(f"{lead}.{i}" for i in range(2, n + 1)))


async def _delete_group(client: EtcdClient, keys: tuple[str, ...], mine: int) -> None:
    """Delete the keys of one acquisition that are still ours (created at ``mine``)."""
    if keys:
        ops = [Op.txn([Cmp.create_revision(k) == mine], [Op.delete(k)]) for k in keys]
        await settled(client.txn([], ops), what="deleting a semaphore acquisition's keys")


async def _abandon_group(
    client: EtcdClient, session: _Session, checkout: LeaseCheckout, keys: tuple[str, ...]
) -> None:
    """An acquisition was aborted: delete its keys (if they may exist) and give the lease
    back -- retired if the delete failed, so the keys go with the lease."""
    try:
        if len(keys) == 1:
            await client.delete(keys[0])
        elif keys:
            await client.txn([], [Op.delete(k) for k in keys])
    except BaseException:
        await session.leave(checkout, retire=True)
        raise
    await session.leave(checkout)


async def _take(sem: DistributedSemaphore, n: int, wait: bool) -> tuple[_Held, tuple[str, ...]]:
    """Queue for ``n`` permits and wait until admitted: the hold of the lead key and the
    other keys of the acquisition."""
    while True:
        checkout = await sem._session.join()
        lead = f"{sem._holders}{sem.client_id}:{random_token()}"
        try:
            return await _queue(sem, checkout, _group_keys(lead, n), wait)
        except _Requeue as exc:
            sem._record_exception(exc, "requeue")
            log.info("%s: %s; queueing again", sem.exception_context, exc)
            await asyncio.sleep(exc.delay)


async def _queue(
    sem: DistributedSemaphore, checkout: LeaseCheckout, keys: tuple[str, ...], wait: bool
) -> tuple[_Held, tuple[str, ...]]:
    client = sem._client
    lease = checkout.lease
    value = sem.client_id.encode()
    key, n = keys[0], len(keys)
    created = False

    async def cleanup() -> None:
        await _abandon_group(client, sem._session, checkout, keys if created else ())

    async with abort_guard(cleanup, what=f"{sem.exception_context}: abandoning a waiter"):
        created = True
        first = await settled(
            _leased_txn(
                client,
                sem._session,
                checkout,
                [Cmp.create_revision(k) == 0 for k in keys],
                [
                    *(Op.put(k, value, lease=lease.id) for k in keys),
                    Op.get(sem._holders, prefix=True, count_only=True),
                ],
            ),
            what=f"{sem.exception_context}: answering a cancelled acquisition",
        )
        if not first.succeeded:
            created = False
            raise _Requeue(f"the random waiter key {key} exists already")
        mine, seen = first.revision, first.revision
        rank = _range(first, n).count - n  # every other holder key is older than ours
        need = sem.permits - n  # admitted while at most this many keys are older
        waited = False
        while rank > need:
            if not wait:
                raise _Busy(f"{sem.exception_context}: not {n} permits free (timeout=0)")
            waited = True
            # The newest permits + 1 older keys tell all a waiter needs (admitted, first in
            # line, or behind its predecessor): a waiter keeps no list of the whole line.
            # (our own n keys come first: they are the newest).
            queue = await _read_queue(client, sem._holders, key, mine, limit=sem.permits + n)
            if queue.own is None:
                raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
            rank, seen = len(queue.earlier), queue.revision
            if rank <= need:
                break
            if n > 1 or rank == sem.permits:
                await _wait_first(sem, lease, key, mine, queue.earlier, seen, need)
            else:
                await _wait_behind(sem, lease, queue.earlier[0], seen)
        if waited:
            # Admitted after waiting: whoever queued right behind us watches one of our keys,
            # and our admission is its cue to move up (a touch that keeps the create revision).
            touch = await _leased_txn(
                client,
                sem._session,
                checkout,
                [Cmp.create_revision(k) == mine for k in keys],
                [Op.put(k, value, lease=lease.id) for k in keys],
            )
            if not touch.succeeded:
                raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
            seen = touch.revision
        hold = Hold(client, key, lease, mine, PermitLostError, sem.exception_context)
        _monitor_soon(hold, seen)
        return _Held(hold, checkout, sem._session), keys[1:]


async def _wait_first(
    sem: DistributedSemaphore,
    lease: PooledLease,
    key: str,
    mine: int,
    earlier: list[KeyValue],
    seen: int,
    need: int,
) -> None:
    """Wait for enough of the older holder keys to go (at most ``need`` may remain): the first
    one-permit waiter in line, and every waiter for several permits."""
    client = sem._client
    pending = {kv.key for kv in earlier}
    own = key.encode()

    def freed(event: WatchEvent) -> bool:
        pending.discard(event.kv.key)
        return len(pending) <= need or event.kv.key == own

    async def probe() -> tuple[bool, int]:
        mine_n = sem.permits - need  # the keys of this acquisition: the newest of the read
        queue = await _read_queue(client, sem._holders, key, mine, limit=sem.permits + mine_n)
        return len(queue.earlier) <= need or queue.own is None, queue.revision

    ok, _ = await _wait_unless_lost(
        lease,
        wait_for_change(
            client,
            sem._holders,
            prefix=True,
            after_revision=seen,
            trigger=freed,
            probe=probe,
            no_put=True,
            on_recovery=sem._on_recovery_event,
        ),
    )
    if not ok:
        raise _Requeue(f"lease {lease.id:x} was lost while waiting")


async def _wait_behind(
    sem: DistributedSemaphore, lease: PooledLease, predecessor: KeyValue, seen: int
) -> None:
    """Further back: wait until the waiter ahead is admitted (it touches its key) or leaves
    (its key is deleted)."""
    client = sem._client

    async def probe() -> tuple[bool, int]:
        now = await client.range(predecessor.key, keys_only=True)
        changed = not now.kvs or now.kvs[0].mod_revision != predecessor.mod_revision
        return changed, now.revision

    def moved(event: WatchEvent) -> bool:
        return event.type in (EventType.PUT, EventType.DELETE)

    ok, _ = await _wait_unless_lost(
        lease,
        wait_for_change(
            client,
            predecessor.key,
            after_revision=seen,
            trigger=moved,
            probe=probe,
            on_recovery=sem._on_recovery_event,
        ),
    )
    if not ok:
        raise _Requeue(f"lease {lease.id:x} was lost while waiting")
