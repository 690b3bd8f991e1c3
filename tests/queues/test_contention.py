"""Exactly one consumer wins each item: 10 consumers in 2 processes race for the same items
of each queue kind; every item is taken exactly once, nothing is lost."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    WorkQueueConfig,
)
from tests.queues.helpers import finish, keys, spawn

ITEMS = 240
CONSUMERS_PER_PROCESS = 5

_CONSUMERS = textwrap.dedent(
    """
    import asyncio, json, sys
    from etcd_recipes import connect
    from etcd_recipes import DistributedPriorityQueue, DistributedQueue
    from etcd_recipes import DistributedWorkQueue, WorkQueueConfig

    def idle(taken):
        # Wait long for the first item (producers may start late on a loaded machine), then
        # stop after 2.5 s without one.
        return 2.5 if taken else 30.0

    async def consume(client, path, kind, taken):
        if kind == "work-batch":
            config = WorkQueueConfig(visibility_timeout=10, sweep_interval=1)
            async with DistributedWorkQueue(client, path, config) as queue:
                while batch := await queue.receive_many(8, timeout=idle(taken)):
                    acked = await queue.ack_many(batch)
                    taken += [[i.value.decode(), i.attempt, ok] for i, ok in zip(batch, acked)]
        elif kind.startswith("work"):
            config = WorkQueueConfig(visibility_timeout=10, sweep_interval=1)
            async with DistributedWorkQueue(client, path, config) as queue:
                while (item := await queue.receive(timeout=idle(taken))) is not None:
                    ok = await item.ack()
                    taken.append([item.value.decode(), item.attempt, ok])
        else:
            cls = DistributedQueue if kind == "fifo" else DistributedPriorityQueue
            queue = cls(client, path)
            while (value := await queue.poll(idle(taken))) is not None:
                taken.append([value.decode(), 1, True])

    async def main(endpoint, path, kind, n):
        async with connect(endpoint) as client:
            taken = []
            tasks = [asyncio.create_task(consume(client, path, kind, taken)) for _ in range(n)]
            await asyncio.sleep(0.5)
            print("ready", flush=True)
            await asyncio.gather(*tasks)
            print(json.dumps(taken), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "priority", "work", "work-batch", "work-bounded"])
async def test_exactly_one_consumer_wins_each_item(etcd_server, etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "q"
    procs = [
        spawn(_CONSUMERS, etcd_server.url, path, kind, str(CONSUMERS_PER_PROCESS)) for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
            assert line.strip() == "ready"
        values = [f"item-{i:04d}" for i in range(ITEMS)]
        # Producers race the consumers: single enqueues and batches, from several tasks.
        if kind == "fifo":
            producers = [DistributedQueue(etcd_client, path) for _ in range(3)]
            await asyncio.gather(
                producers[0].enqueue_all(values[:60]),
                *(producers[1].enqueue(v) for v in values[60:150]),
                *(producers[2].enqueue(v) for v in values[150:]),
            )
        elif kind == "priority":
            pq = [DistributedPriorityQueue(etcd_client, path) for _ in range(3)]
            await asyncio.gather(*(pq[i % 3].enqueue(v, i % 4) for i, v in enumerate(values)))
        else:  # bounded: producers wait for the consumers to make room (20 waiting at most)
            bound = 20 if kind == "work-bounded" else None
            config = WorkQueueConfig(visibility_timeout=10, max_items=bound)
            wq = [DistributedWorkQueue(etcd_client, path, config) for _ in range(3)]
            await asyncio.gather(
                wq[0].enqueue_all(values[:16]),
                wq[0].enqueue_all(values[16:32]),
                *(wq[i % 3].enqueue(v) for i, v in enumerate(values[32:])),
            )
        results = [await asyncio.to_thread(finish, proc, 60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:  # pragma: no cover - only on failure
                proc.kill()
                proc.wait()
    taken = [entry for result in results for entry in result]
    got = sorted(value for value, _, _ in taken)
    assert got == values  # every item exactly once: none lost, none taken twice
    assert all(attempt == 1 and acked for _, attempt, acked in taken)
    assert all(result for result in results)  # both processes took part
    # No leftover claim or marker (a bounded queue keeps its admission key, as the priority
    # queue keeps its guards).
    assert await keys(etcd_client, path + "/") == (
        [f"{path}/admission"] if kind == "work-bounded" else []
    )
    await etcd_client.delete("__" + etcd_prefix, prefix=True)
