"""Barrier members: what entering and leaving a ``DistributedDoubleBarrier`` of N members costs
per member, N members in one process (each its own instance and task, one client).

Rows (medians of ``ctx.repeats`` rounds per N):

* ``enter, per member`` / ``leave, per member``: wall time from starting all N ``enter()``
  (``leave()``) calls at once until every one returned, divided by N;
* ``client CPU per member``: process CPU of the whole round (enter + leave), divided by N;
* floor ``floor: put + keys-only range``: what etcd does for a member of a counted barrier,
  bare: N concurrent tasks, each a put under a prefix then a keys-only range of that prefix
  (what a member's snapshot reads: every member that arrived before it), wall / N.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from etcd_recipes import DistributedDoubleBarrier, EtcdClient
from scale_families._api import FamilyResult, Row, ScaleContext

BUDGET = 240.0  # seconds one size may take, all repeats; bigger sizes are skipped beyond it


async def one_round(client: EtcdClient, path: str, n: int) -> tuple[float, float, float]:
    barriers = [DistributedDoubleBarrier(client, path, n) for _ in range(n)]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    entered = await asyncio.gather(*(b.enter(timeout=600) for b in barriers))
    t1 = time.perf_counter()
    left = await asyncio.gather(*(b.leave(timeout=600) for b in barriers))
    t2 = time.perf_counter()
    cpu = time.process_time() - cpu0
    assert all(entered), (sum(entered), n)
    assert all(left), (sum(left), n)
    for b in barriers:
        await b.aclose()
    return (t1 - t0) / n, (t2 - t1) / n, cpu / n


async def floor_round(client: EtcdClient, prefix: str, n: int) -> float:
    async def member(i: int) -> None:
        await client.put(f"{prefix}{i:08d}", b"m")
        await client.range(prefix, prefix=True, keys_only=True)

    t0 = time.perf_counter()
    await asyncio.gather(*(member(i) for i in range(n)))
    took = time.perf_counter() - t0
    await client.delete(prefix, prefix=True)
    return took / n


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    enter: dict[int, float] = {}
    leave: dict[int, float] = {}
    cpu: dict[int, float] = {}
    floor: dict[int, float] = {}
    notes: list[str] = []
    async with ctx.connect() as client:
        await one_round(client, ctx.fresh_prefix("barrier-warm"), 3)
        for n in sizes:
            t0 = time.perf_counter()
            runs = []
            floors = []
            for _ in range(ctx.repeats):
                runs.append(await one_round(client, ctx.fresh_prefix("barrier"), n))
                floors.append(await floor_round(client, ctx.fresh_prefix("barrier-floor"), n))
            enter[n] = statistics.median(r[0] for r in runs) * 1e3
            leave[n] = statistics.median(r[1] for r in runs) * 1e3
            cpu[n] = statistics.median(r[2] for r in runs) * 1e3
            floor[n] = statistics.median(floors) * 1e3
            took = time.perf_counter() - t0
            print(f"  barriers N={n}: {took:.1f} s", flush=True)
            bigger = [s for s in sizes if s > n]
            # a member's snapshot reads every earlier member: a round is O(N^2) at best
            if bigger and took * (bigger[0] / n) ** 2 > BUDGET:
                notes.append(
                    f"stopped at N={n}: that size took {took:.0f} s for {ctx.repeats} rounds; "
                    f"a round reads O(N^2) keys, so N={bigger[0]} would take about "
                    f"{took * (bigger[0] / n) ** 2 / 60:.0f} min (budget {BUDGET:.0f} s)"
                )
                break
    notes.append(
        "one process, one client, each member its own DistributedDoubleBarrier instance and "
        "task; every member has its own self-healing lease (N leases)"
    )
    return FamilyResult(
        "barriers",
        [
            Row("enter, per member", "ms/member", enter, floor="floor: put + keys-only range"),
            Row("leave, per member", "ms/member", leave, floor="floor: put + keys-only range"),
            Row("floor: put + keys-only range", "ms/member", floor),
            Row("client CPU per member", "ms CPU/member", cpu),
        ],
        notes,
    )
