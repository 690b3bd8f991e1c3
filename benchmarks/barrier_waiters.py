"""1,000 concurrent DistributedBarrier waiters in one process: memory per waiter, stream count.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/barrier_waiters.py [--waiters 1000] [--endpoint HOST:PORT]

Starts its own etcd unless --endpoint is given. Reports resident memory before and after
parking the waiters (target: under 10 KB per waiter), how many gRPC Watch streams the client
opened (target: 1, all waiters multiplexed), and how long the release of all waiters took.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import time

import psutil

from etcd_recipes import DistributedBarrier, connect
from etcd_recipes.testing import EtcdServer


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


async def run(endpoint: str, n: int, batch: int) -> None:
    async with connect(endpoint) as client:
        setter = DistributedBarrier(client, "/bench/gate")
        await setter.set_barrier()
        # Warm up one waiter so imports and the watch stream are not counted per waiter.
        warm = asyncio.create_task(DistributedBarrier(client, "/bench/gate").wait_on_barrier())
        await asyncio.sleep(0.5)
        gc.collect()
        before = rss()
        waiters = [DistributedBarrier(client, "/bench/gate") for _ in range(n)]
        tasks = []
        for i in range(
            0, n, batch
        ):  # park in batches: in-flight RPC buffers are not per-waiter cost
            tasks += [asyncio.create_task(w.wait_on_barrier()) for w in waiters[i : i + batch]]
            while client._watch_hub.watcher_count < len(tasks) + 1:
                await asyncio.sleep(0.01)
        while client._watch_hub.watcher_count < n + 1:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        gc.collect()
        after = rss()
        streams = client._watch_hub.streams_opened
        t0 = time.perf_counter()
        await setter.remove_barrier()
        results = await asyncio.gather(*tasks, warm)
        released = time.perf_counter() - t0
        print(f"waiters parked          : {n}")
        print(f"RSS before / after      : {before / 1e6:.1f} MB / {after / 1e6:.1f} MB")
        print(f"memory per waiter       : {(after - before) / n / 1024:.2f} KB (target < 10 KB)")
        print(f"Watch streams opened    : {streams} (target 1)")
        print(f"all released in         : {released * 1000:.0f} ms ({sum(results)} True)")
        await setter.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--endpoint")
    parser.add_argument("--batch", type=int, default=1000, help="waiters parked at once")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        asyncio.run(run(endpoint, args.waiters, args.batch))


if __name__ == "__main__":
    main()
