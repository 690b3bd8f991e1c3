"""A metrics sink for tests: records every event it is given, in order.

Every v1 and v2 event method is overridden (so the meter queues all of them) and appends
``(method, args)`` to :attr:`RecordingMetrics.calls` under a lock; ``rpc_finished`` is
recorded as itself (the default forwarding to ``record_rpc`` is not used). Spans are
recorded as ``("start_span", (recipe, name, operation, path, attributes))`` when started
and ``("span_end", (operation, outcome, error))`` when they end.

Example::

    sink = RecordingMetrics()
    async with connect(endpoints, resilience=ResilienceConfig(metrics=sink)) as client:
        ...
    sink.flush()
    assert sink.of("lock_wait_finished") == [("DistributedMutex", "", ANY, "acquired")]
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from etcd_recipes import EtcdMetrics, MetricsSpan
from etcd_recipes._core.metering import meter_for

__all__ = ["RecordingMetrics"]


class _RecordedSpan(MetricsSpan):
    def __init__(self, sink: RecordingMetrics, operation: str) -> None:
        self._sink = sink
        self._operation = operation

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        self._sink._add("span_end", (self._operation, outcome, error))


class RecordingMetrics(EtcdMetrics):
    """Records ``(method, args)`` for every event; thread-safe."""

    def __init__(self, *, spans: bool = True) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._spans = spans

    def _add(self, method: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self.calls.append((method, args))

    def of(self, method: str) -> list[tuple[Any, ...]]:
        """The argument tuples of every recorded call of ``method``, in order."""
        with self._lock:
            return [args for m, args in self.calls if m == method]

    def events(
        self, timed: tuple[str, ...], untimed: tuple[str, ...] = ("lease_lost",)
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """After a flush, the recorded calls of the ``timed`` methods (``(recipe, name,
        duration, outcome)``: the duration checked, then dropped, as it varies) and of the
        ``untimed`` ones (their arguments as given), in order."""
        self.flush()
        out: list[tuple[str, tuple[Any, ...]]] = []
        with self._lock:
            for method, args in self.calls:
                if method in timed:
                    recipe, name, duration, outcome = args
                    assert isinstance(duration, float) and duration >= 0
                    out.append((method, (recipe, name, outcome)))
                elif method in untimed:
                    out.append((method, args))
        return out

    def spans(self, *, attributes: bool = False) -> list[tuple[Any, ...]]:
        """``(recipe, name, operation, path)`` of each started span (``attributes=True``: with
        its attributes) and ``(operation, outcome)`` of each ended one, in order."""
        width = 5 if attributes else 4
        with self._lock:
            return [
                args[:width] if method == "start_span" else args[:2]
                for method, args in self.calls
                if method in ("start_span", "span_end")
            ]

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the meter delivered every event queued so far (fails on timeout)."""
        assert meter_for(self).flush(timeout), "the metrics meter did not flush in time"

    def clear(self) -> None:
        """Forget everything recorded so far (flush first to drop in-flight events too)."""
        with self._lock:
            self.calls.clear()

    # -- v1 ---------------------------------------------------------------------------------

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        self._add("record_rpc", (op, duration, attempts, failed))

    def increment_watch_recovery(self, kind: str, key: bytes) -> None:
        self._add("increment_watch_recovery", (kind, key))

    def increment_keep_alive(self, kind: str, lease_id: int) -> None:
        self._add("increment_keep_alive", (kind, lease_id))

    def record_latency(self, name: str, seconds: float) -> None:
        self._add("record_latency", (name, seconds))

    # -- v2 ---------------------------------------------------------------------------------

    def rpc_finished(self, operation: str, duration: float, attempts: int, outcome: str) -> None:
        self._add("rpc_finished", (operation, duration, attempts, outcome))

    def lease_lost(self, recipe: str, name: str, kind: str) -> None:
        self._add("lease_lost", (recipe, name, kind))

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        self._add("lock_wait_finished", (recipe, name, duration, outcome))

    def lock_hold_finished(self, recipe: str, name: str, duration: float, ended: str) -> None:
        self._add("lock_hold_finished", (recipe, name, duration, ended))

    def partition_changed(self, recipe: str, name: str, transition: str) -> None:
        self._add("partition_changed", (recipe, name, transition))

    def leadership_changed(self, recipe: str, name: str, transition: str) -> None:
        self._add("leadership_changed", (recipe, name, transition))

    def barrier_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        self._add("barrier_wait_finished", (recipe, name, duration, outcome))

    def queue_operation(
        self, recipe: str, name: str, operation: str, duration: float, outcome: str
    ) -> None:
        self._add("queue_operation", (recipe, name, operation, duration, outcome))

    def queue_redelivered(self, recipe: str, name: str, count: int) -> None:
        self._add("queue_redelivered", (recipe, name, count))

    def cache_synced(self, recipe: str, name: str, kind: str, duration: float, size: int) -> None:
        self._add("cache_synced", (recipe, name, kind, duration, size))

    def cache_size_changed(self, recipe: str, name: str, delta: int) -> None:
        self._add("cache_size_changed", (recipe, name, delta))

    def shared_value_written(self, recipe: str, name: str, operation: str, outcome: str) -> None:
        self._add("shared_value_written", (recipe, name, operation, outcome))

    def start_span(
        self, recipe: str, name: str, operation: str, path: str, attributes: Mapping[str, object]
    ) -> MetricsSpan | None:
        if not self._spans:
            return None
        self._add("start_span", (recipe, name, operation, path, dict(attributes)))
        return _RecordedSpan(self, operation)
