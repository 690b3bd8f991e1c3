"""contrib.otel: the instruments and spans the sink makes (SDK in-memory reader and exporter),
and, against a real etcd, a long watch-heavy run with a lease kept alive that leaves no span
open (a SpanProcessor counts every start and end)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from etcd_recipes import (
    DistributedMutex,
    DistributedWorkQueue,
    InvalidArgumentError,
    PrefixCache,
    ResilienceConfig,
    connect,
)
from etcd_recipes._core.metering import meter_for
from etcd_recipes.contrib.otel import OpenTelemetryMetrics
from tests.helpers import eventually


class Counting(SpanProcessor):
    """Counts spans started and ended (what an exporter would see as leaks)."""

    def __init__(self) -> None:
        self.started = 0
        self.ended = 0
        self.names: list[str] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1
        self.names.append(span.name)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


class Rig:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.exporter = InMemorySpanExporter()
        self.counting = Counting()
        self.tracing = TracerProvider()
        self.tracing.add_span_processor(self.counting)
        self.tracing.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.sink = OpenTelemetryMetrics(
            meter_provider=MeterProvider(metric_readers=[self.reader]),
            tracer_provider=self.tracing,
        )

    def points(self) -> dict[tuple[str, frozenset[tuple[str, Any]]], Any]:
        data = self.reader.get_metrics_data()
        found: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
        if data is None:
            return found
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "etcd_recipes"
                for metric in sm.metrics:
                    for point in metric.data.data_points:
                        found[metric.name, frozenset(point.attributes.items())] = point
        return found

    def units(self) -> dict[str, str]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            m.name: m.unit
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }


def _key(metric: str, **attrs: Any) -> tuple[str, frozenset[tuple[str, Any]]]:
    return metric, frozenset(attrs.items())


def test_every_event_lands_in_its_instrument() -> None:
    rig = Rig()
    s = rig.sink
    s.rpc_finished("put", 0.002, 3, "ok")
    s.record_rpc("txn", 0.5, 1, True)
    s.increment_watch_recovery("suspended", b"/secret/key")
    s.increment_keep_alive("renewal", 7587861231234567)
    s.lease_lost("DistributedMutex", "orders", "expired")
    s.lock_wait_finished("DistributedMutex", "orders", 0.01, "acquired")
    s.lock_hold_finished("DistributedMutex", "orders", 90.0, "released")
    s.leadership_changed("LeaderSelector", "jobs", "acquired")
    s.leadership_changed("LeaderSelector", "jobs", "relinquished")
    s.leadership_changed("LeaderLatch", "", "acquired")
    s.barrier_wait_finished("DistributedBarrier", "", 1.0, "passed")
    s.queue_operation("DistributedWorkQueue", "emails", "receive", 3.0, "ok")
    s.queue_redelivered("DistributedWorkQueue", "emails", 2)
    s.cache_synced("PrefixCache", "users", "initial", 0.2, 10)
    s.cache_size_changed("PrefixCache", "users", 10)
    s.cache_size_changed("PrefixCache", "users", -4)
    s.shared_value_written("SharedCount", "workers", "set", "ok")
    s.record_latency("queue.dequeue", 0.3)
    p = rig.points()

    rpc = p[_key("etcd_recipes.rpc.duration", operation="put", outcome="ok")]
    assert (rpc.count, rpc.sum) == (1, 0.002)
    assert rpc.explicit_bounds[0] == 0.001 and rpc.explicit_bounds[-1] == 5.0
    assert p[_key("etcd_recipes.rpc.duration", operation="txn", outcome="error")].count == 1
    assert p[_key("etcd_recipes.rpc.retries", operation="put")].value == 2
    assert p[_key("etcd_recipes.watch.recoveries", kind="suspended")].value == 1
    assert p[_key("etcd_recipes.keepalive.events", kind="renewal")].value == 1
    labels = {"recipe": "DistributedMutex", "name": "orders"}
    assert p[_key("etcd_recipes.lease.lost", **labels, kind="expired")].value == 1
    wait = p[_key("etcd_recipes.lock.wait.duration", **labels, outcome="acquired")]
    assert wait.count == 1 and wait.explicit_bounds[-1] == 600.0
    assert p[_key("etcd_recipes.lock.hold.duration", **labels, ended="released")].sum == 90.0
    jobs = {"recipe": "LeaderSelector", "name": "jobs"}
    assert p[_key("etcd_recipes.leadership.transitions", **jobs, transition="acquired")].value == 1
    assert p[_key("etcd_recipes.leader", **jobs)].value == 0
    assert p[_key("etcd_recipes.leader", recipe="LeaderLatch", name="")].value == 1
    barrier = {"recipe": "DistributedBarrier", "name": "", "outcome": "passed"}
    assert p[_key("etcd_recipes.barrier.wait.duration", **barrier)].count == 1
    emails = {"recipe": "DistributedWorkQueue", "name": "emails"}
    op = _key("etcd_recipes.queue.operation.duration", **emails, operation="receive", outcome="ok")
    assert p[op].sum == 3.0
    assert p[_key("etcd_recipes.queue.redeliveries", **emails)].value == 2
    users = {"recipe": "PrefixCache", "name": "users"}
    assert p[_key("etcd_recipes.cache.sync.duration", **users, kind="initial")].count == 1
    assert p[_key("etcd_recipes.cache.entries", **users)].value == 6
    workers = {"recipe": "SharedCount", "name": "workers", "operation": "set", "outcome": "ok"}
    assert p[_key("etcd_recipes.shared_value.writes", **workers)].value == 1
    assert p[_key("etcd_recipes.recipe.latency", name="queue.dequeue")].count == 1
    # Keys and lease ids are never attributes.
    values = {v for _, attrs in p for _, v in attrs}
    assert not any("/secret" in str(v) or "7587861231234567" in str(v) for v in values)
    units = rig.units()
    assert units["etcd_recipes.rpc.duration"] == "s"
    assert all(u == "s" for n, u in units.items() if n.endswith((".duration", ".latency")))
    assert rig.counting.started == 0  # events make no spans


@pytest.mark.parametrize(
    ("operation", "kind"),
    [
        ("lock.acquire", SpanKind.INTERNAL),
        ("election.campaign", SpanKind.INTERNAL),
        ("barrier.wait", SpanKind.INTERNAL),
        ("queue.enqueue", SpanKind.PRODUCER),
        ("queue.receive", SpanKind.CONSUMER),
        ("queue.settle", SpanKind.INTERNAL),
    ],
)
def test_a_bounded_operation_gets_a_span_of_its_kind(operation: str, kind: SpanKind) -> None:
    rig = Rig()
    span = rig.sink.start_span("R", "n", operation, "/app/x", {"timeout": 2.5, "count": 3})
    assert span is not None
    span.end("ok")
    (done,) = rig.exporter.get_finished_spans()
    assert (done.name, done.kind) == (operation, kind)
    assert dict(done.attributes or {}) == {
        "etcd_recipes.recipe": "R",
        "etcd_recipes.name": "n",
        "etcd_recipes.path": "/app/x",
        "etcd_recipes.timeout": 2.5,
        "etcd_recipes.count": 3,
        "etcd_recipes.outcome": "ok",
    }
    assert done.status.status_code is StatusCode.UNSET


def test_error_outcomes_set_status_error_and_a_cancellation_does_not() -> None:
    rig = Rig()
    for outcome, error in [
        ("timeout", None),
        ("lost", None),
        ("error", RuntimeError("boom")),
        ("cancelled", asyncio.CancelledError()),
        ("acquired", None),
    ]:
        span = rig.sink.start_span("DistributedMutex", "", "lock.acquire", "/l", {})
        assert span is not None
        span.end(outcome, error)
    spans = {s.attributes["etcd_recipes.outcome"]: s for s in rig.exporter.get_finished_spans()}
    assert spans["timeout"].status.status_code is StatusCode.ERROR
    assert spans["lost"].status.status_code is StatusCode.ERROR
    assert spans["error"].status.status_code is StatusCode.ERROR
    assert [e.name for e in spans["error"].events] == ["exception"]
    assert spans["cancelled"].status.status_code is StatusCode.UNSET
    assert spans["cancelled"].events == ()
    assert spans["acquired"].status.status_code is StatusCode.UNSET
    assert rig.counting.started == rig.counting.ended == 5


def test_a_span_has_the_callers_parent_and_is_not_made_current() -> None:
    rig = Rig()
    tracer = rig.tracing.get_tracer("app")
    with tracer.start_as_current_span("request") as parent:
        span = rig.sink.start_span("DistributedMutex", "", "lock.acquire", "/l", {})
        assert trace.get_current_span() is parent
        assert span is not None
        span.end("acquired")
    lock = next(s for s in rig.exporter.get_finished_spans() if s.name == "lock.acquire")
    assert lock.parent is not None and lock.parent.span_id == parent.get_span_context().span_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing of ours left attached


@pytest.mark.parametrize(
    "operation", ["watch", "watch.stream", "lease.keep_alive", "keep_alive", ""]
)
def test_streams_and_unknown_operations_get_no_span(operation: str) -> None:
    rig = Rig()
    assert rig.sink.start_span("Watch", "", operation, "/w", {}) is None
    assert rig.counting.started == 0


def test_bad_providers_are_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="meter_provider"):
        OpenTelemetryMetrics(meter_provider=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="tracer_provider"):
        OpenTelemetryMetrics(tracer_provider="global")  # type: ignore[arg-type]


async def test_a_long_watch_heavy_run_leaves_no_span_open(etcd_server, etcd_prefix) -> None:
    rig = Rig()
    resilience = ResilienceConfig(metrics=rig.sink)
    puts = 1500
    async with connect(**etcd_server.client_kwargs(), resilience=resilience) as client:
        watched = etcd_prefix + "w/"
        anchor = (await client.put(etcd_prefix + "start", b"")).revision + 1
        seen = 0

        async def consume() -> None:
            nonlocal seen
            async for _ in stream:
                seen += 1
                if seen == puts:
                    return

        async with (
            client.watch(watched, prefix=True, start_revision=anchor) as stream,
            client.lease(ttl=2) as lease,
            PrefixCache(client, watched) as cache,
            DistributedWorkQueue(client, etcd_prefix + "jobs") as queue,
        ):
            consumer = asyncio.create_task(consume())
            for i in range(puts):
                await client.put(f"{watched}{i % 100}", str(i), lease=lease.id)
                if i % 300 == 0:
                    async with DistributedMutex(client, etcd_prefix + f"lock{i}") as mutex:
                        assert await mutex.acquire(timeout=5)
                        await mutex.release()
                    await queue.enqueue(b"job")
                    item = await queue.receive(timeout=5)
                    assert item is not None
                    assert await item.ack()
            await asyncio.wait_for(consumer, 30)
            assert len(cache) == 100
            # Keep the lease alive through several renewals while the watches stay open.
            renewals = _key("etcd_recipes.keepalive.events", kind="renewal")

            def renewed() -> bool:
                assert meter_for(rig.sink).flush(5)
                point = rig.points().get(renewals)
                return point is not None and point.value >= 3

            await eventually(renewed, timeout=20, what="three keep-alive renewals")
            assert not lease.is_lost
    assert meter_for(rig.sink).flush(10)
    p = rig.points()
    assert p[_key("etcd_recipes.rpc.duration", operation="put", outcome="ok")].count >= puts
    # The spans of the bounded operations (start_span, called by the mutex and the queue):
    assert {"lock.acquire", "queue.enqueue", "queue.receive"} <= set(rig.counting.names)
    # ... and nothing the sink started is still open: no span for the watches or the lease.
    assert rig.counting.started == rig.counting.ended
    assert not any(n.startswith(("watch", "lease", "keep")) for n in rig.counting.names)
