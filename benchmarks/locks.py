"""Lock performance: uncontended cycles against the raw two-write floor, hand-off latency under
contention, and the traffic per hand-off as the queue grows (it must stay flat).

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/locks.py [--duration 3] [--repeats 3] [--handoffs 500]
                                         [--waiters 10] [--traffic 10 100] [--v3lock 30]
                                         [--endpoint HOST:PORT] [--json out.json]
                                         [--only uncontended] [--profile]

Starts its own etcd (``etcd_recipes.testing.EtcdServer``: tmpfs, ``--unsafe-no-fsync``) unless
``--endpoint`` is given. Everything runs in one Python process on one client.

1. **Uncontended** acquire + release per second, sequentially on one ``DistributedMutex``,
   against the **floor** measured in the same run with bare ``aetcd.rpc`` stubs on a raw
   channel: the same two raft writes -- the queueing transaction (``If(create_revision == 0)
   Then(put key with lease, get the two newest keys)``) and the delete -- with one lease
   granted up front, as the mutex keeps one lease per instance. Phases alternate (ours first,
   then bare first), ``--repeats`` times; the medians are compared. Target: >= 90 % of the
   floor (the machine's load moves single runs by +-15 %: use ``--repeats 5`` or more, and
   read the client CPU per cycle next to the rates). ``--only uncontended`` stops after this
   section; ``--profile`` then runs 2,000 more mutex cycles under ``cProfile`` and prints the
   30 functions with the most own time.
2. **Hand-off latency** with ``--waiters`` mutexes contending in a loop: from the holder's
   ``release()`` call to the next holder's ``acquire()`` returning; p50 / p99 over
   ``--handoffs`` hand-offs. Target: p50 < 5 ms on loopback. ``--v3lock N`` adds the same
   measurement for etcd's own Lock RPC (``server_lock``) over N hand-offs, for comparison.
3. **Traffic per hand-off** with 10 and 100 queued waiters (``--traffic``): unary RPCs and
   watch responses carrying events, counted on the client while the whole queue is handed
   through once. Must be flat in the number of waiters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
from aetcd import rpc

from etcd_recipes import DistributedMutex, EtcdClient, connect, server_lock, server_unlock

TIMEOUT = 10.0
TARGET_RATIO = 0.90
TARGET_P50_MS = 5.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


# --------------------------------------------------------------------------- 1. uncontended


class BareCycle:
    """The floor: one queueing transaction and one delete on bare stubs, lease granted once."""

    def __init__(self, endpoint: str, prefix: bytes) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.kv = rpc.KVStub(self.channel)
        self.leases = rpc.LeaseStub(self.channel)
        self.prefix = prefix
        self.lease = 0
        self.key = b""

    async def start(self) -> None:
        grant = await self.leases.LeaseGrant(rpc.LeaseGrantRequest(TTL=3600), timeout=TIMEOUT)
        self.lease = int(grant.ID)
        self.key = self.prefix + b"%x" % self.lease

    async def cycle(self) -> None:
        newest = rpc.RangeRequest(
            key=self.prefix,
            range_end=prefix_end(self.prefix),
            limit=2,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.CREATE,
            keys_only=True,
        )
        resp = await self.kv.Txn(
            rpc.TxnRequest(
                compare=[
                    rpc.Compare(
                        key=self.key,
                        target=rpc.Compare.CREATE,
                        result=rpc.Compare.EQUAL,
                        create_revision=0,
                    )
                ],
                success=[
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(key=self.key, value=b"", lease=self.lease)
                    ),
                    rpc.RequestOp(request_range=newest),
                ],
                failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=self.key))],
            ),
            timeout=TIMEOUT,
        )
        if not resp.succeeded:
            raise AssertionError("the floor's key existed already")
        await self.kv.DeleteRange(rpc.DeleteRangeRequest(key=self.key), timeout=TIMEOUT)

    async def aclose(self) -> None:
        await self.leases.LeaseRevoke(rpc.LeaseRevokeRequest(ID=self.lease), timeout=TIMEOUT)
        await self.channel.close()


async def cycles_per_second(fn: Any, duration: float) -> tuple[float, float]:
    """(cycles/s, client CPU microseconds per cycle) of ``fn`` run back to back."""
    gc.collect()
    n = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = t0 + duration
    while time.perf_counter() < end:
        await fn()
        n += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return n / elapsed, cpu / n * 1e6


async def uncontended(
    client: EtcdClient, endpoint: str, args: argparse.Namespace
) -> dict[str, Any]:
    mutex = DistributedMutex(client, "/bench/lock/uncontended")
    bare = BareCycle(endpoint, b"/bench/lock/floor/")
    await bare.start()

    async def ours() -> None:
        await mutex.acquire()
        await mutex.release()

    for _ in range(200):  # warm-up: lease, channels, code paths
        await ours()
        await bare.cycle()
    runs: dict[str, list[tuple[float, float]]] = {"mutex": [], "floor": []}
    for repeat in range(args.repeats):
        order = [("mutex", ours), ("floor", bare.cycle)]
        if repeat % 2:
            order.reverse()
        for name, fn in order:
            rate, cpu = await cycles_per_second(fn, args.duration)
            runs[name].append((rate, cpu))
            print(
                f"  uncontended {name:<5} run {repeat + 1}: {rate:7.0f}/s  cpu {cpu:5.0f} us",
                file=sys.stderr,
                flush=True,
            )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            await ours()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        print("\n=== cProfile: 2000 uncontended mutex cycles ===\n" + out.getvalue())
    await mutex.aclose()
    await bare.aclose()
    mutex_rate = statistics.median(r for r, _ in runs["mutex"])
    floor_rate = statistics.median(r for r, _ in runs["floor"])
    return {
        "mutex_per_s": mutex_rate,
        "floor_per_s": floor_rate,
        "ratio": mutex_rate / floor_rate,
        "mutex_cpu_us": statistics.median(c for _, c in runs["mutex"]),
        "floor_cpu_us": statistics.median(c for _, c in runs["floor"]),
        "runs": runs,
    }


# --------------------------------------------------------------------------- 2. hand-off latency


async def handoff_latency(client: EtcdClient, waiters: int, handoffs: int) -> dict[str, Any]:
    mutexes = [DistributedMutex(client, "/bench/lock/handoff") for _ in range(waiters)]
    latencies: list[float] = []
    released_at = [0.0]
    done = asyncio.Event()

    async def contender(mutex: DistributedMutex) -> None:
        while not done.is_set():
            await mutex.acquire()
            now = time.perf_counter()
            if released_at[0]:
                latencies.append(now - released_at[0])
            if len(latencies) >= handoffs:
                done.set()
            released_at[0] = time.perf_counter()
            await mutex.release()

    tasks = [asyncio.create_task(contender(m)) for m in mutexes]
    await asyncio.wait_for(done.wait(), 120)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for m in mutexes:
        await m.aclose()
    return {
        "waiters": waiters,
        "handoffs": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "per_s": 1 / statistics.mean(latencies) if latencies else 0.0,
    }


async def v3lock_latency(client: EtcdClient, waiters: int, handoffs: int) -> dict[str, Any]:
    latencies: list[float] = []
    released_at = [0.0]
    done = asyncio.Event()

    async def contender() -> None:
        async with client.lease(10) as lease:
            while not done.is_set():
                key = await server_lock(client, "/bench/lock/v3lock", lease.id)
                now = time.perf_counter()
                if released_at[0]:
                    latencies.append(now - released_at[0])
                if len(latencies) >= handoffs:
                    done.set()
                released_at[0] = time.perf_counter()
                await server_unlock(client, key)

    tasks = [asyncio.create_task(contender()) for _ in range(waiters)]
    await asyncio.wait_for(done.wait(), 120)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "waiters": waiters,
        "handoffs": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "per_s": 1 / statistics.mean(latencies) if latencies else 0.0,
    }


# --------------------------------------------------------------------------- 3. traffic


@contextlib.contextmanager
def counting(client: EtcdClient) -> Iterator[dict[str, int]]:
    counts = {"rpcs": 0, "event_messages": 0}
    call, hub = client._call, client._watch_hub
    dispatch = hub._dispatch

    async def counting_call(*args: Any, **kwargs: Any) -> Any:
        counts["rpcs"] += 1
        return await call(*args, **kwargs)

    def counting_dispatch(msg: Any) -> None:
        if msg.events:
            counts["event_messages"] += 1
        dispatch(msg)

    client._call = counting_call  # type: ignore[method-assign]
    hub._dispatch = counting_dispatch  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        del client._call
        del hub._dispatch


async def traffic(client: EtcdClient, waiters: int) -> dict[str, Any]:
    path = f"/bench/lock/traffic-{waiters}"
    holder = DistributedMutex(client, path)
    others = [DistributedMutex(client, path) for _ in range(waiters)]
    await holder.acquire()

    gaps: list[float] = []
    released_at = [0.0]

    async def take(m: DistributedMutex) -> None:
        async with m:
            gaps.append(time.perf_counter() - released_at[0])
            released_at[0] = time.perf_counter()

    tasks = [asyncio.create_task(take(m)) for m in others]
    while await client.count(path + "/") < waiters + 1:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    with counting(client) as counts:
        t0 = released_at[0] = time.perf_counter()
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        elapsed = time.perf_counter() - t0
    for m in (holder, *others):
        await m.aclose()
    return {
        "waiters": waiters,
        "rpcs_per_handoff": counts["rpcs"] / waiters,
        "watch_events_per_handoff": counts["event_messages"] / waiters,
        "handoffs_per_s": waiters / elapsed,
        "p50_ms": percentile(gaps, 0.5) * 1000,
        "p99_ms": percentile(gaps, 0.99) * 1000,
    }


# --------------------------------------------------------------------------- driver


async def bench(endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    async with connect(endpoint) as client:
        status = await client.status()
        result: dict[str, Any] = {
            "meta": {
                "etcd_version": status.version,
                "python": platform.python_version(),
                "grpcio": grpc.__version__,
                "endpoint": endpoint,
                "duration": args.duration,
                "repeats": args.repeats,
            }
        }
        result["uncontended"] = await uncontended(client, endpoint, args)
        if args.only == "uncontended":
            return result
        result["handoff"] = await handoff_latency(client, args.waiters, args.handoffs)
        if args.v3lock:
            result["v3lock_handoff"] = await v3lock_latency(client, args.waiters, args.v3lock)
        result["traffic"] = [await traffic(client, n) for n in args.traffic]
    return result


def report(result: dict[str, Any]) -> str:
    u = result["uncontended"]
    lines = [
        "uncontended acquire+release (one mutex, sequential):",
        f"  DistributedMutex      {u['mutex_per_s']:7.0f} cycles/s  "
        f"(client cpu {u['mutex_cpu_us']:.0f} us/cycle)",
        f"  raw floor (txn+delete){u['floor_per_s']:7.0f} cycles/s  "
        f"(client cpu {u['floor_cpu_us']:.0f} us/cycle)",
        f"  ratio                 {u['ratio']:7.2f}   (target >= {TARGET_RATIO:.2f}: "
        f"{'PASS' if u['ratio'] >= TARGET_RATIO else 'FAIL'})",
    ]
    if "handoff" not in result:
        return "\n".join(lines)
    h = result["handoff"]
    lines += [
        "",
        f"hand-off latency, {h['waiters']} contenders re-queueing in a loop, "
        f"{h['handoffs']} hand-offs:",
        f"  p50 {h['p50_ms']:.2f} ms   p99 {h['p99_ms']:.2f} ms   "
        f"({h['per_s']:.0f} hand-offs/s)   (target p50 < {TARGET_P50_MS} ms: "
        f"{'PASS' if h['p50_ms'] < TARGET_P50_MS else 'FAIL'})",
    ]
    if "v3lock_handoff" in result:
        v = result["v3lock_handoff"]
        lines.append(
            f"  for comparison, etcd's Lock RPC (server_lock): p50 {v['p50_ms']:.2f} ms   "
            f"p99 {v['p99_ms']:.2f} ms   ({v['per_s']:.0f} hand-offs/s, {v['handoffs']} timed)"
        )
    lines += ["", "traffic per hand-off (whole queue handed through once):"]
    for t in result["traffic"]:
        lines.append(
            f"  {t['waiters']:>4} waiters: {t['rpcs_per_handoff']:.2f} RPCs, "
            f"{t['watch_events_per_handoff']:.2f} watch events   "
            f"({t['handoffs_per_s']:.0f} hand-offs/s, p50 {t['p50_ms']:.2f} ms, "
            f"p99 {t['p99_ms']:.2f} ms)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="host:port of an etcd to use (default: start one)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of uncontended phases")
    parser.add_argument("--waiters", type=int, default=10, help="contenders for the latency")
    parser.add_argument("--handoffs", type=int, default=500, help="hand-offs to time")
    parser.add_argument("--traffic", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--v3lock", type=int, default=30, help="v3lock hand-offs (0: skip)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--only", choices=["uncontended"], help="run only this section")
    parser.add_argument("--profile", action="store_true", help="cProfile the mutex cycle")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.endpoint:
            endpoint = args.endpoint
        else:
            from etcd_recipes.testing import EtcdServer

            server = stack.enter_context(EtcdServer())
            endpoint = server.endpoint
            print(f"started etcd at {endpoint}", file=sys.stderr)
        result = asyncio.run(bench(endpoint, args))
    print(report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
