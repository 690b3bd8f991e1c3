"""Discovery: ``ServiceCache`` over a service of N instances, with 1 and with 10 caches of it
on one client (instances x caches).

Records are written bare (the JSON ``ServiceRegistry`` writes, no lease, transactions of 100).
Rows, per number of caches C (medians of ``ctx.repeats`` rounds):

* ``C caches: start, per cached instance``: wall time to start the C caches / (N x C); floor
  ``floor: paginated range, per instance``: a bare paginated read of the N records / N;
* ``C caches: heap per cached instance``: tracemalloc growth of starting the C caches /
  (N x C) (a round of its own);
* ``C caches: put -> visible p50``: a record put (one more instance) until every cache has
  reached its revision (``wait_for_revision``), ``SAMPLES`` samples; floor ``floor: raw watch
  event p50``: a bare prefix watch on the same client, the same puts;
* ``C caches: instances() after a change``: the first ``instances()`` call on one cache after
  a change (it rebuilds the cached list), per call.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from etcd_recipes import EtcdClient, Op, ServiceCache, ServiceInstance
from scale_families._api import FamilyResult, Row, ScaleContext, measure

PAYLOAD = '{"zone":"eu-west-1","weight":10,"version":"1.4.2"}'
SERVICE = "svc"
SAMPLES = 30
CACHES = (1, 10)
BUDGET = 200.0


def record(i: int) -> tuple[str, bytes]:
    instance = ServiceInstance(
        SERVICE, PAYLOAD, address=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", port=8080
    )
    return instance.id, instance.to_json()


async def fill(client: EtcdClient, root: str, start: int, stop: int) -> None:
    ops = []
    for i in range(start, stop):
        iid, data = record(i)
        ops.append(Op.put(f"{root}/names/{SERVICE}/{iid}", data))
    chunks = [ops[i : i + 100] for i in range(0, len(ops), 100)]
    for at in range(0, len(chunks), 8):
        await asyncio.gather(*(client.txn([], chunk) for chunk in chunks[at : at + 8]))


async def bare_range(client: EtcdClient, prefix: str) -> int:
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    first = await client.range(prefix, range_end=end, limit=1000)
    kvs, more = list(first.kvs), first.more
    while more and kvs:
        page = await client.range(
            kvs[-1].key + b"\x00", range_end=end.encode(), limit=1000, revision=first.revision
        )
        kvs.extend(page.kvs)
        more = page.more
    return len(kvs)


async def one_round(client: EtcdClient, root: str, n: int, c: int) -> dict[str, float]:
    with measure() as usage:
        caches: list[ServiceCache[Any]] = [ServiceCache(client, root, SERVICE) for _ in range(c)]
        await asyncio.gather(*(cache.start() for cache in caches))
    assert all(len(cache) == n for cache in caches), [len(cache) for cache in caches]
    with measure() as floor:
        assert await bare_range(client, f"{root}/names/{SERVICE}/") == n
    visible: list[float] = []
    raw: list[float] = []
    rebuild: list[float] = []
    added: list[str] = []
    async with client.watch(f"{root}/names/", prefix=True) as watch:
        events = watch.__aiter__()
        for i in range(SAMPLES):
            await asyncio.sleep(0.005)
            iid, data = record(i)
            t0 = time.perf_counter()
            added.append(f"{root}/names/{SERVICE}/{iid}")
            put = await client.put(added[-1], data)
            await events.__anext__()
            raw.append(time.perf_counter() - t0)
            await asyncio.gather(*(cache.wait_for_revision(put.revision) for cache in caches))
            visible.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            caches[0].instances()
            rebuild.append(time.perf_counter() - t1)
    for cache in caches:
        await cache.aclose()
    for key in added:
        await client.delete(key)
    return {
        "start": usage.wall / (n * c) * 1e6,
        "floor": floor.wall / n * 1e6,
        "visible": statistics.median(visible) * 1e3,
        "raw": statistics.median(raw) * 1e3,
        "rebuild": statistics.median(rebuild) * 1e6,
    }


async def heap_round(client: EtcdClient, root: str, n: int, c: int) -> float:
    with measure(heap=True) as usage:
        caches: list[ServiceCache[Any]] = [ServiceCache(client, root, SERVICE) for _ in range(c)]
        await asyncio.gather(*(cache.start() for cache in caches))
    for cache in caches:
        await cache.aclose()
    return (usage.heap or 0) / (n * c) / 1024


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    rows: list[Row] = []
    notes: list[str] = []
    floor: dict[int, float] = {}
    raw: dict[int, float] = {}
    async with ctx.connect() as client:
        warm = ctx.fresh_prefix("disco-warm").rstrip("/")
        await fill(client, warm, 0, 10)
        await one_round(client, warm, 10, 1)
        for c in CACHES:
            root = ctx.fresh_prefix(f"disco-{c}").rstrip("/")
            filled = 0
            got: dict[str, dict[int, float]] = {}
            for n in sizes:
                t0 = time.perf_counter()
                await fill(client, root, filled, n)
                filled = n
                runs = [await one_round(client, root, n, c) for _ in range(ctx.repeats)]
                for key in runs[0]:
                    got.setdefault(key, {})[n] = statistics.median(r[key] for r in runs)
                got.setdefault("heap", {})[n] = await heap_round(client, root, n, c)
                if c == CACHES[0]:
                    floor[n], raw[n] = got["floor"][n], got["raw"][n]
                took = time.perf_counter() - t0
                print(f"  discovery {c} caches N={n}: {took:.1f} s", flush=True)
                bigger = [s for s in sizes if s > n]
                if bigger and took * bigger[0] / n > BUDGET:
                    notes.append(
                        f"{c} caches: stopped at N={n} ({took:.0f} s; N={bigger[0]} would take "
                        f"about {took * bigger[0] / n / 60:.0f} min)"
                    )
                    break
            label = f"{c} cache{'s' if c > 1 else ''}"
            rows += [
                Row(
                    f"{label}: start, per cached instance",
                    "µs/instance",
                    got["start"],
                    floor="floor: paginated range, per instance",
                ),
                Row(f"{label}: heap per cached instance", "KB/instance", got["heap"]),
                Row(
                    f"{label}: put -> visible p50",
                    "ms",
                    got["visible"],
                    floor="floor: raw watch event p50",
                ),
                Row(f"{label}: instances() after a change", "µs/call", got["rebuild"]),
            ]
    rows += [
        Row("floor: paginated range, per instance", "µs/instance", floor),
        Row("floor: raw watch event p50", "ms", raw),
    ]
    notes.append(
        f"one service, N instances ({len(record(0)[1])} B of JSON each), written bare; the C "
        "caches share one client"
    )
    return FamilyResult("discovery", rows, notes)
