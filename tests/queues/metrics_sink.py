"""A recording metrics sink for the queue, cache and discovery metrics tests.

It records the v2 events these families report (and the v1 ``record_latency``), and every
span begun and ended, with its attributes. Events arrive on the dispatcher's thread: call
:meth:`EventSink.flush` before reading them. Spans are recorded inline.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from etcd_recipes import EtcdMetrics, MetricsSpan
from etcd_recipes._core.metering import meter_for


class _Span(MetricsSpan):
    def __init__(self, sink: EventSink, index: int) -> None:
        self._sink = sink
        self._index = index

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        with self._sink.lock:
            self._sink.ended.append((self._index, outcome, error))


class EventSink(EtcdMetrics):
    """Records ``(method, *args)`` tuples in :attr:`calls`; spans in :attr:`spans`/:attr:`ended`.

    ``spans=False`` makes it a sink without tracing (``start_span`` not overridden)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[object, ...]] = []
        self.spans: list[tuple[str, str, str, str, dict[str, object]]] = []
        self.ended: list[tuple[int, str, BaseException | None]] = []

    def _add(self, *call: object) -> None:
        with self.lock:
            self.calls.append(call)

    def queue_operation(
        self, recipe: str, name: str, operation: str, duration: float, outcome: str
    ) -> None:
        assert isinstance(duration, float) and duration >= 0
        self._add("queue_operation", recipe, name, operation, outcome)

    def queue_redelivered(self, recipe: str, name: str, count: int) -> None:
        self._add("queue_redelivered", recipe, name, count)

    def lease_lost(self, recipe: str, name: str, kind: str) -> None:
        self._add("lease_lost", recipe, name, kind)

    def cache_synced(self, recipe: str, name: str, kind: str, duration: float, size: int) -> None:
        assert isinstance(duration, float) and duration >= 0
        self._add("cache_synced", recipe, name, kind, size)

    def cache_size_changed(self, recipe: str, name: str, delta: int) -> None:
        self._add("cache_size_changed", recipe, name, delta)

    def record_latency(self, name: str, seconds: float) -> None:
        assert seconds >= 0
        self._add("record_latency", name)

    def start_span(
        self, recipe: str, name: str, operation: str, path: str, attributes: Mapping[str, object]
    ) -> MetricsSpan | None:
        with self.lock:
            self.spans.append((recipe, name, operation, path, dict(attributes)))
            return _Span(self, len(self.spans) - 1)

    def flush(self) -> list[tuple[object, ...]]:
        """Wait until every event reported so far arrived; returns them all."""
        assert meter_for(self).flush(10)
        with self.lock:
            return list(self.calls)

    def of(self, *methods: str) -> list[tuple[object, ...]]:
        """The events (flushed first) of ``methods``, without the method name."""
        return [c[1:] for c in self.flush() if c[0] in methods]

    def ops(self) -> list[tuple[object, ...]]:
        """``(operation, outcome)`` of every ``queue_operation`` so far."""
        return [c[2:] for c in self.of("queue_operation")]

    def clear(self) -> None:
        self.flush()
        with self.lock:
            self.calls.clear()
            self.spans.clear()
            self.ended.clear()
