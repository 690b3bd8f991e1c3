"""``poll(0)`` and ``receive(timeout=0)`` try once and do not wait, like ``try_dequeue()`` and
``try_receive()``, as ``timeout=0`` means everywhere else in Python."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedQueue, DistributedWorkQueue, InvalidArgumentError


async def test_poll_zero_takes_the_head_or_returns_none_at_once(etcd_client, etcd_prefix):
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await queue.poll(0) is None
    assert loop.time() - t0 < 1.0
    await queue.enqueue(b"job")
    assert await queue.poll(0) == b"job"
    assert await queue.size() == 0
    for bad in (-1, None, True):
        with pytest.raises(InvalidArgumentError):
            await queue.poll(bad)  # type: ignore[arg-type]
    await queue.aclose()


async def test_receive_zero_claims_a_ready_item_or_returns_none_at_once(etcd_client, etcd_prefix):
    async with DistributedWorkQueue(etcd_client, etcd_prefix + "w") as queue:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await queue.receive(timeout=0) is None
        assert loop.time() - t0 < 1.0
        await queue.enqueue(b"job")
        item = await queue.receive(timeout=0)
        assert item is not None and item.value == b"job"
        await item.ack()
