"""How late a delayed work-queue item is delivered: on an idle queue, and behind a backlog.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/delayed_delivery.py [--trials 20] [--delay 0.3]
        [--backlog 1000] [--endpoint HOST:PORT]

Starts its own etcd unless --endpoint is given. Two measurements, one client:

* **idle** -- one consumer parked in ``receive()`` on an empty queue; an item is enqueued with
  ``delay=--delay``; lateness = item in hand minus its ready time (p50 / max over --trials);
* **backlog** -- --backlog immediate items are enqueued, then one delayed item; one consumer
  drains the queue (``receive()`` + ``ack()``). The delayed item is ordered by its ready time,
  so it waits behind every item enqueued before it matured: its lateness is about the time the
  consumer takes for those items, not the promotion's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

from etcd_recipes import DistributedWorkQueue, EtcdClient, WorkQueueConfig, connect
from etcd_recipes.testing import EtcdServer

CONFIG = WorkQueueConfig(visibility_timeout=10, sweep_interval=30)


async def idle(client: EtcdClient, root: str, trials: int, delay: float) -> list[float]:
    """Lateness (ms) of a delayed item for a consumer parked on an empty queue."""
    late: list[float] = []
    async with DistributedWorkQueue(client, f"{root}/idle", CONFIG) as queue:
        for _ in range(trials):
            parked = asyncio.create_task(queue.receive())
            await asyncio.sleep(0.05)  # parked before the item exists
            ready = time.time() + delay
            await queue.enqueue(b"delayed", delay=delay)
            item = await parked
            late.append((time.time() - ready) * 1000)
            await item.ack()
    return late


async def backlog(client: EtcdClient, root: str, size: int, delay: float) -> tuple[float, int]:
    """(lateness in ms, items received before it) of a delayed item behind ``size`` items."""
    async with DistributedWorkQueue(client, f"{root}/backlog", CONFIG) as queue:
        for start in range(0, size, 100):
            await queue.enqueue_all([b"old"] * min(100, size - start))
        ready = time.time() + delay
        await queue.enqueue(b"delayed", delay=delay)
        before = 0
        while True:
            item = await queue.receive()
            await item.ack()
            if item.value == b"delayed":
                return (time.time() - ready) * 1000, before
            before += 1


async def run(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        async with connect(endpoint) as client:
            root = f"/bench-delayed-{time.time_ns()}"
            late = await idle(client, root, args.trials, args.delay)
            print(
                f"idle queue, parked receive: lateness p50 {statistics.median(late):.1f} ms, "
                f"max {max(late):.1f} ms over {args.trials} items (delay {args.delay} s)"
            )
            behind, before = await backlog(client, root, args.backlog, args.delay)
            print(
                f"behind a backlog of {args.backlog}: delivered {behind:.0f} ms after its "
                f"ready time, after {before} older items"
            )
            await client.delete(root + "/", prefix=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--backlog", type=int, default=1000)
    parser.add_argument("--endpoint", default=None)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
