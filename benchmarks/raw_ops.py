"""Raw operation throughput: ``EtcdClient`` against bare ``aetcd.rpc`` stubs, in the same run.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/raw_ops.py [--duration 3] [--repeats 3] [--conc 1 64]
                                           [--ops put txn count] [--endpoint HOST:PORT]
                                           [--json out.json] [--profile]

Starts its own etcd (``etcd_recipes.testing.EtcdServer``) unless ``--endpoint`` is given.
For each operation and concurrency it runs a phase through our client and a phase through
bare stubs on a raw ``grpc.aio`` channel, alternating which goes first, ``--repeats`` times,
and reports the medians: ops/s, p50 and p99 latency, and the throughput ratio ours / bare.
The target is "within 15% of bare stubs": every ratio >= 0.85.

Operations:

- ``put``: a 64-byte value to one key per worker;
- ``txn``: compare ``mod_revision ==`` the key's revision, then delete it (keys are prepared
  before the phase, outside the timing);
- ``count``: a count-only range over a prefix of 1,000 keys.

``--profile`` runs one extra phase per operation through our client at the highest
concurrency under cProfile and prints where the time goes.
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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from aetcd import rpc

from etcd_recipes import Cmp, EtcdClient, Op, connect

VALUE = b"v" * 64
COUNT_PREFIX = b"/bench/count/"
COUNT_KEYS = 1000
TXN_PREFIX = b"/bench/txn/"
PREPARE_BATCH = 100  # puts per preparation transaction (etcd allows 128 operations)
TIMEOUT = 10.0  # per-call deadline, the same for both clients (ours defaults to 10 s too)
TARGET = 0.85  # ours must reach 85% of bare throughput


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


# --------------------------------------------------------------------------- measurements


@dataclass
class Phase:
    op: str
    conc: int
    impl: str
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # this process's CPU time per call (client side only), in microseconds

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    op: str
    conc: int
    ours: list[Phase] = field(default_factory=list)
    bare: list[Phase] = field(default_factory=list)

    @staticmethod
    def _median(phases: list[Phase], attr: str) -> float:
        values = [p.rate if attr == "rate" else getattr(p, attr) for p in phases]
        return statistics.median(values) if values else 0.0

    def median(self, impl: str, attr: str) -> float:
        return self._median(self.ours if impl == "ours" else self.bare, attr)

    @property
    def ratio(self) -> float:
        bare = self.median("bare", "rate")
        return self.median("ours", "rate") / bare if bare else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def run_phase(
    op: Callable[[int], Awaitable[Any]],
    *,
    conc: int,
    duration: float,
    max_ops: int,
) -> tuple[int, float, float, list[float]]:
    """Run ``op(worker)`` from ``conc`` workers for ``duration`` s or ``max_ops`` calls.

    Returns (calls, wall seconds, CPU seconds of this process, sorted latencies).
    """
    latencies: list[float] = []
    issued = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    perf = time.perf_counter

    async def worker(w: int) -> None:
        nonlocal issued
        while issued < max_ops and loop.time() < end:
            issued += 1
            t0 = perf()
            await op(w)
            latencies.append(perf() - t0)

    gc.collect()
    cpu_started = time.process_time()
    started = perf()
    await asyncio.gather(*(worker(w) for w in range(conc)))
    elapsed = perf() - started
    cpu = time.process_time() - cpu_started
    latencies.sort()
    return len(latencies), elapsed, cpu, latencies


# --------------------------------------------------------------------------- the two clients


class Bare:
    """The baseline: generated stubs on a raw channel, nothing else."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.kv = rpc.KVStub(self.channel)
        self.compacted = 0

    async def put(self, key: bytes) -> None:
        await self.kv.Put(rpc.PutRequest(key=key, value=VALUE), timeout=TIMEOUT)

    async def cas_delete(self, key: bytes, revision: int) -> bool:
        resp = await self.kv.Txn(
            rpc.TxnRequest(
                compare=[
                    rpc.Compare(
                        key=key,
                        target=rpc.Compare.MOD,
                        result=rpc.Compare.EQUAL,
                        mod_revision=revision,
                    )
                ],
                success=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))],
            ),
            timeout=TIMEOUT,
        )
        return bool(resp.succeeded)

    async def count(self) -> int:
        resp = await self.kv.Range(
            rpc.RangeRequest(key=COUNT_PREFIX, range_end=prefix_end(COUNT_PREFIX), count_only=True),
            timeout=TIMEOUT,
        )
        return int(resp.count)

    async def prepare(self, prefix: bytes, n: int) -> list[tuple[bytes, int]]:
        """Create ``n`` keys under ``prefix``; returns (key, mod_revision) pairs."""
        keys: list[tuple[bytes, int]] = []
        for start in range(0, n, PREPARE_BATCH):
            batch = [prefix + b"%08d" % i for i in range(start, min(n, start + PREPARE_BATCH))]
            resp = await self.kv.Txn(
                rpc.TxnRequest(
                    success=[
                        rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=VALUE)) for k in batch
                    ]
                ),
                timeout=TIMEOUT,
            )
            keys.extend((k, int(resp.header.revision)) for k in batch)
        return keys

    async def compact(self) -> None:
        resp = await self.kv.Range(rpc.RangeRequest(key=b"/", count_only=True), timeout=TIMEOUT)
        revision = int(resp.header.revision)
        if revision > self.compacted:  # compacting the same revision twice is an error
            await self.kv.Compact(rpc.CompactionRequest(revision=revision), timeout=TIMEOUT)
            self.compacted = revision

    async def aclose(self) -> None:
        await self.channel.close()


class Ours:
    """The same operations through ``EtcdClient``."""

    def __init__(self, client: EtcdClient) -> None:
        self.client = client

    async def put(self, key: bytes) -> None:
        await self.client.put(key, VALUE)

    async def cas_delete(self, key: bytes, revision: int) -> bool:
        result = await self.client.txn([Cmp.mod_revision(key) == revision], [Op.delete(key)])
        return result.succeeded

    async def count(self) -> int:
        return await self.client.count(COUNT_PREFIX)


# --------------------------------------------------------------------------- phases


async def measure(
    impl: str,
    target: Ours | Bare,
    bare: Bare,
    op_name: str,
    conc: int,
    args: argparse.Namespace,
    phase_no: int,
) -> Phase:
    if op_name == "put":

        async def op(w: int) -> None:
            await target.put(b"/bench/put/%03d" % w)

        max_ops = args.max_ops
    elif op_name == "txn":
        prefix = TXN_PREFIX + b"%s/%d/" % (impl.encode(), phase_no)
        prepared = await bare.prepare(prefix, args.max_txn_ops)
        pending: Iterator[tuple[bytes, int]] = iter(prepared)
        failures = 0

        async def op(w: int) -> None:
            nonlocal failures
            key, revision = next(pending)
            if not await target.cas_delete(key, revision):
                failures += 1

        max_ops = len(prepared)
    elif op_name == "count":

        async def op(w: int) -> None:
            if await target.count() != COUNT_KEYS:
                raise AssertionError("count-only range returned the wrong count")

        max_ops = args.max_ops
    else:  # pragma: no cover - argparse restricts the choices
        raise ValueError(op_name)

    n, elapsed, cpu, latencies = await run_phase(
        op, conc=conc, duration=args.duration, max_ops=max_ops
    )
    if op_name == "txn" and failures:
        raise AssertionError(f"{failures} compare-and-delete transactions failed their compare")
    return Phase(
        op=op_name,
        conc=conc,
        impl=impl,
        ops=n,
        seconds=elapsed,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        cpu_us=cpu / n * 1e6 if n else 0.0,
    )


async def bench(endpoint: str, args: argparse.Namespace) -> tuple[list[Row], dict[str, Any]]:
    bare = Bare(endpoint)
    async with connect(endpoint) as client:
        ours = Ours(client)
        status = await client.status()
        # The count prefix, once: 1,000 keys.
        await bare.prepare(COUNT_PREFIX, COUNT_KEYS)
        # Warm both paths up (channel, stubs, code paths), outside the measurements.
        for target in (ours, bare):
            for i in range(200):
                await target.put(b"/bench/warmup/%d" % i)
                await target.count()

        rows: list[Row] = []
        phase_no = 0
        for op_name in args.ops:
            for conc in args.conc:
                row = Row(op_name, conc)
                rows.append(row)
                for repeat in range(args.repeats):
                    order: list[tuple[str, Ours | Bare]] = [("ours", ours), ("bare", bare)]
                    if repeat % 2:
                        order.reverse()
                    for impl, target in order:
                        phase_no += 1
                        phase = await measure(impl, target, bare, op_name, conc, args, phase_no)
                        (row.ours if impl == "ours" else row.bare).append(phase)
                        print(
                            f"  {op_name:<5} conc={conc:<3} {impl:<4} run {repeat + 1}: "
                            f"{phase.rate:8.0f} ops/s  p50 {phase.p50_ms:6.2f} ms  "
                            f"p99 {phase.p99_ms:6.2f} ms  cpu {phase.cpu_us:5.0f} us/op  "
                            f"({phase.ops} ops)",
                            file=sys.stderr,
                            flush=True,
                        )
                    await bare.compact()  # keep the store small between pairs

        if args.profile:
            await profile(ours, bare, args)

    await bare.aclose()
    meta = {
        "etcd_version": status.version,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "endpoint": endpoint,
        "duration": args.duration,
        "repeats": args.repeats,
        "max_ops": args.max_ops,
        "max_txn_ops": args.max_txn_ops,
    }
    return rows, meta


async def profile(ours: Ours, bare: Bare, args: argparse.Namespace) -> None:
    conc = max(args.conc)
    for op_name in args.ops:
        profiler = cProfile.Profile()
        profiler.enable()
        phase = await measure("ours", ours, bare, op_name, conc, args, 10_000)
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(25)
        print(f"\n=== cProfile: ours, {op_name}, conc={conc}, {phase.ops} ops ===")
        print(out.getvalue())


# --------------------------------------------------------------------------- report


def table(rows: list[Row]) -> str:
    side = f"{'ops/s':>7} {'p50 ms':>6} {'p99 ms':>6} {'cpu us':>6}"
    head = f"{'':<24} {'':>4} | {'ours':<28} | {'bare stubs':<28} |"
    head2 = f"{'operation':<24} {'conc':>4} | {side} | {side} | {'ratio':>5}"
    names = {
        "put": "put",
        "txn": "txn cmp(mod)+delete",
        "count": f"range count_only ({COUNT_KEYS})",
    }

    def cells(r: Row, impl: str) -> str:
        return (
            f"{r.median(impl, 'rate'):>7.0f} {r.median(impl, 'p50_ms'):>6.2f} "
            f"{r.median(impl, 'p99_ms'):>6.2f} {r.median(impl, 'cpu_us'):>6.0f}"
        )

    lines = [head, head2, "-" * len(head2)]
    for r in rows:
        lines.append(
            f"{names[r.op]:<24} {r.conc:>4} | {cells(r, 'ours')} | {cells(r, 'bare')} | "
            f"{r.ratio:>5.2f}"
        )
    lines.append("ratio = ours ops/s / bare ops/s; cpu us = client process CPU time per call")
    return "\n".join(lines)


def verdict(rows: list[Row]) -> str:
    slow = [r for r in rows if r.ratio < TARGET]
    worst = min(rows, key=lambda r: r.ratio)
    if not slow:
        return (
            f"PASS: within 15% of bare stubs in every row "
            f"(worst: {worst.op} conc={worst.conc} at {worst.ratio:.2f})"
        )
    names = ", ".join(f"{r.op} conc={r.conc} ({r.ratio:.2f})" for r in slow)
    return f"FAIL: more than 15% slower than bare stubs in {len(slow)} row(s): {names}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="host:port of an etcd to use (default: start one)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--max-ops", type=int, default=30_000, help="cap on calls per phase")
    parser.add_argument(
        "--max-txn-ops", type=int, default=10_000, help="keys prepared per txn phase (its cap)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="pairs of phases per row")
    parser.add_argument("--conc", type=int, nargs="+", default=[1, 64])
    parser.add_argument(
        "--ops", nargs="+", choices=["put", "txn", "count"], default=["put", "txn", "count"]
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--profile", action="store_true", help="cProfile our client afterwards")
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if args.endpoint:
            endpoint = args.endpoint
        else:
            from etcd_recipes.testing import EtcdServer

            server = stack.enter_context(EtcdServer())
            endpoint = server.endpoint
            print(f"started etcd at {endpoint} (data on tmpfs, --unsafe-no-fsync)", file=sys.stderr)
        started = time.monotonic()
        rows, meta = asyncio.run(bench(endpoint, args))

    meta["wall_seconds"] = round(time.monotonic() - started, 1)
    print()
    print(
        f"etcd {meta['etcd_version']}, Python {meta['python']}, grpcio {meta['grpcio']}; "
        f"medians of {args.repeats} alternating pairs, {args.duration:g} s (or "
        f"{args.max_ops} calls; txn {args.max_txn_ops}) per phase"
    )
    print(table(rows))
    print(verdict(rows))
    if args.json:
        payload = {
            "meta": meta,
            "target_ratio": TARGET,
            "verdict": verdict(rows),
            "rows": [
                {
                    "op": r.op,
                    "conc": r.conc,
                    "ratio": r.ratio,
                    "ours": {
                        "ops_per_s": r.median("ours", "rate"),
                        "p50_ms": r.median("ours", "p50_ms"),
                        "p99_ms": r.median("ours", "p99_ms"),
                        "cpu_us_per_op": r.median("ours", "cpu_us"),
                        "runs": [asdict(p) for p in r.ours],
                    },
                    "bare": {
                        "ops_per_s": r.median("bare", "rate"),
                        "p50_ms": r.median("bare", "p50_ms"),
                        "p99_ms": r.median("bare", "p99_ms"),
                        "cpu_us_per_op": r.median("bare", "cpu_us"),
                        "runs": [asdict(p) for p in r.bare],
                    },
                }
                for r in rows
            ],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
