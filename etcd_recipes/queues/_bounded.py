"""Admission to a bounded work queue (not public; ``WorkQueueConfig(max_items=n)``).

An enqueue counts the items waiting (ready and delayed) at revision R, and writes only if they
leave room -- in one transaction that also compares ``<p>/admission`` unchanged since R and
writes it: two producers that counted the same room cannot both use it (the second's compare
fails, it counts again). Consumers never touch the key: a claim only ever makes room, so a
count that a claim made stale errs on the safe side. A full queue is waited on with a watch of
``items/`` deletes (a claim, a cancel) anchored at the count's revision + 1, re-counted at
least every second (a delayed item cancelled makes room without an ``items/`` delete); a
producer waiting for room rides out an outage as a parked consumer does (a count that cannot
reach etcd is tried again a second later).

Guaranteed: under any number of concurrent producers of this library, the waiting items never
exceed ``max_items`` through an enqueue; ``enqueue_all`` is admitted whole or waits (a batch
larger than ``max_items`` is refused at once, nothing written); a wait cancelled writes
nothing. Not guaranteed: a bound on items returned to the queue -- a ``requeue()``, a returned
orphan or a replayed dead letter was admitted before and is never refused, so the count may
pass the bound by the items in flight; producers of another library that do not compare on
the admission key are not bounded; producers of one bounded queue serialise on the key
(compare-and-swap retries), so a bounded queue's enqueues are slower under contention.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._core.txn import Cmp, Op
from .._recipe.waiting import wait_for_change
from ..errors import EtcdConnectionError, EtcdTimeoutError, InvalidArgumentError
from ..events import WatchRecoveryEvent
from ..types import RangeResult
from ._layout import WorkKeys
from ._produce import GuardFailed, create

if TYPE_CHECKING:
    from ..client import EtcdClient
    from ..types import WatchEvent

RECOUNT = 1.0  # seconds a full queue's producer waits at most before counting again


async def _room(client: EtcdClient, keys: WorkKeys) -> tuple[int, int]:
    """(items waiting, revision) in one read."""
    read = await client.txn(
        [],
        [
            Op.get(keys.items, prefix=True, count_only=True),
            Op.get(keys.delayed, prefix=True, count_only=True),
        ],
    )
    ready, delayed = read.responses
    assert isinstance(ready, RangeResult)
    assert isinstance(delayed, RangeResult)
    return ready.count + delayed.count, read.revision


async def admit(
    client: EtcdClient,
    keys: WorkKeys,
    limit: int,
    make_keys: Callable[[], Sequence[str]],
    values: Sequence[bytes],
    *,
    items: int,
    deadline: float | None,
    on_recovery: Callable[[WatchRecoveryEvent], object] | None = None,
) -> list[str] | None:
    """Write ``values`` (``items`` of them items, the rest their trace contexts) once the
    queue has room for the items; ``None`` if ``deadline`` (monotonic seconds; the current
    time: try once) passed first."""
    if items > limit:
        raise InvalidArgumentError(
            f"a batch of {items} items can never fit a queue of max_items={limit} "
            "(nothing was written)"
        )
    parked = False
    while True:
        try:
            waiting, revision = await _room(client, keys)
        except (EtcdConnectionError, EtcdTimeoutError):
            if not parked:
                raise  # as any enqueue: etcd is out of reach
            # A producer waiting for room rides out an outage as a parked consumer does.
            await asyncio.sleep(RECOUNT)
            continue
        if waiting + items <= limit:
            guard = (
                [Cmp.mod_revision(keys.admission) < revision + 1],
                [Op.put(keys.admission, b"")],
            )
            try:
                return await create(client, make_keys, values, guard=guard)
            except GuardFailed:
                continue  # another producer took room since the count: count again
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        parked = True

        async def probe() -> tuple[bool, int]:
            now, at = await _room(client, keys)
            return now + items <= limit, at

        def freed(event: WatchEvent) -> bool:
            return True  # any delete under items/ may have made room: count again

        await wait_for_change(
            client,
            keys.items,
            prefix=True,
            no_put=True,
            after_revision=revision,
            trigger=freed,
            probe=probe,
            timeout=RECOUNT if left is None else min(RECOUNT, left),
            on_recovery=on_recovery,
        )
