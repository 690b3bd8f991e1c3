"""What the Prometheus and OpenTelemetry sinks cost a recipe, against the no-op sink, in one run.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/metrics_overhead.py [--rounds 30] [--cycles 100] [--items 100]
                                                    [--only mutex|queue] [--profile VARIANT]
                                                    [--endpoint HOST:PORT] [--json out.json]

Starts its own etcd (``etcd_recipes.testing.EtcdServer``: tmpfs, ``--unsafe-no-fsync``) unless
``--endpoint`` is given. Four clients are open side by side on one event loop, differing only
in their metrics sink:

* ``noop`` -- the default client (``NOOP_METRICS``: no event is queued, no thread started);
* ``prometheus`` -- ``PrometheusMetrics`` on a private ``CollectorRegistry``;
* ``otel-api`` -- ``OpenTelemetryMetrics`` on the OpenTelemetry **API**'s no-op providers
  (what an application gets with ``opentelemetry-api`` and no SDK configured): every event and
  span goes through this library's OpenTelemetry code, the instruments record nothing. This
  row is the library's own share of the ``otel`` row;
* ``otel`` -- ``OpenTelemetryMetrics`` on the OpenTelemetry **SDK** with an in-memory metric
  reader and an in-memory span exporter behind a ``SimpleSpanProcessor`` (as
  ``tests/contrib/test_otel.py`` does): every span is really built, ended and exported.

Workloads, each on its own recipe per client:

1. **mutex** -- the uncontended cycle of one ``DistributedMutex``: ``acquire()`` then
   ``release()`` (two raft writes; events: lock wait, lock hold, RPCs; span: ``lock.acquire``);
2. **queue** -- ``DistributedWorkQueue.receive()`` then ``WorkItem.ack()`` of ``--items`` items
   enqueued before the timed part (events: two queue operations, RPCs; spans:
   ``queue.receive`` and ``queue.settle``).

A *round* times ``--cycles`` mutex cycles (or ``--items`` receive+acks) with each client in
turn, **rotating which variant goes first** from round to round, so that drift (a growing
store, other processes on the machine) hits every variant alike. The timed part of a variant
ends with ``Meter.flush()``: the dispatcher thread's delivery of the events is part of the
cost (it competes for the GIL), not left to the next variant. The store is compacted and the
garbage collector run between rounds.

Reported per workload and variant: the median over rounds of the wall time per operation and
of this process's CPU time per operation (the dispatcher thread included), and the **median of
the per-round ratios** variant / noop with its interquartile range -- a ratio taken within one
round cancels most of the drift. Target: the median wall ratio under 1.03 (3 % overhead). The
SDK's own price is printed too: one ``lock.acquire`` span and one ``rpc_finished``
measurement timed in isolation on the ``otel`` sink (the mutex cycle makes one span and four
measurements). The CPU figure is the steadier one on a busy machine; the wall ratio is what
an application sees.
``--profile VARIANT`` then runs one more round of each workload for that variant under
``cProfile`` and prints the 25 functions with the most own time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from etcd_recipes import (
    DistributedMutex,
    DistributedWorkQueue,
    EtcdClient,
    EtcdMetrics,
    ResilienceConfig,
    connect,
)
from etcd_recipes._core.metering import meter_for
from etcd_recipes.contrib.otel import OpenTelemetryMetrics
from etcd_recipes.contrib.prometheus import PrometheusMetrics
from etcd_recipes.testing import EtcdServer

TARGET_RATIO = 1.03
VARIANTS = ("noop", "prometheus", "otel-api", "otel")
WORKLOADS = ("mutex", "queue")
VALUE = b"x" * 64


@dataclass
class Variant:
    """One client and its recipes; ``sink`` is ``None`` for the default (no-op) client."""

    name: str
    sink: EtcdMetrics | None
    exporter: InMemorySpanExporter | None = None
    client: EtcdClient | None = None
    mutex: DistributedMutex | None = None
    queue: DistributedWorkQueue[bytes] | None = None
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def flush(self) -> None:
        if self.sink is not None and not meter_for(self.sink).flush(30):
            raise RuntimeError(f"{self.name}: the metrics thread did not drain in 30 s")


def make_variants() -> list[Variant]:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    otel = OpenTelemetryMetrics(
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        tracer_provider=tracing,
    )
    api_only = OpenTelemetryMetrics(
        meter_provider=otel_metrics.NoOpMeterProvider(), tracer_provider=trace.NoOpTracerProvider()
    )
    return [
        Variant("noop", None),
        Variant("prometheus", PrometheusMetrics(registry=CollectorRegistry())),
        Variant("otel-api", api_only),
        Variant("otel", otel, exporter),
    ]


def sdk_price(sink: EtcdMetrics, calls: int = 3000) -> dict[str, float]:
    """Microseconds per ``lock.acquire`` span (started and ended) and per ``rpc_finished``
    measurement of ``sink`` called directly, with no recipe around it."""
    t0 = time.perf_counter()
    for _ in range(calls):
        span = sink.start_span("DistributedMutex", "", "lock.acquire", "/bench/m", {})
        if span is not None:
            span.end("acquired")
    t1 = time.perf_counter()
    for _ in range(calls):
        sink.rpc_finished("txn", 0.001, 1, "ok")
    t2 = time.perf_counter()
    return {"span_us": (t1 - t0) / calls * 1e6, "measurement_us": (t2 - t1) / calls * 1e6}


async def timed(v: Variant, n: int, op: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(wall s/op, CPU s/op) of ``n`` calls of ``op``, the sink's flush included."""
    v.flush()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        await op()
    v.flush()
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


async def mutex_round(v: Variant, cycles: int) -> tuple[float, float]:
    mutex = v.mutex
    assert mutex is not None

    async def cycle() -> None:
        await mutex.acquire()
        await mutex.release()

    return await timed(v, cycles, cycle)


async def queue_round(v: Variant, items: int) -> tuple[float, float]:
    queue = v.queue
    assert queue is not None
    for start in range(0, items, 100):  # outside the timing; at most 100 puts per transaction
        await queue.enqueue_all([VALUE] * min(100, items - start))

    async def receive_ack() -> None:
        item = await queue.receive(timeout=10)
        if item is None or not await item.ack():
            raise RuntimeError(f"{v.name}: receive+ack failed ({item!r})")

    return await timed(v, items, receive_ack)


async def one_round(v: Variant, workload: str, args: argparse.Namespace) -> tuple[float, float]:
    if workload == "mutex":
        return await mutex_round(v, args.cycles)
    return await queue_round(v, args.items)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


async def run(endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    variants = make_variants()
    workloads = [args.only] if args.only else list(WORKLOADS)
    async with contextlib.AsyncExitStack() as stack:
        for v in variants:
            resilience = ResilienceConfig() if v.sink is None else ResilienceConfig(metrics=v.sink)
            v.client = await stack.enter_async_context(connect(endpoint, resilience=resilience))
            # Not ``async with``: entering a mutex acquires it, and the cycle must start free.
            v.mutex = DistributedMutex(v.client, f"/bench/metrics/{v.name}/lock")
            stack.push_async_callback(v.mutex.aclose)
            v.queue = await stack.enter_async_context(
                DistributedWorkQueue(v.client, f"/bench/metrics/{v.name}/queue")
            )
            v.samples = {w: [] for w in workloads}
        admin = variants[0].client
        assert admin is not None
        for v in variants:  # warm-up: connections, leases, the metrics threads, JIT-free caches
            for w in workloads:
                await one_round(v, w, argparse.Namespace(cycles=20, items=20))
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for w in workloads:
                for v in order:
                    v.samples[w].append(await one_round(v, w, args))
                    if v.exporter is not None:
                        v.exporter.clear()
            await admin.compact((await admin.put("/bench/metrics/mark", b"")).revision)
            line = "  ".join(
                f"{w}:{v.name}={v.samples[w][-1][0] * 1e3:.3f}ms"
                for w in workloads
                for v in variants
            )
            print(f"round {r + 1}/{args.rounds}: {line}", file=sys.stderr, flush=True)
        if args.profile:
            (chosen,) = [v for v in variants if v.name == args.profile]
            profiler = cProfile.Profile()
            profiler.enable()
            for w in workloads:
                await one_round(chosen, w, args)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    result = summarize(variants, workloads, args)
    (otel,) = [v for v in variants if v.name == "otel"]
    assert otel.sink is not None
    assert otel.exporter is not None
    result["otel_sdk_price"] = sdk_price(otel.sink)
    otel.exporter.clear()
    return result


def summarize(
    variants: list[Variant], workloads: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    base = variants[0]
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "rounds": args.rounds,
        "cycles": args.cycles,
        "items": args.items,
        "target_ratio": TARGET_RATIO,
        "workloads": {},
    }
    over: list[str] = []
    for w in workloads:
        rows: dict[str, Any] = {}
        for v in variants:
            wall = [s[0] for s in v.samples[w]]
            cpu = [s[1] for s in v.samples[w]]
            ratios = [s[0] / b[0] for s, b in zip(v.samples[w], base.samples[w], strict=True)]
            cpu_ratios = [s[1] / b[1] for s, b in zip(v.samples[w], base.samples[w], strict=True)]
            rows[v.name] = {
                "wall_us": statistics.median(wall) * 1e6,
                "cpu_us": statistics.median(cpu) * 1e6,
                "ratio_quartiles": quartiles(ratios),
                "cpu_ratio_quartiles": quartiles(cpu_ratios),
                "samples": v.samples[w],
            }
            if v is not base and quartiles(ratios)[1] >= TARGET_RATIO:
                over.append(f"{w}/{v.name}")
        result["workloads"][w] = rows
    result["verdict"] = "OK" if not over else "OVER TARGET: " + ", ".join(over)
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"medians of {result['rounds']} rounds ({result['cycles']} mutex cycles, "
        f"{result['items']} receive+acks per variant and round); ratio = variant / noop "
        "within a round, median [interquartile range]"
    )
    print(
        f"{'workload':<8} {'sink':<11} {'wall/op':>10} {'CPU/op':>9}  {'wall ratio':<22} CPU ratio"
    )
    for w, rows in result["workloads"].items():
        for name, row in rows.items():
            q1, q2, q3 = row["ratio_quartiles"]
            c1, c2, c3 = row["cpu_ratio_quartiles"]
            print(
                f"{w:<8} {name:<11} {row['wall_us']:8.0f}us {row['cpu_us']:7.0f}us  "
                f"{q2:.3f} [{q1:.3f}-{q3:.3f}]  {c2:.3f} [{c1:.3f}-{c3:.3f}]"
            )
    price = result["otel_sdk_price"]
    print(
        f"OpenTelemetry SDK alone (in-memory reader and exporter): {price['span_us']:.1f} us per "
        f"span, {price['measurement_us']:.1f} us per measurement"
    )
    print(f"target: median wall ratio < {result['target_ratio']:.2f} -> {result['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cycles", type=int, default=100, help="mutex cycles per round")
    parser.add_argument("--items", type=int, default=100, help="receive+acks per round")
    parser.add_argument("--only", choices=WORKLOADS)
    parser.add_argument("--profile", choices=VARIANTS)
    parser.add_argument("--endpoint")
    parser.add_argument("--json", help="write every sample, the medians and the verdict here")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        result = asyncio.run(run(endpoint, args))
    report(result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
