"""PrefixCache over N keys (1 KiB values), against etcd's own reads of the same keys.

One prefix is filled up to each N in turn (the keys of the smaller sizes stay). Rows:

* ``initial load, per key``: ``PrefixCache.start()`` wall / N (median of ``ctx.repeats``);
  floor ``floor: paginated range, per key``: the bare read a load makes (pages of 1,000 keys,
  every page at the first page's revision), in the same rounds, alternating which goes first;
* ``memory per key, Python heap``: heap growth (tracemalloc) of a started cache / N; floor
  ``floor: dict[str, bytes], heap``: a plain dict built from the bare range, the same way;
* ``event latency p50``: put -> the LIVE batch in a listener's hands, the cache holding N keys,
  ``SAMPLES`` samples; floor ``floor: raw watch event p50``: a bare prefix watch on the same
  client, same puts;
* ``resync after compaction, per key``: a cache over the N keys behind a ``TcpProxy`` is cut
  off (blackhole), 1 % of the keys change (at least 3), history is compacted, the proxy is
  restored: milliseconds from restore to the cache synced again (the whole resync: it is
  O(N) by nature); floor ``floor: paginated range``: the whole bare read of the N keys (the
  read a resync must make).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from etcd_recipes import BatchKind, CacheBatch, EtcdClient, Op, PrefixCache, connect
from etcd_recipes.testing import TcpProxy
from scale_families._api import FamilyResult, Row, ScaleContext, measure

VALUE = b"v" * 1024
PAGE = 1000
SAMPLES = 50


def key_of(root: str, i: int) -> str:
    return f"{root}{i:08d}"


def range_end(prefix: str) -> bytes:
    raw = prefix.encode()
    return raw[:-1] + bytes([raw[-1] + 1])


async def fill(client: EtcdClient, root: str, start: int, stop: int) -> None:
    chunks = [range(i, min(stop, i + 100)) for i in range(start, stop, 100)]
    for at in range(0, len(chunks), 8):
        await asyncio.gather(
            *(
                client.txn([], [Op.put(key_of(root, i), VALUE) for i in chunk])
                for chunk in chunks[at : at + 8]
            )
        )


async def bare_range(client: EtcdClient, root: str) -> list[Any]:
    end = range_end(root)
    first = await client.range(root, range_end=end, limit=PAGE)
    kvs, more = list(first.kvs), first.more
    while more and kvs:
        page = await client.range(
            kvs[-1].key + b"\x00", range_end=end, limit=PAGE, revision=first.revision
        )
        kvs.extend(page.kvs)
        more = page.more
    return kvs


async def load_times(
    client: EtcdClient, root: str, n: int, repeats: int
) -> tuple[float, float, float]:
    cached: list[float] = []
    bare: list[float] = []
    for r in range(repeats):
        for name in ("cache", "bare") if r % 2 == 0 else ("bare", "cache"):
            if name == "cache":
                with measure() as usage:
                    cache = PrefixCache(client, root)
                    await cache.start()
                assert len(cache) == n, (len(cache), n)
                await cache.aclose()
                cached.append(usage.wall / n)
            else:
                with measure() as usage:
                    kvs = await bare_range(client, root)
                assert len(kvs) == n
                del kvs
                bare.append(usage.wall / n)
    return statistics.median(cached), statistics.median(bare), statistics.median(bare) * n


async def heap_per_key(client: EtcdClient, root: str, n: int) -> tuple[float, float]:
    with measure(heap=True) as usage:
        cache = PrefixCache(client, root)
        await cache.start()
    await cache.aclose()
    with measure(heap=True) as floor:
        held = {kv.key_text: kv.value for kv in await bare_range(client, root)}
    assert len(held) == n
    del held
    return (usage.heap or 0) / n, (floor.heap or 0) / n


async def event_latency(client: EtcdClient, root: str) -> tuple[float, float]:
    arrived: dict[str, float] = {}
    seen = asyncio.Event()

    def listener(batch: CacheBatch[bytes]) -> None:
        if batch.kind is BatchKind.LIVE:
            for event in batch:
                arrived.setdefault(event.key, time.perf_counter())
            seen.set()

    cache = PrefixCache(client, root)
    cache.add_listener(listener)
    await cache.start()
    raw: list[float] = []
    ours: list[float] = []
    async with client.watch(root, prefix=True) as watch:
        events = watch.__aiter__()
        for i in range(SAMPLES):
            await asyncio.sleep(0.005)
            key = f"{root}zz-latency-{i}"
            seen.clear()
            t0 = time.perf_counter()
            await client.put(key, b"x")
            await events.__anext__()
            raw.append(time.perf_counter() - t0)
            while key not in arrived:
                await asyncio.wait_for(seen.wait(), 30)
                seen.clear()
            ours.append(arrived[key] - t0)
    await cache.aclose()
    await client.delete(f"{root}zz-latency-", prefix=True)
    return statistics.median(ours), statistics.median(raw)


async def resync(client: EtcdClient, endpoint: str, root: str, n: int) -> float:
    changes = max(3, n // 100)
    with TcpProxy.for_endpoint(endpoint) as proxy:
        async with connect(proxy.url) as through:
            cache = PrefixCache(through, root)
            await cache.start()
            proxy.blackhole()
            for i in range(changes):  # one revision each (etcd-io/etcd#18089: not a single one)
                await client.put(key_of(root, (i * 7919) % n), b"changed")
            head = (await client.status()).revision
            await client.compact(head)
            before = cache.resync_count
            t0 = time.perf_counter()
            proxy.restore()
            while cache.resync_count <= before or not cache.is_synced:
                await asyncio.sleep(0.001)
            took = time.perf_counter() - t0
            await cache.wait_for_revision(head, timeout=30)
            await cache.aclose()
    await fill(client, root, 0, n)  # the values back to 1 KiB
    return took


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    names = ("load", "load_floor", "heap", "heap_floor", "event", "event_floor", "resync", "whole")
    got: dict[str, dict[int, float]] = {k: {} for k in names}
    root = ctx.fresh_prefix("cache")
    filled = 0
    async with ctx.connect() as client:
        await fill(client, ctx.fresh_prefix("cache-warm"), 0, 10)
        for n in sizes:
            t0 = time.perf_counter()
            await fill(client, root, filled, n)
            filled = n
            load, load_floor, whole = await load_times(client, root, n, ctx.repeats)
            heap, heap_floor = await heap_per_key(client, root, n)
            events = [await event_latency(client, root) for _ in range(ctx.repeats)]
            resyncs = [await resync(client, ctx.endpoint, root, n) for _ in range(ctx.repeats)]
            for name, value in (
                ("load", load * 1e6),
                ("load_floor", load_floor * 1e6),
                ("heap", heap / 1024),
                ("heap_floor", heap_floor / 1024),
                ("event", statistics.median(e[0] for e in events) * 1e3),
                ("event_floor", statistics.median(e[1] for e in events) * 1e3),
                ("resync", statistics.median(resyncs) * 1e3),
                ("whole", whole * 1e3),
            ):
                got[name][n] = value
            print(f"  caches N={n}: {time.perf_counter() - t0:.1f} s", flush=True)
    floor_range = "floor: paginated range, per key"
    return FamilyResult(
        "caches",
        [
            Row("initial load, per key", "µs/key", got["load"], floor=floor_range),
            Row(floor_range, "µs/key", got["load_floor"]),
            Row("resync after compaction", "ms", got["resync"], floor="floor: paginated range"),
            Row("floor: paginated range", "ms", got["whole"]),
            Row("memory per key, Python heap", "KB/key", got["heap"], floor="floor: dict, heap"),
            Row("floor: dict, heap", "KB/key", got["heap_floor"]),
            Row("event latency p50", "ms", got["event"], floor="floor: raw watch event p50"),
            Row("floor: raw watch event p50", "ms", got["event_floor"]),
        ],
        [
            f"keys of {len(VALUE)} B values; one prefix filled up to each N; "
            "1 % of the keys (at least 3) change during a resync",
            "memory: tracemalloc heap growth of a started cache (a dict of the same kvs as floor)",
        ],
    )
