"""One put wakes one parked consumer, not all of them (the herd ``benchmarks/scale.py`` found:
a hand-off took 58-117 ms with 200 consumers parked and 1-3 s with 2,000, every enqueue making
each of them re-read) -- and a consumer woken for an item that leaves without taking it
(cancelled, closed) wakes the next, so an item is never left with everyone asleep. Counted on
the wire, no timing."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedQueue, DistributedWorkQueue, WorkQueueConfig
from tests.helpers import eventually
from tests.queues.helpers import transactions

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=30)
PARKED = 20


def _reads(seen) -> int:
    """Head reads sent: Range calls and read-only transactions (a work queue's snapshot)."""
    reads_only = [req for req, _ in seen.sent if not seen._writes(req)]
    return seen.other.count("Range") + len(reads_only)


@pytest.mark.parametrize("kind", ["fifo", "work"])
async def test_one_put_wakes_one_of_many_parked_consumers(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "q"
    if kind == "fifo":
        queues = [DistributedQueue(etcd_client, path) for _ in range(PARKED)]
        tasks = [asyncio.create_task(q.dequeue()) for q in queues]
    else:
        queues = [DistributedWorkQueue(etcd_client, path, CONFIG) for _ in range(PARKED)]
        tasks = [asyncio.create_task(q.receive()) for q in queues]
    try:
        await asyncio.sleep(1.0)  # all parked
        with transactions(etcd_client) as seen:
            producer = DistributedQueue(etcd_client, path)
            if kind == "fifo":
                await producer.enqueue(b"one")
            else:
                await DistributedWorkQueue(etcd_client, path).enqueue(b"one")
            await eventually(lambda: sum(t.done() for t in tasks) == 1, what="one consumer")
            await asyncio.sleep(0.5)  # any other wake-up would have re-read by now
        assert sum(t.done() for t in tasks) == 1
        # The woken consumer's re-read(s) and take, not one re-read per parked consumer.
        assert _reads(seen) <= 3, seen.other
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for queue in queues:
            await queue.aclose()


async def test_a_woken_consumer_that_leaves_wakes_the_next(etcd_client, etcd_prefix):
    """The first-parked consumer is woken for the item, then cancelled during its re-read:
    the other parked consumer is woken instead and takes it (without the hand-on it would
    sleep until the next put)."""
    path = etcd_prefix + "q"
    first, second = DistributedQueue(etcd_client, path), DistributedQueue(etcd_client, path)
    real_read = first._read_head
    reads = 0
    stuck = asyncio.Event()

    async def read_then_hang(limit: int):
        nonlocal reads
        reads += 1
        if reads == 1:
            return await real_read(limit)  # the empty read it parks after
        stuck.set()
        await asyncio.Event().wait()  # woken: hangs in its re-read until cancelled
        raise AssertionError("unreachable")

    first._read_head = read_then_hang  # type: ignore[method-assign]
    a = asyncio.create_task(first.dequeue())
    await asyncio.sleep(0.5)  # parked first: the longest-parked is woken first
    b = asyncio.create_task(second.dequeue())
    await asyncio.sleep(0.5)
    await DistributedQueue(etcd_client, path).enqueue(b"job")
    await asyncio.wait_for(stuck.wait(), 5)  # the first was woken for it
    assert not b.done()
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    assert await asyncio.wait_for(b, 5) == b"job"  # the next one looked instead
