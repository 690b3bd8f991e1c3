"""A ready-made OpenTelemetry sink: metrics and spans (extra ``otel``: opentelemetry-api).

:class:`OpenTelemetryMetrics` records every :class:`~etcd_recipes.EtcdMetrics` event in
OpenTelemetry instruments named ``etcd_recipes.*`` (dotted, unit ``s`` for durations: the
same families as :mod:`etcd_recipes.contrib.prometheus`), and answers
:meth:`~etcd_recipes.EtcdMetrics.start_span` with a real span for each bounded operation.
It uses only the OpenTelemetry *API*; the SDK (providers, readers, exporters) is yours to set
up, globally or by passing the providers.

Guaranteed:

* attributes are the fixed vocabularies of :class:`~etcd_recipes.EtcdMetrics` plus
  ``recipe`` and ``name``; **keys, paths and lease ids are never metric attributes** (a
  recipe's path is a *span* attribute, ``etcd_recipes.path``);
* spans only for the bounded operations the library names (``lock.*``, ``semaphore.*``,
  ``election.*``, ``barrier.*``, ``queue.*``): anything else, notably a watch or keep-alive
  stream, gets no span, so nothing this sink starts stays open for a stream's lifetime;
* a span starts in the caller's context (its parent is the caller's current span), is not
  made current (nothing is attached to a context the library would have to detach), and
  ends exactly once, with status ERROR on an error outcome.

Trace context travels with work items only when asked: a
:class:`~etcd_recipes.DistributedWorkQueue` given ``trace_propagation=TraceContextPropagation()``
stores the W3C ``traceparent``/``tracestate`` of its ``queue.enqueue`` span beside each item,
and a consumer queue given one too **links** its ``queue.receive`` and ``queue.settle`` spans
to it (a link, not a parent, as the messaging conventions advise). Off by default: the keys a
queue writes are then exactly the JVM library's.

Not guaranteed: events the library dropped (a full sink queue) are not recorded; a context
from a producer without propagation, or one that does not parse, links nothing.

Example::

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from etcd_recipes.contrib.otel import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    sink = OpenTelemetryMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    sink.rpc_finished("put", 0.002, 1, "ok")
    (scope,) = reader.get_metrics_data().resource_metrics[0].scope_metrics
    print([m.name for m in scope.metrics])  # ['etcd_recipes.rpc.duration']
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "etcd_recipes.contrib.otel needs opentelemetry-api: pip install 'etcd-recipes[otel]'"
    ) from exc

from .. import EtcdMetrics, InvalidArgumentError, MetricsSpan, WorkItem

__all__ = ["ERROR_OUTCOMES", "SPAN_OPERATIONS", "OpenTelemetryMetrics", "TraceContextPropagation"]

SCOPE = "etcd_recipes"
try:
    _VERSION: str | None = importlib.metadata.version("etcd-recipes")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
    _VERSION = None

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
DURATION_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0, 120.0, 600.0)

SPAN_OPERATIONS = frozenset({"lock", "semaphore", "election", "barrier", "queue"})
"""The operation families (the part before the first dot) that get a span; others get none."""

ERROR_OUTCOMES = frozenset({"error", "lost", "timeout", "stale"})
"""Outcomes that end a span with status ERROR (as does an error that is not a cancellation)."""

_KINDS = {"queue.enqueue": SpanKind.PRODUCER, "queue.receive": SpanKind.CONSUMER}


def _attribute(value: object) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Sequence) and all(isinstance(v, (str, bool, int, float)) for v in value):
        return list(value)
    return str(value)


class _OtelSpan(MetricsSpan):
    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        span = self.span
        if not span.is_recording():
            span.end()  # ended already, or a non-recording span: ending it is harmless
            return
        span.set_attribute("etcd_recipes.outcome", outcome)
        cancelled = isinstance(error, asyncio.CancelledError)
        if error is not None and not cancelled:
            span.record_exception(error)
        if outcome in ERROR_OUTCOMES or (error is not None and not cancelled):
            reason = type(error).__name__ if error is not None else outcome
            span.set_status(Status(StatusCode.ERROR, reason))
        span.end()


class OpenTelemetryMetrics(EtcdMetrics):
    """A metrics sink that records the library's events in OpenTelemetry instruments and spans.

    :param meter_provider: where the instruments come from (default: the global provider,
        ``opentelemetry.metrics.get_meter_provider()``).
    :param tracer_provider: where the spans come from (default: the global provider).

    The instruments (attributes in brackets; histogram bucket advice as in the Prometheus
    sink: 1 ms to 5 s for RPCs, 1 ms to 10 min for the rest):

    * ``etcd_recipes.rpc.duration`` (histogram, s) [operation, outcome];
      ``etcd_recipes.rpc.retries`` (counter) [operation]
    * ``etcd_recipes.watch.recoveries`` [kind]; ``etcd_recipes.keepalive.events`` [kind]
    * ``etcd_recipes.lease.lost`` [recipe, name, kind]
    * ``etcd_recipes.lock.wait.duration`` (s) [recipe, name, outcome];
      ``etcd_recipes.lock.hold.duration`` (s) [recipe, name, ended]
    * ``etcd_recipes.leadership.transitions`` [recipe, name, transition];
      ``etcd_recipes.leader`` (up-down counter: 1 while leading) [recipe, name]
    * ``etcd_recipes.partition.transitions`` [recipe, name, transition];
      ``etcd_recipes.partition.items`` (up-down counter: items owned now) [recipe, name]
    * ``etcd_recipes.barrier.wait.duration`` (s) [recipe, name, outcome]
    * ``etcd_recipes.queue.operation.duration`` (s) [recipe, name, operation, outcome];
      ``etcd_recipes.queue.redeliveries`` [recipe, name]
    * ``etcd_recipes.cache.sync.duration`` (s) [recipe, name, kind];
      ``etcd_recipes.cache.entries`` (up-down counter) [recipe, name]
    * ``etcd_recipes.recipe.latency`` (s) [name] (the v1 ``record_latency``)

    Spans are named after the operation (``lock.acquire``, ``queue.receive``...), kind
    PRODUCER for ``queue.enqueue``, CONSUMER for ``queue.receive`` and INTERNAL otherwise,
    with the attributes ``etcd_recipes.recipe``, ``etcd_recipes.name``, ``etcd_recipes.path``,
    ``etcd_recipes.outcome`` and each attribute the library passes as ``etcd_recipes.<key>``
    (the messaging conventions' ``messaging.*`` keep their names).

    Example::

        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from etcd_recipes.contrib.otel import OpenTelemetryMetrics

        exporter = InMemorySpanExporter()
        tracing = TracerProvider()
        tracing.add_span_processor(SimpleSpanProcessor(exporter))
        sink = OpenTelemetryMetrics(tracer_provider=tracing)
        span = sink.start_span("DistributedMutex", "", "lock.acquire", "/locks/a", {})
        span.end("timeout")
        (done,) = exporter.get_finished_spans()
        print(done.name, done.status.status_code.name)  # lock.acquire ERROR

    Events are delivered inline (:attr:`~etcd_recipes.EtcdMetrics.deliver_inline`): a
    measurement only updates the SDK's in-memory aggregation (exporting happens in the metric
    reader's own thread), which is cheaper than handing it to a thread.
    """

    deliver_inline = True

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        if meter_provider is not None and not isinstance(meter_provider, metrics.MeterProvider):
            raise InvalidArgumentError(
                f"meter_provider must be a MeterProvider: {meter_provider!r}"
            )
        if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
            raise InvalidArgumentError(
                f"tracer_provider must be a TracerProvider: {tracer_provider!r}"
            )
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meter = meters.get_meter(SCOPE, _VERSION)
        self._tracer = tracers.get_tracer(SCOPE, _VERSION)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> metrics.Histogram:
            try:
                return meter.create_histogram(
                    name, unit="s", description=doc, explicit_bucket_boundaries_advisory=buckets
                )
            except TypeError:  # pragma: no cover - opentelemetry-api < 1.26 has no advice
                return meter.create_histogram(name, unit="s", description=doc)

        long = DURATION_BUCKETS
        p = "etcd_recipes."
        self._rpc = histogram(p + "rpc.duration", "Unary etcd RPCs, all attempts.", RPC_BUCKETS)
        self._retries = meter.create_counter(p + "rpc.retries", "{retry}", "Retried attempts.")
        self._watch = meter.create_counter(p + "watch.recoveries", "{event}", "Watch recoveries.")
        self._keepalive = meter.create_counter(p + "keepalive.events", "{event}", "Lease events.")
        self._lease_lost = meter.create_counter(p + "lease.lost", "{lease}", "Leases lost.")
        self._lock_wait = histogram(p + "lock.wait.duration", "Lock acquisitions.", long)
        self._lock_hold = histogram(p + "lock.hold.duration", "Lock holds.", long)
        self._transitions = meter.create_counter(
            p + "leadership.transitions", "{transition}", "Changes of a candidate's role."
        )
        self._leader = meter.create_up_down_counter(
            p + "leader", "{candidate}", "Candidates of this process that lead now."
        )
        self._partition = meter.create_counter(
            p + "partition.transitions", "{transition}", "Items a partitioner took or gave up."
        )
        self._partition_items = meter.create_up_down_counter(
            p + "partition.items", "{item}", "Items a partitioner of this process owns now."
        )
        self._barrier = histogram(p + "barrier.wait.duration", "Barrier waits.", long)
        self._queue = histogram(p + "queue.operation.duration", "Queue operations.", long)
        self._redeliveries = meter.create_counter(
            p + "queue.redeliveries", "{item}", "Work items whose claim expired."
        )
        self._cache_sync = histogram(p + "cache.sync.duration", "Full loads of a cache.", long)
        self._cache_entries = meter.create_up_down_counter(
            p + "cache.entries", "{entry}", "Entries held by caches."
        )
        self._shared_writes = meter.create_counter(
            p + "shared_value.writes", "{write}", "Writes of shared values."
        )
        self._latency = histogram(p + "recipe.latency", "The v1 recipe latencies.", long)

    def __repr__(self) -> str:
        return "<OpenTelemetryMetrics>"

    # -- v1 -----------------------------------------------------------------------------------

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        """The v1 RPC event, recorded as :meth:`rpc_finished` with outcome ``ok``/``error``."""
        self.rpc_finished(op, duration, attempts, "error" if failed else "ok")

    def increment_watch_recovery(self, kind: str, key: bytes) -> None:
        """Adds 1 to ``etcd_recipes.watch.recoveries`` (``key`` is not an attribute)."""
        self._watch.add(1, {"kind": kind})

    def increment_keep_alive(self, kind: str, lease_id: int) -> None:
        """Adds 1 to ``etcd_recipes.keepalive.events`` (``lease_id`` is not an attribute)."""
        self._keepalive.add(1, {"kind": kind})

    def record_latency(self, name: str, seconds: float) -> None:
        """Records ``etcd_recipes.recipe.latency``."""
        self._latency.record(seconds, {"name": name})

    # -- v2 -----------------------------------------------------------------------------------

    def rpc_finished(self, operation: str, duration: float, attempts: int, outcome: str) -> None:
        """Records ``etcd_recipes.rpc.duration`` and adds ``attempts - 1`` retries."""
        self._rpc.record(duration, {"operation": operation, "outcome": outcome})
        if attempts > 1:
            self._retries.add(attempts - 1, {"operation": operation})

    def lease_lost(self, recipe: str, name: str, kind: str) -> None:
        """Adds 1 to ``etcd_recipes.lease.lost``."""
        self._lease_lost.add(1, {"recipe": recipe, "name": name, "kind": kind})

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """Records ``etcd_recipes.lock.wait.duration``."""
        self._lock_wait.record(duration, {"recipe": recipe, "name": name, "outcome": outcome})

    def lock_hold_finished(self, recipe: str, name: str, duration: float, ended: str) -> None:
        """Records ``etcd_recipes.lock.hold.duration``."""
        self._lock_hold.record(duration, {"recipe": recipe, "name": name, "ended": ended})

    def partition_changed(self, recipe: str, name: str, transition: str) -> None:
        """Counts the transition and moves ``etcd_recipes.partition.items`` (+1 assigned, -1
        released or lost)."""
        self._partition.add(1, {"recipe": recipe, "name": name, "transition": transition})
        if transition == "assigned":
            self._partition_items.add(1, {"recipe": recipe, "name": name})
        elif transition in ("released", "lost"):
            self._partition_items.add(-1, {"recipe": recipe, "name": name})

    def leadership_changed(self, recipe: str, name: str, transition: str) -> None:
        """Counts the transition and moves ``etcd_recipes.leader`` (+1 acquired, -1 after)."""
        self._transitions.add(1, {"recipe": recipe, "name": name, "transition": transition})
        if transition == "acquired":
            self._leader.add(1, {"recipe": recipe, "name": name})
        elif transition in ("relinquished", "lost"):
            self._leader.add(-1, {"recipe": recipe, "name": name})

    def barrier_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """Records ``etcd_recipes.barrier.wait.duration``."""
        self._barrier.record(duration, {"recipe": recipe, "name": name, "outcome": outcome})

    def queue_operation(
        self, recipe: str, name: str, operation: str, duration: float, outcome: str
    ) -> None:
        """Records ``etcd_recipes.queue.operation.duration``."""
        attrs = {"recipe": recipe, "name": name, "operation": operation, "outcome": outcome}
        self._queue.record(duration, attrs)

    def queue_redelivered(self, recipe: str, name: str, count: int) -> None:
        """Adds ``count`` to ``etcd_recipes.queue.redeliveries``."""
        self._redeliveries.add(count, {"recipe": recipe, "name": name})

    def cache_synced(self, recipe: str, name: str, kind: str, duration: float, size: int) -> None:
        """Records ``etcd_recipes.cache.sync.duration``."""
        self._cache_sync.record(duration, {"recipe": recipe, "name": name, "kind": kind})

    def cache_size_changed(self, recipe: str, name: str, delta: int) -> None:
        """Adds ``delta`` to ``etcd_recipes.cache.entries``."""
        self._cache_entries.add(delta, {"recipe": recipe, "name": name})

    def shared_value_written(self, recipe: str, name: str, operation: str, outcome: str) -> None:
        """Adds 1 to ``etcd_recipes.shared_value.writes``."""
        attrs = {"recipe": recipe, "name": name, "operation": operation, "outcome": outcome}
        self._shared_writes.add(1, attrs)

    def start_span(
        self, recipe: str, name: str, operation: str, path: str, attributes: Mapping[str, object]
    ) -> MetricsSpan | None:
        """A span for a bounded operation (see the class docstring); ``None`` for any other."""
        if operation.partition(".")[0] not in SPAN_OPERATIONS:
            return None
        attrs: dict[str, Any] = {
            "etcd_recipes.recipe": recipe,
            "etcd_recipes.name": name,
            "etcd_recipes.path": path,
        }
        for key, value in attributes.items():
            if value is not None:  # OpenTelemetry's own conventions keep their names
                name = key if key.startswith("messaging.") else f"etcd_recipes.{key}"
                attrs[name] = _attribute(value)
        kind = _KINDS.get(operation, SpanKind.INTERNAL)
        return _OtelSpan(self._tracer.start_span(operation, kind=kind, attributes=attrs))


_W3C = TraceContextTextMapPropagator()
_FIELDS = ("traceparent", "tracestate")


class TraceContextPropagation:
    """W3C trace context through work items: pass it as a work queue's ``trace_propagation``.

    On enqueue it stores ``{"traceparent": ..., "tracestate": ...}`` (compact JSON) of the
    ``queue.enqueue`` span -- or, when the queue's sink makes no spans, of the caller's
    current span -- under ``<queue>/trace/<id>``, in the enqueue's transaction; ``ack()`` and
    purging a dead letter delete it with the item (a requeue or a dead letter keeps it). A
    consumer queue with propagation adds a link to that context to its ``queue.receive`` and
    ``queue.settle`` spans, and :meth:`extract` gives the producer's context to a handler that
    wants its own span as a child (or linked).

    Guaranteed: nothing is stored when there is no valid current span; a stored context that
    is not JSON, has no valid ``traceparent`` or is too large links nothing and never fails
    a receive. Not guaranteed: JVM consumers know nothing of ``trace/``: turn it on only when
    every consumer of the queue is this library (an item a JVM consumer acks leaves its
    context behind).

    Example::

        from opentelemetry.sdk.trace import TracerProvider
        from etcd_recipes import DistributedWorkQueue
        from etcd_recipes.contrib.otel import TraceContextPropagation

        tracer = TracerProvider().get_tracer("shop")
        propagation = TraceContextPropagation()
        async with DistributedWorkQueue(
            client, f"{prefix}/jobs", trace_propagation=propagation
        ) as queue:
            with tracer.start_as_current_span("checkout") as checkout:
                await queue.enqueue(b"ship-order-7")
            item = await queue.receive()
            with tracer.start_as_current_span("ship", context=propagation.extract(item)) as ship:
                assert ship.parent.trace_id == checkout.get_span_context().trace_id
            await item.ack()
    """

    def __repr__(self) -> str:
        return "<TraceContextPropagation W3C>"

    def inject(self, span: MetricsSpan | None) -> bytes | None:
        """The context to store for ``span`` (this sink's span) or the current span; ``None``
        when there is no valid one."""
        context = trace.set_span_in_context(span.span) if isinstance(span, _OtelSpan) else None
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=context)
        if "traceparent" not in carrier:
            return None
        fields = {k: carrier[k] for k in _FIELDS if carrier.get(k)}
        return json.dumps(fields, separators=(",", ":")).encode()

    def span_context(self, stored: bytes | None) -> SpanContext | None:
        """The producer's span context in ``stored`` bytes (``None``: absent or invalid)."""
        if not stored:
            return None
        try:
            fields = json.loads(stored)
        except ValueError:
            return None
        if not isinstance(fields, dict):
            return None
        carrier = {k: v for k, v in fields.items() if k in _FIELDS and isinstance(v, str)}
        found = trace.get_current_span(_W3C.extract(carrier, context=Context()))
        context = found.get_span_context()
        return context if context.is_valid else None

    def extract(self, item: WorkItem[Any] | bytes | None) -> Context:
        """A context whose current span is the producer's (a parent for a handler's span:
        ``tracer.start_as_current_span("handle", context=propagation.extract(item))``), or
        an empty context when ``item`` carries none (a new trace)."""
        stored = item.trace_context if isinstance(item, WorkItem) else item
        context = self.span_context(stored)
        if context is None:
            return Context()
        return trace.set_span_in_context(trace.NonRecordingSpan(context), Context())

    def link(self, span: MetricsSpan, context: bytes) -> None:
        """Add a link to the producer's context to this sink's consumer ``span``."""
        producer = self.span_context(context)
        if producer is not None and isinstance(span, _OtelSpan):
            span.span.add_link(producer, {"messaging.operation.type": "send"})
