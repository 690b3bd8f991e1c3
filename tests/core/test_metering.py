"""The metering dispatcher (``_core/metering.py``): order, isolation, bounds, spans.

Pure logic (no etcd): the end-to-end tests with recipes are in ``tests/metrics``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

import pytest

from etcd_recipes import NOOP_METRICS, EtcdMetrics, MetricsSpan
from etcd_recipes._core import metering
from etcd_recipes._core.metering import Meter, meter_for


class Recording(EtcdMetrics):
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.threads: set[str] = set()

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("lock_wait_finished", recipe, name, duration, outcome))

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        self.calls.append(("record_rpc", op, attempts, failed))


def test_events_arrive_in_order_on_one_named_daemon_thread() -> None:
    sink = Recording()
    meter = meter_for(sink)
    assert meter_for(sink) is meter
    view = meter.for_recipe("DistributedMutex", "orders")
    for i in range(100):
        view.lock_wait(float(i), "acquired")
    assert meter.flush()
    assert [c[3] for c in sink.calls] == [float(i) for i in range(100)]
    assert sink.calls[0] == ("lock_wait_finished", "DistributedMutex", "orders", 0.0, "acquired")
    (thread,) = sink.threads
    assert thread == "etcd-recipes-metrics[Recording]"
    worker = next(t for t in threading.enumerate() if t.name == thread)
    assert worker.daemon
    assert meter.stats().delivered == 100
    assert "delivered=100" in repr(meter)


def test_v1_sink_gets_rpc_finished_through_record_rpc() -> None:
    sink = Recording()
    meter = meter_for(sink)
    meter.emit("rpc_finished", "put", 0.01, 2, "unavailable")
    meter.emit("rpc_finished", "range", 0.01, 1, "ok")
    assert meter.flush()
    assert sink.calls == [("record_rpc", "put", 2, True), ("record_rpc", "range", 1, False)]


def test_events_the_sink_does_not_override_are_never_queued() -> None:
    meter = Meter(NOOP_METRICS)
    before = threading.active_count()
    for _ in range(1000):
        meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "acquired")
    assert threading.active_count() == before  # no thread for the no-op sink
    assert meter.stats() == metering.MeterStats(0, 0, 0, 0, 0)
    assert not meter.wants("queue_operation")


def test_a_raising_sink_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    class Raising(EtcdMetrics):
        def queue_operation(self, *args: object) -> None:
            raise RuntimeError("sink bug")

    meter = meter_for(Raising())
    view = meter.for_recipe("DistributedWorkQueue", "")
    with caplog.at_level("WARNING", logger="etcd_recipes.metrics"):
        for _ in range(5):
            view.queue_op("ack", 0.001, "ok")  # never raises here
        assert meter.flush()
    stats = meter.stats()
    assert (stats.errors, stats.delivered, stats.pending) == (5, 5, 0)
    warnings = [r for r in caplog.records if "sink bug" in r.getMessage()]
    assert len(warnings) == 1


def test_a_blocking_sink_only_fills_a_bounded_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metering, "MAX_PENDING", 50)
    release = threading.Event()

    class Blocking(EtcdMetrics):
        def lock_hold_finished(self, *args: object) -> None:
            release.wait(30)

    meter = Meter(Blocking())
    view = meter.for_recipe("DistributedMutex", "")
    started = time.monotonic()
    for _ in range(1000):
        view.lock_hold(0.5, "released")
    elapsed = time.monotonic() - started
    stats = meter.stats()
    assert stats.pending == 50
    assert stats.dropped == 950
    assert elapsed < 5  # generous: it must not have waited for the blocked sink (30 s)
    release.set()
    assert meter.flush(10)
    assert meter.stats().delivered == 50


class SpanSink(EtcdMetrics):
    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.ended: list[tuple[str, str, BaseException | None]] = []
        self.started: list[tuple[str, str, Mapping[str, object]]] = []
        self.delay = delay
        self.fail = fail

    def start_span(
        self, recipe: str, name: str, operation: str, path: str, attributes: Mapping[str, object]
    ) -> MetricsSpan | None:
        time.sleep(self.delay)
        if self.fail:
            raise ValueError("tracer down")
        self.started.append((operation, path, dict(attributes)))
        sink = self

        class Span(MetricsSpan):
            def end(self, outcome: str, error: BaseException | None = None) -> None:
                sink.ended.append((operation, outcome, error))

        return Span()


def test_spans_are_inline_and_end_once() -> None:
    sink = SpanSink()
    view = Meter(sink).for_recipe("DistributedMutex", "")
    span = view.span("lock.acquire", "/locks/a", fencing=True)
    assert sink.started == [("lock.acquire", "/locks/a", {"fencing": True})]  # inline: no flush
    span.end("acquired")
    span.end("lost")  # a second end is ignored
    assert sink.ended == [("lock.acquire", "acquired", None)]


def test_a_failing_tracer_is_counted_and_a_slow_one_switched_off() -> None:
    failing = Meter(SpanSink(fail=True))
    handle = failing.start_span("DistributedMutex", "", "lock.acquire", "/a", {})
    handle.end("acquired")  # a no-op handle
    assert failing.stats().errors == 1

    slow_sink = SpanSink(delay=metering.SLOW_SPAN_SECONDS * 2)
    slow = Meter(slow_sink)
    slow.start_span("DistributedMutex", "", "lock.acquire", "/a", {}).end("acquired")
    slow.start_span("DistributedMutex", "", "lock.acquire", "/b", {}).end("acquired")
    assert [s[1] for s in slow_sink.started] == ["/a"]  # the second was never started
    assert slow.stats().slow_spans == 1
    assert "spans=off" in repr(slow)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_thread() -> None:
    sink = Recording()
    meter = meter_for(sink)
    meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "acquired")
    assert meter.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's thread is gone; events must still be delivered
        try:
            meter.emit("lock_wait_finished", "DistributedMutex", "", 0.2, "acquired")
            ok = meter.flush(5) and len(sink.calls) == 2
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"


async def test_closing_the_client_delivers_what_was_reported(etcd_server, etcd_prefix) -> None:
    from etcd_recipes import DistributedMutex, ResilienceConfig, connect

    class Slow(EtcdMetrics):
        def __init__(self) -> None:
            self.waits: list[str] = []

        def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
            time.sleep(0.05)  # a sink slower than the recipe: events queue up
            self.waits.append(outcome)

    sink = Slow()
    async with connect(
        **etcd_server.client_kwargs(), resilience=ResilienceConfig(metrics=sink)
    ) as c:
        mutex = DistributedMutex(c, etcd_prefix + "m")
        for _ in range(5):
            assert await mutex.acquire()
            assert await mutex.release()
        await mutex.aclose()
    assert sink.waits == ["acquired"] * 5  # read right after aclose(): nothing still queued


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_an_idle_delivery_thread_ends_and_the_next_event_starts_one() -> None:
    sink = Recording()
    meter = Meter(sink)
    meter.emit("lock_wait_finished", "DistributedMutex", "", 1.0, "acquired")
    assert meter.flush()
    first = meter._thread
    assert first is not None
    # Nothing to deliver for IDLE_SECONDS: the thread ends (and says so by clearing _thread).
    assert _wait_until(lambda: not first.is_alive())
    assert meter._thread is None
    meter.emit("lock_wait_finished", "DistributedMutex", "", 2.0, "acquired")
    assert meter.flush()
    assert [c[3] for c in sink.calls] == [1.0, 2.0]
    assert meter._thread is not None
    assert meter._thread is not first


def test_a_dropped_sink_leaves_no_thread_behind() -> None:
    def names() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name == "etcd-recipes-metrics[Dropped]"]

    class Dropped(Recording):
        pass

    assert names() == []
    for _ in range(20):  # twenty sinks used once each, as twenty tests would
        meter = Meter(Dropped())
        meter.emit("lock_wait_finished", "DistributedMutex", "", 1.0, "acquired")
        assert meter.flush()
    del meter
    assert len(names()) >= 1
    assert _wait_until(lambda: names() == [])
