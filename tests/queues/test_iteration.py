"""``async for`` over the FIFO and priority queues (and ``for`` over their blocking twins):
takes forever in queue order, ends when the queue is closed, and a cancelled loop consumes
nothing (read back from etcd)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedPriorityQueue, DistributedQueue
from etcd_recipes import sync as blocking
from tests.queues.helpers import keys


@pytest.mark.parametrize("kind", ["fifo", "priority"])
async def test_async_for_takes_in_order_and_a_cancelled_loop_takes_nothing(
    etcd_client, etcd_prefix, kind
):
    path = etcd_prefix + "q"
    if kind == "fifo":
        queue = DistributedQueue(etcd_client, path)
        await queue.enqueue_all([b"a", b"b", b"c"])
    else:
        queue = DistributedPriorityQueue(etcd_client, path)
        for value, prio in ((b"c", 9), (b"a", 0), (b"b", 5)):
            await queue.enqueue(value, prio)
    got = []
    async for value in queue:
        got.append(value)
        if len(got) == 3:
            break
    assert got == [b"a", b"b", b"c"]

    async def drain() -> list[bytes]:
        return [value async for value in queue]

    parked = asyncio.create_task(drain())
    await asyncio.sleep(0.3)
    parked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await parked
    if kind == "fifo":
        await queue.enqueue(b"d")
    else:
        await queue.enqueue(b"d", 1)
    items = [k for k in await keys(etcd_client, path + "/")]
    assert len(items) == 1  # the cancelled loop took nothing
    ended = asyncio.create_task(drain())
    await asyncio.sleep(0.3)
    await queue.aclose()
    assert await asyncio.wait_for(ended, 5) == [b"d"]  # took d, then ended at close


def test_blocking_for_loop(etcd_server, etcd_prefix):
    with blocking.connect(**etcd_server.client_kwargs()) as client:
        with blocking.DistributedQueue(client, etcd_prefix + "q") as queue:
            queue.enqueue_all([b"x", b"y"])
            got = []
            for value in queue:
                got.append(value)
                if value == b"y":
                    break
            assert got == [b"x", b"y"]
