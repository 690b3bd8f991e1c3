"""What a work-queue item costs in transactions, counted on the wire (no timing): one write
each for enqueue, claim and ack; a lone candidate's claim is one flat compare; the consumers
of one queue on one client spread over the items instead of racing for the head (so no
claim fails and none grows into a nested chain); and the pure rules that spread them."""

from __future__ import annotations

import asyncio

from etcd_recipes import DistributedWorkQueue, KeyValue, WorkQueueConfig
from etcd_recipes.queues._claims import Claimer, LocalClaims
from etcd_recipes.queues._layout import WINDOW, WorkKeys
from tests.queues.helpers import Transactions, keys, transactions

CONFIG = WorkQueueConfig(visibility_timeout=10, sweep_interval=5)


async def test_a_lone_consumer_pays_three_writes_per_item(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        await queue.enqueue(b"warm-up")  # the first claim takes the consumer lease
        assert await (await queue.receive()).ack()
        with transactions(etcd_client) as seen:
            for i in range(10):
                await queue.enqueue(b"job-%d" % i)
            for i in range(10):
                item = await queue.receive(timeout=5)
                assert item is not None and item.value == b"job-%d" % i
                assert await item.ack()
    assert len(seen.writes) == 30  # enqueue, claim, ack
    assert seen.failed_writes == 0
    assert not any(Transactions.nested(req) for req, _ in seen.sent)  # flat claims
    assert len(seen.sent) <= 31  # at most one snapshot read: each claim reads the next items
    assert seen.other == []


async def test_sibling_consumers_spread_instead_of_racing(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    total = 40
    producer = DistributedWorkQueue(etcd_client, path, CONFIG)
    consumers = [DistributedWorkQueue(etcd_client, path, CONFIG) for _ in range(4)]
    await producer.enqueue_all([b"job-%d" % i for i in range(total)])
    got: list[bytes] = []

    async def consume(queue: DistributedWorkQueue[bytes]) -> None:
        while len(got) < total:
            item = await queue.receive(timeout=2)
            if item is None:
                return
            got.append(item.value)
            assert await item.ack()

    try:
        with transactions(etcd_client) as seen:
            await asyncio.gather(*(consume(queue) for queue in consumers))
    finally:
        for queue in [producer, *consumers]:
            await queue.aclose()
    assert sorted(got) == sorted(b"job-%d" % i for i in range(total))  # each exactly once
    assert await keys(etcd_client, path + "/") == []
    # Every write is a claim that won or an ack -- no consumer raced a sibling for an item --
    # but near the end: once the queue holds fewer items than consumers, those without one
    # race for a sibling's rather than wait on its claim (a few losers, at most 3 an item).
    assert seen.failed_writes <= 3 * 3
    assert len(seen.writes) == 2 * total + seen.failed_writes
    # Claims are flat (one compare), but for a chain of candidates after a lost race.
    assert sum(Transactions.nested(req) for req, _ in seen.sent) <= seen.failed_writes


# ---------------------------------------------------------------------- the pure rules


def _kv(name: str, mod: int) -> KeyValue:
    return KeyValue(f"/q/items/{name}".encode(), b"v", mod, mod, 1, 0)


def _claimer(local: LocalClaims) -> Claimer:
    claimer = Claimer.__new__(Claimer)
    claimer.local, claimer.reach = local, 1
    claimer.keys = WorkKeys.under("/q")
    return claimer


def test_window_skips_what_siblings_took_and_are_after():
    local = LocalClaims()
    items = [_kv(f"{i}", 10 + i) for i in range(WINDOW)]
    local.took((items[0].key, items[0].mod_revision))
    local.busy[(items[1].key, items[1].mod_revision)] = 1
    assert _claimer(local).window(items) == [items[2]]
    # A requeued item comes back with a new mod revision: it is not "taken".
    again = _kv("0", 99)
    assert _claimer(local).window([again, *items[1:]]) == [again]


def test_window_when_siblings_hold_everything():
    local = LocalClaims()
    items = [_kv(f"{i}", 10 + i) for i in range(WINDOW)]
    for kv in items:
        local.busy[(kv.key, kv.mod_revision)] = 1
    claimer = _claimer(local)
    assert claimer.window(items) is None  # a full window: more may follow, read further
    assert claimer.window(items, further=False) == [items[0]]  # nothing else: race for it
    assert claimer.window(items[:2]) == [items[0]]  # the whole queue: race for it
    for kv in items:
        local.took((kv.key, kv.mod_revision))
    assert claimer.window(items) == []  # all gone: read afresh


def test_taken_versions_are_bounded():
    local = LocalClaims()
    for i in range(1000):
        local.took((b"k", i))
    assert len(local.taken) == len(local.order) < 1000
    assert (b"k", 999) in local.taken and (b"k", 0) not in local.taken
