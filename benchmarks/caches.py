"""PrefixCache: memory per key, event latency, initial sync and resync, against raw etcd reads
and watches measured in the same run.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/caches.py [--keys 100000] [--caches 1000] [--samples 500]
                                          [--resync-keys 10000] [--repeats 3]
                                          [--endpoint HOST:PORT] [--quick]

Starts its own etcd (``etcd_recipes.testing.EtcdServer``: tmpfs, ``--unsafe-no-fsync``)
unless ``--endpoint`` is given. ``--quick`` shrinks every size (a smoke run of seconds).

1. **Memory**: ``--keys`` keys with 1 KiB values in one ``PrefixCache``, and the same keys with
   ``values=False``. Each variant loads in a fresh child process (nothing reused from another
   load); it reports the growth of resident memory and of the Python heap (tracemalloc, in a
   second child) per key, next to the floor -- a plain ``dict[str, bytes]`` (a ``set[str]``
   for keys only) built from a bare paginated range of the same keys. Targets: with values,
   under 2x the raw key + value bytes; without, under 300 B per key.
2. **Event latency**: from just before a put to the batch in a listener's and in a stream
   consumer's hands, p50/p99, with 1 and with ``--caches`` caches on one client (each on its
   own prefix; the puts rotate over them), against a raw ``client.watch`` per prefix
   consumed by ``async for``. Target: p50 < 2 ms on loopback, flat in the number of caches.
3. **Initial sync**: ``start()`` of a cache over the ``--keys`` keys against a bare
   paginated range (the same page size, every page at the first page's revision), alternating
   which goes first, ``--repeats`` times; medians. Target: >= 80 % of the bare range's speed.
4. **Resync**: a cache over ``--resync-keys`` keys is partitioned away (``TcpProxy``); 1 % of
   the keys change (updates, deletes, creates); history is compacted; the partition ends. The
   cache must re-read and emit exactly one synthetic event per change -- no more, no less --
   and equal etcd afterwards. Reports the resync time against a bare range of the keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from etcd_recipes import BatchKind, CacheBatch, CacheEventType, EtcdClient, Op, PrefixCache, connect
from etcd_recipes.testing import EtcdServer, TcpProxy

VALUE = b"v" * 1024
PAGE = 1000  # PrefixCache's default page size, used by the bare range too
TXN_OPS = 100  # puts per transaction when filling (etcd allows 128 by default)
TARGET_MEMORY_RATIO = 2.0
TARGET_KEYS_ONLY_BYTES = 300
TARGET_P50_MS = 2.0
TARGET_SYNC_RATIO = 0.80


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def key_of(root: str, i: int) -> str:
    return f"{root}{i:08d}"


def range_end(prefix: str) -> bytes:
    raw = prefix.encode()
    return raw[:-1] + bytes([raw[-1] + 1])


async def fill(client: EtcdClient, root: str, n: int, value: bytes = VALUE) -> int:
    """Put ``n`` keys under ``root`` (transactions of TXN_OPS puts, 8 at a time)."""
    chunks = [range(i, min(n, i + TXN_OPS)) for i in range(0, n, TXN_OPS)]
    revision = 0
    for start in range(0, len(chunks), 8):
        done = await asyncio.gather(
            *(
                client.txn([], [Op.put(key_of(root, i), value) for i in chunk])
                for chunk in chunks[start : start + 8]
            )
        )
        revision = max([revision, *(d.revision for d in done)])
    return revision


async def bare_range(client: EtcdClient, root: str, *, keys_only: bool = False) -> list[Any]:
    """What a cache's load does, bare: pages of PAGE keys, all at the first page's revision."""
    end = range_end(root)
    first = await client.range(root, range_end=end, limit=PAGE, keys_only=keys_only)
    kvs, more = list(first.kvs), first.more
    while more and kvs:
        page = await client.range(
            kvs[-1].key + b"\x00",
            range_end=end,
            limit=PAGE,
            revision=first.revision,
            keys_only=keys_only,
        )
        kvs.extend(page.kvs)
        more = page.more
    return kvs


# --------------------------------------------------------------------------- 1. memory


async def memory_child(endpoint: str, root: str, variant: str, heap: bool) -> dict[str, float]:
    """In a fresh process: load ``variant`` over ``root``; resident or heap growth."""
    async with connect(endpoint) as client:
        warm = PrefixCache(client, "/bench/cache/warm-up/")  # imports, the watch stream
        await warm.start()
        await bare_range(client, "/bench/cache/warm-up/")
        held: Any
        gc.collect()
        if heap:
            tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0] if heap else rss()
        if variant == "cache":
            held = PrefixCache(client, root)
            await held.start()
        elif variant == "cache-keys":
            held = PrefixCache(client, root, values=False)
            await held.start()
        elif variant == "dict":
            held = {kv.key_text: kv.value for kv in await bare_range(client, root)}
        else:
            held = {kv.key_text for kv in await bare_range(client, root, keys_only=True)}
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] if heap else rss()
        if heap:
            tracemalloc.stop()
        count = len(held)
        if isinstance(held, PrefixCache):
            await held.aclose()
        await warm.aclose()
    return {"bytes": float(after - before), "keys": float(count)}


def memory(endpoint: str, root: str, n: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for variant in ("cache", "dict", "cache-keys", "set"):
        out[variant] = {}
        for kind in ("rss", "heap"):
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--memory-child",
                variant,
                kind,
                "--endpoint",
                endpoint,
                "--root",
                root,
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"memory child {variant} {kind} failed:\n{done.stderr}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            assert result["keys"] == n, (variant, result)
            out[variant][kind] = result["bytes"] / n
    return out


# --------------------------------------------------------------------------- 2. latency


class Arrivals:
    """When each awaited key arrived, per receiver."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, float]] = {}
        self.done: dict[str, asyncio.Event] = {}
        self.receivers: set[str] = set()

    def expect(self, key: str) -> asyncio.Event:
        self.pending[key] = {}
        self.done[key] = event = asyncio.Event()
        return event

    def arrived(self, receiver: str, key: str) -> None:
        seen = self.pending.get(key)
        if seen is None or receiver in seen:
            return
        seen[receiver] = time.perf_counter()
        if len(seen) == len(self.receivers):
            self.done[key].set()

    def batch_handler(self, receiver: str) -> Callable[[CacheBatch[bytes]], None]:
        self.receivers.add(receiver)

        def handle(batch: CacheBatch[bytes]) -> None:
            if batch.kind is BatchKind.LIVE:
                for event in batch:
                    self.arrived(receiver, event.key)

        return handle


async def drive(
    client: EtcdClient, roots: list[str], arrivals: Arrivals, samples: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {r: [] for r in arrivals.receivers}
    for i in range(samples):
        await asyncio.sleep(0.005)  # everything is parked again
        key = f"{roots[i % len(roots)]}k{i}"
        done = arrivals.expect(key)
        sent = time.perf_counter()
        await client.put(key, b"x")
        await asyncio.wait_for(done.wait(), 10)
        for receiver, at in arrivals.pending.pop(key).items():
            out[receiver].append(at - sent)
        del arrivals.done[key]
    return out


async def cache_latency(
    client: EtcdClient, root: str, n: int, samples: int
) -> dict[str, list[float]]:
    """``n`` caches on one client, each with a listener and a stream consumer."""
    arrivals = Arrivals()
    on_listener = arrivals.batch_handler("listener")
    on_stream = arrivals.batch_handler("stream")
    roots = [f"{root}{i}/" for i in range(n)]
    caches = [PrefixCache(client, r) for r in roots]
    consumers: list[asyncio.Task[None]] = []

    async def consume(cache: PrefixCache[bytes]) -> None:
        async for batch in cache.events():
            on_stream(batch)

    for cache in caches:
        cache.add_listener(on_listener)
        consumers.append(asyncio.create_task(consume(cache)))
    for start in range(0, n, 100):
        await asyncio.gather(*(c.start() for c in caches[start : start + 100]))
    try:
        return await drive(client, roots, arrivals, samples)
    finally:
        for cache in caches:
            await cache.aclose()
        await asyncio.gather(*consumers, return_exceptions=True)


async def watch_latency(
    client: EtcdClient, root: str, n: int, samples: int
) -> dict[str, list[float]]:
    """The floor: ``n`` raw watches on one client, one per prefix, consumed by ``async for``."""
    arrivals = Arrivals()
    arrivals.receivers.add("watch")
    roots = [f"{root}{i}/" for i in range(n)]
    watches = [client.watch(r, prefix=True) for r in roots]
    for start in range(0, n, 100):
        await asyncio.gather(*(w.start() for w in watches[start : start + 100]))

    async def consume(watch: Any) -> None:
        async for event in watch:
            arrivals.arrived("watch", event.kv.key_text)

    consumers = [asyncio.create_task(consume(w)) for w in watches]
    try:
        return await drive(client, roots, arrivals, samples)
    finally:
        for watch in watches:
            await watch.aclose()
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)


# --------------------------------------------------------------------------- 3. initial sync


async def initial_sync(
    client: EtcdClient, root: str, repeats: int, *, values: bool
) -> tuple[float, float]:
    """Median seconds of (bare paginated range, cache start), alternating their order."""
    bare: list[float] = []
    cached: list[float] = []
    for r in range(repeats):
        for name in ("bare", "cache") if r % 2 == 0 else ("cache", "bare"):
            gc.collect()
            t0 = time.perf_counter()
            if name == "bare":
                kvs = await bare_range(client, root, keys_only=not values)
                bare.append(time.perf_counter() - t0)
                del kvs
            else:
                cache = PrefixCache(client, root, values=values)
                await cache.start()
                cached.append(time.perf_counter() - t0)
                await cache.aclose()
            print(
                f"  run {r + 1} {name:5s} {'values' if values else 'keys'}: "
                f"{(bare if name == 'bare' else cached)[-1] * 1e3:7.0f} ms",
                flush=True,
            )
    return statistics.median(bare), statistics.median(cached)


# --------------------------------------------------------------------------- 4. resync


async def resync(client: EtcdClient, endpoint: str, root: str, n: int) -> dict[str, Any]:
    await fill(client, root, n, b"1" * 64)
    changes = max(3, n // 100)
    updates, deletes = changes // 2, changes // 4
    creates = changes - updates - deletes
    batches: list[CacheBatch[bytes]] = []
    with TcpProxy.for_endpoint(endpoint) as proxy:
        async with connect(proxy.url) as through:
            cache = PrefixCache(through, root)
            await cache.start()
            cache.add_listener(batches.append)
            await asyncio.sleep(0.1)  # the listener had its INITIAL batch
            batches.clear()
            proxy.blackhole()
            # One revision per change (a single revision compacted at exactly the resume point
            # would hit etcd-io/etcd#18089 on etcd < 3.5.15 instead of a resync).
            for i in range(updates):
                await client.put(key_of(root, i), b"2" * 64)
            for i in range(deletes):
                await client.delete(key_of(root, n - 1 - i))
            for i in range(creates):
                await client.put(key_of(root, n + i), b"3" * 64)
            head = (await client.status()).revision
            await client.compact(head)
            t0 = time.perf_counter()
            proxy.restore()
            while cache.resync_count < 1 or not cache.is_synced:
                await asyncio.sleep(0.001)
            took = time.perf_counter() - t0
            await cache.wait_for_revision(head, timeout=10)
            await asyncio.sleep(0.1)  # the listener has every batch
            on_server = {kv.key_text: kv.value for kv in await bare_range(client, root)}
            equal = dict(cache.items()) == on_server
            t1 = time.perf_counter()
            await bare_range(client, root)
            bare = time.perf_counter() - t1
            await cache.aclose()
    synthetic = [e for b in batches if b.kind is BatchKind.RESYNC for e in b]
    live = [e for b in batches if b.kind is BatchKind.LIVE for e in b]
    kinds = {t: sum(e.type is t for e in synthetic) for t in CacheEventType}
    return {
        "changes": changes,
        "events": len(synthetic),
        "live": len(live),
        "by_type": {t.value: c for t, c in kinds.items()},
        "expected": {"UPDATED": updates, "DELETED": deletes, "CREATED": creates},
        "equal": equal,
        "seconds": took,
        "bare": bare,
        "markers": [b.kind.value for b in batches if b.is_marker],
    }


# --------------------------------------------------------------------------- main


async def main_async(endpoint: str, args: argparse.Namespace) -> None:
    keys, caches, samples = args.keys, args.caches, args.samples
    async with connect(endpoint) as client:
        print(f"filling {keys} keys x {len(VALUE)} B ...", flush=True)
        t0 = time.perf_counter()
        await fill(client, "/bench/cache/big/", keys)
        print(f"  {time.perf_counter() - t0:.1f} s", flush=True)

        print("\n1. memory (each variant in a fresh child process)", flush=True)
        mem = await asyncio.to_thread(memory, endpoint, "/bench/cache/big/", keys)
        raw = len(VALUE) + len(key_of("/bench/cache/big/", 0))
        raw_keys = len(key_of("/bench/cache/big/", 0))

        print("\n2. event latency", flush=True)
        lat: dict[int, dict[str, list[float]]] = {}
        for n in sorted({1, caches}):
            lat[n] = await watch_latency(client, f"/bench/cache/lw{n}/", n, samples)
            lat[n].update(await cache_latency(client, f"/bench/cache/lc{n}/", n, samples))
            medians = {r: pct(v, 0.5) * 1e3 for r, v in lat[n].items()}
            print(f"  {n} caches: " + ", ".join(f"{r} p50 {p:.2f} ms" for r, p in medians.items()))

        print("\n3. initial sync", flush=True)
        sync_v = await initial_sync(client, "/bench/cache/big/", args.repeats, values=True)
        sync_k = await initial_sync(client, "/bench/cache/big/", args.repeats, values=False)

        print("\n4. resync after compaction", flush=True)
        rs = await resync(client, endpoint, "/bench/cache/rs/", args.resync_keys)

    print()
    print(f"1. memory per key, {keys} keys (raw: {raw} B with the value, {raw_keys} B key only)")
    print(f"   {'':28s} {'resident':>10s} {'heap':>10s} {'/ raw':>7s}  target")
    rows = [
        ("PrefixCache", "cache", raw, f"< {TARGET_MEMORY_RATIO:.0f}x raw"),
        ("floor: dict[str, bytes]", "dict", raw, ""),
        ("PrefixCache values=False", "cache-keys", raw_keys, f"< {TARGET_KEYS_ONLY_BYTES} B"),
        ("floor: set[str]", "set", raw_keys, ""),
    ]
    for label, variant, base, target in rows:
        r, h = mem[variant]["rss"], mem[variant]["heap"]
        print(f"   {label:28s} {r:8.0f} B {h:8.0f} B {r / base:6.2f}x  {target}")
    ok_mem = mem["cache"]["rss"] < TARGET_MEMORY_RATIO * raw
    ok_keys = mem["cache-keys"]["rss"] < TARGET_KEYS_ONLY_BYTES
    print(
        f"   verdict: values {'OK' if ok_mem else 'MISSED'}, "
        f"values=False {'OK' if ok_keys else 'MISSED'} (by resident memory)"
    )
    print()
    print(
        f"2. latency put -> batch in hand, {samples} samples (target p50 < {TARGET_P50_MS} ms, "
        "flat in the number of caches)"
    )
    print(f"   {'caches':>6s} {'receiver':10s} {'p50':>9s} {'p99':>9s} {'p50 / raw watch':>16s}")
    for n, rows_n in lat.items():
        floor = pct(rows_n["watch"], 0.5)
        for receiver in ("watch", "listener", "stream"):
            v = rows_n[receiver]
            p50, p99 = pct(v, 0.5), pct(v, 0.99)
            label = "raw watch" if receiver == "watch" else receiver
            print(
                f"   {n:6d} {label:10s} {p50 * 1e3:6.2f} ms {p99 * 1e3:6.2f} ms "
                f"{p50 / floor:15.2f}x"
            )
    print()
    print(
        f"3. initial sync of {keys} keys, median of {args.repeats} "
        f"(target >= {TARGET_SYNC_RATIO:.0%} of the bare range's speed)"
    )
    for label, (bare, cached) in (("with values", sync_v), ("values=False", sync_k)):
        print(
            f"   {label:13s}: bare range {bare * 1e3:7.0f} ms, PrefixCache.start() "
            f"{cached * 1e3:7.0f} ms = {bare / cached:.0%} of the bare speed "
            f"({keys / cached:,.0f} keys/s)"
        )
    print()
    exact = rs["events"] == rs["changes"] and rs["by_type"] == rs["expected"]
    print(f"4. resync after compaction, {args.resync_keys} keys, {rs['changes']} changed")
    print(
        f"   synthetic events {rs['events']} for {rs['changes']} changes "
        f"({'EXACT' if exact else 'MISMATCH'}: {rs['by_type']}, expected {rs['expected']}); "
        f"live events {rs['live']}; markers {rs['markers']}; "
        f"equal to etcd afterwards: {rs['equal']}"
    )
    print(
        f"   resync {rs['seconds'] * 1e3:.0f} ms (restore -> synced), bare range of the keys "
        f"{rs['bare'] * 1e3:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--caches", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=500, help="latency samples per row")
    parser.add_argument("--resync-keys", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--endpoint")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        variant, kind = args.memory_child
        out = asyncio.run(memory_child(args.endpoint, args.root, variant, kind == "heap"))
        print(json.dumps(out))
        return
    if args.quick:
        args.keys, args.caches, args.samples = 2000, 20, 30
        args.resync_keys, args.repeats = 1000, 1
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        asyncio.run(main_async(endpoint, args))


if __name__ == "__main__":
    main()
