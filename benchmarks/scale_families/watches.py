"""Watches per client: N watches on one client (one key each, each consumed by its own task
with ``async for``), all multiplexed on the client's one Watch stream.

Rows (medians of ``ctx.repeats`` rounds per N):

* ``watch start, per watch``: wall time to start the N watches (200 at a time) / N;
* ``event latency p50``: from just before a put to one watched key (rotating over them) to the
  event in its consumer's hands, ``SAMPLES`` samples;
* ``memory per watch``: resident growth of starting the N watches and their consumer tasks / N
  (the first round of each N; later rounds reuse the memory the first freed);
* ``memory per watch, Python heap``: the same growth traced by tracemalloc, in a round of
  its own (no latency samples): exact where the resident figure is noisy (small N);
* floor ``floor: put round trip``: the put alone, measured in the same round -- what etcd's
  write costs while it holds N watchers; the event latency minus it is the notification.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from etcd_recipes import EtcdClient
from scale_families._api import FamilyResult, Row, ScaleContext, measure

SAMPLES = 100


async def one_round(
    client: EtcdClient, root: str, n: int, *, heap: bool = False
) -> dict[str, float]:
    arrived: dict[bytes, float] = {}
    waiting: dict[bytes, asyncio.Event] = {}
    keys = [f"{root}{i:08d}" for i in range(n)]

    async def consume(watch: Any) -> None:
        async for event in watch:
            key = event.kv.key
            if key in waiting:
                arrived[key] = time.perf_counter()
                waiting[key].set()

    with measure(heap=heap) as usage:
        watches = [client.watch(k) for k in keys]
        for start in range(0, n, 200):
            await asyncio.gather(*(w.start() for w in watches[start : start + 200]))
        consumers = [asyncio.create_task(consume(w)) for w in watches]
        await asyncio.sleep(0.1)
    try:
        latency: list[float] = []
        samples = 0 if heap else SAMPLES
        put_only: list[float] = []
        for i in range(samples):
            await asyncio.sleep(0.005)
            key = keys[(i * 7919) % n]
            raw = key.encode()
            waiting[raw] = done = asyncio.Event()
            t0 = time.perf_counter()
            await client.put(key, b"x")
            put_only.append(time.perf_counter() - t0)
            await asyncio.wait_for(done.wait(), 30)
            latency.append(arrived.pop(raw) - t0)
            del waiting[raw]
    finally:
        for w in watches:
            await w.aclose()
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
    return {
        "start": usage.wall / n * 1e3,
        "memory": usage.rss / n / 1024,
        "heap": (usage.heap or 0) / n / 1024,
        "latency": statistics.median(latency) * 1e3 if latency else float("nan"),
        "floor": statistics.median(put_only) * 1e3 if put_only else float("nan"),
    }


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    got: dict[str, dict[int, float]] = {
        k: {} for k in ("start", "memory", "heap", "latency", "floor")
    }
    async with ctx.connect() as client:
        await one_round(client, ctx.fresh_prefix("watch-warm"), 10)
        for n in sizes:
            t0 = time.perf_counter()
            runs = [
                await one_round(client, ctx.fresh_prefix("watch"), n) for _ in range(ctx.repeats)
            ]
            for key in ("start", "latency", "floor"):
                got[key][n] = statistics.median(r[key] for r in runs)
            got["memory"][n] = runs[0]["memory"]
            heap = await one_round(client, ctx.fresh_prefix("watch-heap"), n, heap=True)
            got["heap"][n] = heap["heap"]
            print(f"  watches N={n}: {time.perf_counter() - t0:.1f} s", flush=True)
    return FamilyResult(
        "watches",
        [
            Row("event latency p50", "ms", got["latency"], floor="floor: put round trip"),
            Row("floor: put round trip", "ms", got["floor"]),
            Row("watch start, per watch", "ms/watch", got["start"]),
            Row("memory per watch, resident", "KB/watch", got["memory"]),
            Row("memory per watch, Python heap", "KB/watch", got["heap"]),
        ],
        [
            "one client, one Watch stream; each watch its own key and consumer task",
            "memory: resident growth of the first round of each N (noisy at N=100)",
        ],
    )
