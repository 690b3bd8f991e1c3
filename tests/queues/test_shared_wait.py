"""Parked consumers of one client share one watch per queue path (``_recipe/waiting.py``): many
waiters, one watch; every item still reaches exactly one of them; cancelling or closing one
waiter leaves the others parked; the shared watch goes when the last waiter does."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedQueue, DistributedWorkQueue, RecipeClosedError, WorkQueueConfig
from etcd_recipes._recipe.waiting import _shared, wait_for_put_under
from tests.helpers import eventually

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=30)
N = 20


def parked(client) -> int:
    return len({f for waker in _shared(client).values() for f in waker.waiters})


async def test_parked_dequeues_share_one_watch_and_each_item_goes_to_one(etcd_client, etcd_prefix):
    path = etcd_prefix + "q"
    tasks = [asyncio.create_task(DistributedQueue(etcd_client, path).dequeue()) for _ in range(N)]
    await eventually(lambda: parked(etcd_client) == N, what="all parked")
    assert etcd_client._watch_hub.watcher_count == 1
    producer = DistributedQueue(etcd_client, path)
    for i in range(N):
        await producer.enqueue(b"%d" % i)
    got = await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert sorted(got) == sorted(b"%d" % i for i in range(N))
    await eventually(lambda: etcd_client._watch_hub.watcher_count == 0, what="watch gone")


async def test_parked_receives_share_two_watches_and_each_item_is_claimed_once(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "w"
    queues = [DistributedWorkQueue(etcd_client, path, CONFIG) for _ in range(N)]
    tasks = [asyncio.create_task(q.receive()) for q in queues]
    try:
        await eventually(lambda: parked(etcd_client) == N, what="all parked")
        assert etcd_client._watch_hub.watcher_count == 2  # items/ and delayed/
        await queues[0].enqueue_all([b"%d" % i for i in range(N)])
        items = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert sorted(item.value for item in items) == sorted(b"%d" % i for i in range(N))
        assert all([await item.ack() for item in items])
    finally:
        for q in queues:
            await q.aclose()
    await eventually(lambda: etcd_client._watch_hub.watcher_count == 0, what="watches gone")


async def test_cancelling_or_closing_one_waiter_leaves_the_others_parked(etcd_client, etcd_prefix):
    path = etcd_prefix + "q"
    closing = DistributedQueue(etcd_client, path)
    closed = asyncio.create_task(closing.dequeue())
    cancelled = asyncio.create_task(DistributedQueue(etcd_client, path).dequeue())
    staying = asyncio.create_task(DistributedQueue(etcd_client, path).dequeue())
    await eventually(lambda: parked(etcd_client) == 3, what="all parked")
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await closing.aclose()
    with pytest.raises(RecipeClosedError):
        await closed
    assert parked(etcd_client) == 1 and not staying.done()
    await DistributedQueue(etcd_client, path).enqueue(b"one")
    assert await asyncio.wait_for(staying, 10) == b"one"


async def test_a_read_older_than_the_shared_watch_is_woken_to_look_again(etcd_client, etcd_prefix):
    prefix = etcd_prefix + "q/"
    first = (await etcd_client.put(etcd_prefix + "other", b"x")).revision
    await etcd_client.put(etcd_prefix + "other", b"y")
    # The shared watch starts after the newer read: it cannot vouch for what came before.
    parked_newer = asyncio.create_task(
        wait_for_put_under(etcd_client, prefix, after_revision=first + 1, timeout=None)
    )
    await eventually(lambda: parked(etcd_client) == 1, what="parked")
    assert await wait_for_put_under(etcd_client, prefix, after_revision=first - 1, timeout=5)
    # ...while a read at the anchor parks until a put, and a timeout says False.
    assert not await wait_for_put_under(etcd_client, prefix, after_revision=first + 1, timeout=0.2)
    await etcd_client.put(prefix + "item", b"z")
    assert await asyncio.wait_for(parked_newer, 10)
