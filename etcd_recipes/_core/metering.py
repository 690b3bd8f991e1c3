"""How the library hands events to a metrics sink without a sink ever breaking or stalling it.

One :class:`Meter` per sink object (:func:`meter_for`), shared by every client, recipe and
thread that reports to it. Events (every :class:`~etcd_recipes.EtcdMetrics` method except
``start_span``) are put on a queue and delivered, in order, by **one daemon thread per sink**,
in batches: the first event after a quiet spell is delivered at once, later ones at most one
batch per :data:`LINGER_SECONDS`, so a busy recipe costs one thread wake-up per batch, not one
per event (an event reaches the sink at most about that much later; :meth:`Meter.flush`
does not wait):

* a sink method that raises is counted (``errors``) and logged once per method at WARNING;
  the recipe never sees it;
* the thread ends after :data:`IDLE_SECONDS` with nothing to deliver and the next event
  starts a new one, so a sink that is no longer used (a test's, a closed app's) leaves no
  thread behind;
* a sink method that blocks stalls only that thread; while it is stuck, events queue up to
  :data:`MAX_PENDING` and then are dropped and counted (``dropped``), never waited for;
* events whose method the sink does not override are skipped before they are queued, so the
  default no-op sink costs one attribute check per event and starts no thread;
* a sink that sets :attr:`~etcd_recipes.EtcdMetrics.deliver_inline` (the Prometheus and
  OpenTelemetry sinks: in-memory aggregates, a microsecond or so per event) is called right
  away in the reporting thread, with no queue and no thread: the hand-over to a thread costs
  tens of microseconds, far more than such a sink's work. What it raises is counted and
  ignored as above; an inline call slower than :data:`SLOW_SPAN_SECONDS` is counted
  (``slow_events``) and moves the sink to the queue and thread for good.

Spans are different: :meth:`Meter.start_span` is called **inline**, in the caller's context,
because tracing APIs read the current context (OpenTelemetry's parent span). A ``start_span``
or ``end`` that raises is counted and ignored; one that takes longer than
:data:`SLOW_SPAN_SECONDS` is counted (``slow_spans``) and spans are switched off for that
sink, so a blocking tracer costs a recipe one slow call, not one per operation.

What it does **not** do: it does not make events durable (the queue lives in memory and a
daemon thread does not outlive the interpreter: events pending at exit are lost), and it
registers no ``atexit`` hook, so it never delays an interpreter's exit or a Ctrl-C.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..metrics import EtcdMetrics, MetricsSpan
from .logctx import library_logger

__all__ = [
    "IDLE_SECONDS",
    "LINGER_SECONDS",
    "MAX_PENDING",
    "SLOW_SPAN_SECONDS",
    "Meter",
    "MeterStats",
    "RecipeMeter",
    "SpanHandle",
    "meter_for",
]

log = library_logger("etcd_recipes.metrics")

MAX_PENDING = 10_000
"""Events queued for a sink's thread beyond which new events are dropped (and counted)."""

LINGER_SECONDS = 0.005
"""The least time between two batches the sink's thread delivers (the first event after a
quiet spell is delivered at once)."""

IDLE_SECONDS = 1.0
"""A sink's delivery thread ends after this long with nothing to deliver (the next event
starts a new one), so sinks that are no longer used leave no thread behind."""

SLOW_SPAN_SECONDS = 0.05
"""A ``start_span``/``end`` call slower than this switches spans off for that sink; an inline
event (``deliver_inline``) slower than this moves the sink to its delivery thread."""

_EVENT_METHODS = (
    "record_rpc",
    "increment_watch_recovery",
    "increment_keep_alive",
    "record_latency",
    "rpc_finished",
    "lease_lost",
    "lock_wait_finished",
    "lock_hold_finished",
    "leadership_changed",
    "partition_changed",
    "barrier_wait_finished",
    "queue_operation",
    "queue_redelivered",
    "cache_synced",
    "cache_size_changed",
    "shared_value_written",
)


@dataclass(frozen=True)
class MeterStats:
    """What a :class:`Meter` did: events delivered, dropped, failed, and slow span calls."""

    delivered: int
    dropped: int
    errors: int
    slow_spans: int
    pending: int
    slow_events: int = 0
    """Inline events (``deliver_inline``) that took longer than :data:`SLOW_SPAN_SECONDS`."""


def _overridden(sink: EtcdMetrics) -> frozenset[str]:
    cls = type(sink)
    names = {
        m for m in (*_EVENT_METHODS, "start_span") if getattr(cls, m) is not getattr(EtcdMetrics, m)
    }
    if "record_rpc" in names:
        names.add("rpc_finished")  # the default rpc_finished forwards to record_rpc
    return frozenset(names)


class Meter:
    """The guarded, ordered, non-blocking view of one sink (see the module docstring)."""

    def __init__(self, sink: EtcdMetrics) -> None:
        self.sink = sink
        self._wanted = _overridden(sink)
        self._events: deque[tuple[str, tuple[Any, ...]] | threading.Event] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()  # set when events wait and the thread is idle
        self._hurry = threading.Event()  # set by flush(): deliver without lingering
        self._idle = True  # under _lock: the thread waits for _wake (nothing to deliver)
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._pending = 0
        self._delivered = 0
        self._dropped = 0
        self._errors = 0
        self._slow_spans = 0
        self._slow_events = 0
        self._spans_on = "start_span" in self._wanted
        self._inline = bool(getattr(sink, "deliver_inline", False))
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<Meter {type(self.sink).__name__} delivered={s.delivered} pending={s.pending} "
            f"dropped={s.dropped} errors={s.errors} spans={'on' if self._spans_on else 'off'} "
            f"delivery={'inline' if self._inline else 'thread'}>"
        )

    def wants(self, method: str) -> bool:
        """Whether the sink overrides ``method`` (events it does not are never queued)."""
        return method in self._wanted

    def emit(self, method: str, *args: Any) -> None:
        """Queue ``sink.method(*args)`` for the sink's thread; never blocks, never raises."""
        if method not in self._wanted:
            return
        if self._inline:
            self._deliver_inline(method, args)
            return
        with self._lock:
            if self._pending >= MAX_PENDING:
                self._dropped += 1
                return
            if self._thread is None or self._pid != os.getpid():
                self._start_thread()
            self._pending += 1
            self._events.append((method, args))
            wake, self._idle = self._idle, False
        if wake:
            self._wake.set()

    def _start_thread(self) -> None:  # under self._lock
        if self._pid != os.getpid() and self._thread is not None:
            # A forked child: the parent's thread does not exist here, nor do its events.
            self._events = deque()
            self._pending = 0
            self._wake, self._hurry = threading.Event(), threading.Event()
        self._idle = True
        self._pid = os.getpid()
        thread = threading.Thread(
            target=self._run,
            args=(weakref.ref(self), self._wake, self._hurry),
            name=f"etcd-recipes-metrics[{type(self.sink).__name__}]",
            daemon=True,
        )
        self._thread = thread
        thread.start()

    @staticmethod
    def _run(ref: weakref.ref[Meter], wake: threading.Event, hurry: threading.Event) -> None:
        drained = 0.0
        while True:
            if not wake.wait(IDLE_SECONDS):
                self = ref()
                if self is None or self._retire():
                    return  # the sink is gone, or idle: the next event starts a new thread
                del self
                continue
            wake.clear()
            # The first event after a quiet spell is delivered at once; while events keep
            # coming, at most one batch per LINGER_SECONDS: one wake-up (and one GIL hand-over)
            # per batch instead of one per event.
            pause = drained + LINGER_SECONDS - time.monotonic()
            if pause > 0:
                hurry.wait(pause)
            hurry.clear()
            self = ref()
            if self is None:
                return
            self._drain()
            del self
            drained = time.monotonic()

    def _retire(self) -> bool:
        """End the idle thread (``True``) unless an event arrived meanwhile."""
        with self._lock:
            if self._events or not self._idle:
                return False
            self._thread = None
            return True

    def _drain(self) -> None:
        """Deliver queued events until none is left, then mark the thread idle (the queue is
        taken a batch at a time: two lock round trips per batch, not per event)."""
        while True:
            with self._lock:
                if not self._events:
                    self._idle = True
                    return
                batch, self._events = self._events, deque()
            delivered = 0
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()  # a flush() marker: everything queued before it is delivered
                    continue
                self._deliver(*item)
                delivered += 1
            with self._lock:
                self._pending -= delivered
                self._delivered += delivered

    def _deliver(self, method: str, args: tuple[Any, ...]) -> None:
        try:
            getattr(self.sink, method)(*args)
        except Exception as exc:
            self._sink_failed(method, exc)

    def _deliver_inline(self, method: str, args: tuple[Any, ...]) -> None:
        started = time.monotonic()
        self._deliver(method, args)
        slow = time.monotonic() - started > SLOW_SPAN_SECONDS
        with self._lock:
            self._delivered += 1
            if slow:
                self._slow_events += 1
                was_inline, self._inline = self._inline, False
        if slow and was_inline:
            log.warning(
                "metrics sink %s: an inline %s call took over %.0f ms; its events go through "
                "the delivery thread from now on",
                type(self.sink).__name__,
                method,
                SLOW_SPAN_SECONDS * 1000,
            )

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every event queued so far was delivered; ``False`` on timeout.

        For tests and shutdown paths; recipes never call it."""
        marker = threading.Event()
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                return True
            self._events.append(marker)
            wake, self._idle = self._idle, False
            hurry = self._hurry
        hurry.set()
        if wake:
            self._wake.set()
        return marker.wait(timeout)

    def stats(self) -> MeterStats:
        """A snapshot of what this meter did so far."""
        with self._lock:
            return MeterStats(
                self._delivered,
                self._dropped,
                self._errors,
                self._slow_spans,
                self._pending,
                self._slow_events,
            )

    def start_span(
        self,
        recipe: str,
        name: str,
        operation: str,
        path: str,
        attributes: Mapping[str, object],
    ) -> SpanHandle:
        """Begin a bounded operation's span, inline (see the module docstring)."""
        if not self._spans_on:
            return _NO_SPAN
        started = time.monotonic()
        try:
            span = self.sink.start_span(recipe, name, operation, path, attributes)
        except Exception as exc:
            self._sink_failed("start_span", exc)
            span = None
        self._check_slow(started)
        return _NO_SPAN if span is None else SpanHandle(self, span)

    def _sink_failed(self, where: str, exc: Exception) -> None:
        """Count a sink method that raised; log it the first time for that method."""
        with self._lock:
            self._errors += 1
            first = where not in self._warned
            self._warned.add(where)
        if first:
            log.warning(
                "metrics sink %s.%s raised %s: %s (ignored; counted in its stats)",
                type(self.sink).__name__,
                where,
                type(exc).__name__,
                exc,
            )

    def _check_slow(self, started: float) -> None:
        if time.monotonic() - started > SLOW_SPAN_SECONDS:
            with self._lock:
                self._slow_spans += 1
                was_on, self._spans_on = self._spans_on, False
            if was_on:
                log.warning(
                    "metrics sink %s: a span call took over %.0f ms; spans are off for it",
                    type(self.sink).__name__,
                    SLOW_SPAN_SECONDS * 1000,
                )

    def for_recipe(self, recipe: str, name: str) -> RecipeMeter:
        """A view that fills in the ``recipe`` and ``name`` labels."""
        return RecipeMeter(self, recipe, name)


class SpanHandle:
    """One started span; :meth:`end` reports its outcome once (later calls do nothing)."""

    __slots__ = ("_meter", "_span")

    def __init__(self, meter: Meter | None, span: MetricsSpan | None) -> None:
        self._meter = meter
        self._span = span

    @property
    def span(self) -> MetricsSpan | None:
        """The sink's span while it is open (``None`` once ended, or when spans are off)."""
        return self._span

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        span, self._span = self._span, None
        meter = self._meter
        if span is None or meter is None:
            return
        started = time.monotonic()
        try:
            span.end(outcome, error)
        except Exception as exc:
            meter._sink_failed("span.end", exc)
        meter._check_slow(started)


_NO_SPAN = SpanHandle(None, None)


class RecipeMeter:
    """A :class:`Meter` with one recipe's ``recipe`` and ``name`` labels filled in.

    Each method is one v2 event (see :class:`~etcd_recipes.EtcdMetrics` for vocabularies)."""

    __slots__ = ("meter", "name", "recipe")

    def __init__(self, meter: Meter, recipe: str, name: str) -> None:
        self.meter = meter
        self.recipe = recipe
        self.name = name

    def __repr__(self) -> str:
        return f"<RecipeMeter {self.recipe} name={self.name!r} {self.meter!r}>"

    def lease_lost(self, kind: str) -> None:
        self.meter.emit("lease_lost", self.recipe, self.name, kind)

    def lock_wait(self, duration: float, outcome: str) -> None:
        self.meter.emit("lock_wait_finished", self.recipe, self.name, duration, outcome)

    def lock_hold(self, duration: float, ended: str) -> None:
        self.meter.emit("lock_hold_finished", self.recipe, self.name, duration, ended)

    def leadership(self, transition: str) -> None:
        self.meter.emit("leadership_changed", self.recipe, self.name, transition)

    def partition(self, transition: str) -> None:
        self.meter.emit("partition_changed", self.recipe, self.name, transition)

    def barrier_wait(self, duration: float, outcome: str) -> None:
        self.meter.emit("barrier_wait_finished", self.recipe, self.name, duration, outcome)

    def queue_op(self, operation: str, duration: float, outcome: str) -> None:
        self.meter.emit("queue_operation", self.recipe, self.name, operation, duration, outcome)

    def redelivered(self, count: int) -> None:
        self.meter.emit("queue_redelivered", self.recipe, self.name, count)

    def cache_synced(self, kind: str, duration: float, size: int) -> None:
        self.meter.emit("cache_synced", self.recipe, self.name, kind, duration, size)

    def cache_size(self, delta: int) -> None:
        if delta:
            self.meter.emit("cache_size_changed", self.recipe, self.name, delta)

    def shared_value_written(self, operation: str, outcome: str) -> None:
        self.meter.emit("shared_value_written", self.recipe, self.name, operation, outcome)

    def latency(self, name: str, seconds: float) -> None:
        """The v1 ``record_latency`` event (kept for sinks written against v1)."""
        self.meter.emit("record_latency", name, seconds)

    def span(self, operation: str, path: str, **attributes: object) -> SpanHandle:
        return self.meter.start_span(self.recipe, self.name, operation, path, attributes)


_meters: weakref.WeakKeyDictionary[EtcdMetrics, Meter] = weakref.WeakKeyDictionary()
_meters_lock = threading.Lock()
_strong: dict[int, tuple[EtcdMetrics, Meter]] = {}


def meter_for(sink: EtcdMetrics) -> Meter:
    """The one :class:`Meter` of ``sink`` (created on first use)."""
    try:
        return _meters[sink]
    except KeyError:
        pass
    except TypeError:  # a sink that cannot be weakly referenced or hashed
        return _strong.setdefault(id(sink), (sink, Meter(sink)))[1]
    with _meters_lock:
        meter = _meters.get(sink)
        if meter is None:
            meter = _meters[sink] = Meter(sink)
        return meter
