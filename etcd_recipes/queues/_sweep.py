"""The sweeps of a work queue (not public): orphans back to the queue, matured delayed items
promoted. Every consumer runs them -- when a receive notices work for them, and from its
sweeper every ``sweep_interval``.

Guaranteed: an orphan (a payload in flight with no claim marker) returns to its **original**
key, or to the dead letters once its attempts reached ``max_deliveries``, only while it is
still an orphan and unchanged (compares on the marker's absence and the payload's mod
revision), so consumers sweeping at once move it once; a matured delayed item is promoted
under its ready-time name, or under a fresh suffix if another producer's item took that name.
Not guaranteed: promptness (a sweep may fail and is retried at the next pass).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._core.keys import pad, random_token
from .._core.txn import Cmp, Op
from ..types import RangeResult
from ._layout import WorkKeys, attempts_in, item_name, ready_millis
from ._take import now_millis

if TYPE_CHECKING:
    from ..client import EtcdClient

log = logging.getLogger("etcd_recipes.work_queue")


async def reclaim_orphans(
    client: EtcdClient, keys: WorkKeys, max_deliveries: int, context: str
) -> int:
    """Return every orphaned in-flight item to its original key (or the dead letters)."""
    listing = await client.txn(
        [],
        [
            Op.get(keys.claimed, prefix=True, keys_only=True),
            Op.get(keys.claims, prefix=True, keys_only=True),
        ],
    )
    claimed, claims = listing.responses
    assert isinstance(claimed, RangeResult)
    assert isinstance(claims, RangeResult)
    live = {item_name(kv.key) for kv in claims.kvs}
    returned = 0
    for kv in claimed.kvs:
        name = item_name(kv.key)
        if name not in live and await reclaim(
            client, keys, name, kv.mod_revision, max_deliveries, context
        ):
            returned += 1
    return returned


async def reclaim(
    client: EtcdClient,
    keys: WorkKeys,
    name: str,
    mod_revision: int,
    max_deliveries: int,
    context: str,
) -> bool:
    claimed_key = keys.claimed + name
    read = await client.txn([], [Op.get(claimed_key), Op.get(keys.attempts + name)])
    payload, counts = read.responses
    assert isinstance(payload, RangeResult)
    assert isinstance(counts, RangeResult)
    if not payload.kvs or payload.kvs[0].mod_revision != mod_revision:
        return False
    attempts = attempts_in(counts.kvs)
    dead = attempts >= max_deliveries
    result = await client.txn(
        [Cmp.missing(keys.claims + name), Cmp.mod_revision(claimed_key) == mod_revision],
        [
            Op.delete(claimed_key),
            Op.put((keys.dlq if dead else keys.items) + name, payload.kvs[0].value),
        ],
    )
    if result.succeeded and dead:
        log.warning("%s: %s dead-lettered after %d deliveries", context, name, attempts)
    elif result.succeeded:
        log.info("%s: orphaned %s returned to the queue", context, name)
    return result.succeeded


async def promote_matured(client: EtcdClient, keys: WorkKeys) -> int:
    """Move every matured delayed item to ``items/`` under its ready-time name."""
    promoted = 0
    rename: str | None = None
    while True:
        read = await client.range(keys.delayed, prefix=True, limit=1)
        if not read.kvs:
            return promoted
        head = read.kvs[0]
        if ready_millis(head) > now_millis():
            return promoted
        target = keys.items + (rename or item_name(head.key))
        result = await client.txn(
            [Cmp.mod_revision(head.key) == head.mod_revision, Cmp.missing(target)],
            [Op.delete(head.key), Op.put(target, head.value)],
            [Op.get(head.key, keys_only=True), Op.get(target, keys_only=True)],
        )
        if result.succeeded:
            promoted, rename = promoted + 1, None
            continue
        source, clash = result.responses
        assert isinstance(source, RangeResult)
        assert isinstance(clash, RangeResult)
        unchanged = source.kvs and source.kvs[0].mod_revision == head.mod_revision
        # Another producer's item took the name (same millisecond, same suffix): promote
        # under a fresh suffix. Otherwise another consumer promoted it: re-read.
        rename = (
            f"{pad(ready_millis(head), 19)}-{random_token(3)}" if unchanged and clash.kvs else None
        )
