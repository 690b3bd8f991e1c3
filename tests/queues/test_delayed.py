"""Delayed delivery precision: a consumer parked on an idle queue gets a delayed item enqueued
after it parked soon after the item's ready time (it watches ``delayed/`` too, not only
``items/``), not at its next ``sweep_interval``; behind a backlog the item waits its turn by
ready time."""

from __future__ import annotations

import asyncio
import time

from etcd_recipes import DistributedWorkQueue, WorkQueueConfig

CONFIG = WorkQueueConfig(visibility_timeout=10, sweep_interval=30)


async def test_a_parked_receive_wakes_for_a_delayed_item_enqueued_later(etcd_client, etcd_prefix):
    async with DistributedWorkQueue(etcd_client, etcd_prefix + "wq", CONFIG) as queue:
        parked = asyncio.create_task(queue.receive())
        await asyncio.sleep(0.3)  # parked on an empty queue, no delayed item known
        ready = time.monotonic() + 0.5
        await queue.enqueue(b"later", delay=0.5)
        item = await asyncio.wait_for(parked, 10)  # the sweep would come after 30 s
        late = time.monotonic() - ready
        assert item.value == b"later"
        assert -0.05 <= late < 3, late  # not before its time; soon after (CPU contention)
        await item.ack()


async def test_behind_a_backlog_a_delayed_item_waits_its_turn(etcd_client, etcd_prefix):
    async with DistributedWorkQueue(etcd_client, etcd_prefix + "wq", CONFIG) as queue:
        await queue.enqueue_all([b"old-%d" % i for i in range(5)])
        await queue.enqueue(b"delayed", delay=0.2)
        await asyncio.sleep(0.3)
        await queue.enqueue(b"new")  # ready after the delayed item
        got = []
        while (item := await queue.receive(timeout=2)) is not None:
            got.append(item.value)
            await item.ack()
        assert got == [*(b"old-%d" % i for i in range(5)), b"delayed", b"new"]
