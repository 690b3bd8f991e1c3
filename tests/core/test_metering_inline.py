"""Inline delivery (``EtcdMetrics.deliver_inline``): no queue, no thread, and still isolated.

Pure logic except the last test, which runs a mutex against real etcd with the Prometheus
sink (the ready-made sinks deliver inline).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from etcd_recipes import EtcdMetrics
from etcd_recipes._core.metering import SLOW_SPAN_SECONDS, Meter


class Inline(EtcdMetrics):
    deliver_inline = True

    def __init__(self, *, raise_on: str = "", slow_once: bool = False) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.raise_on = raise_on
        self.slow_once = slow_once

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        if outcome == self.raise_on:
            raise RuntimeError("sink bug")
        if self.slow_once:
            self.slow_once = False
            time.sleep(SLOW_SPAN_SECONDS * 2)
        self.calls.append((outcome, threading.current_thread().name, threading.get_ident()))


def test_an_inline_sink_is_called_at_once_in_the_reporting_thread() -> None:
    sink = Inline()
    meter = Meter(sink)
    before = threading.active_count()
    view = meter.for_recipe("DistributedMutex", "orders")
    view.lock_wait(0.1, "acquired")
    # Delivered before emit() returned: no flush, no queue, no thread.
    assert sink.calls == [("acquired", threading.current_thread().name, threading.get_ident())]
    assert threading.active_count() == before
    stats = meter.stats()
    assert (stats.delivered, stats.pending, stats.slow_events) == (1, 0, 0)
    assert "delivery=inline" in repr(meter)
    assert meter.flush(0.1)  # nothing to wait for


def test_an_inline_sink_that_raises_is_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    sink = Inline(raise_on="timeout")
    meter = Meter(sink)
    with caplog.at_level(logging.WARNING, logger="etcd_recipes.metrics"):
        for _ in range(3):
            meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "timeout")
        meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "acquired")
    assert [c[0] for c in sink.calls] == ["acquired"]
    assert meter.stats().errors == 3
    assert len([r for r in caplog.records if "raised RuntimeError" in r.getMessage()]) == 1


def test_a_slow_inline_call_moves_the_sink_to_its_thread(caplog: pytest.LogCaptureFixture) -> None:
    sink = Inline(slow_once=True)
    meter = Meter(sink)
    with caplog.at_level(logging.WARNING, logger="etcd_recipes.metrics"):
        meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "acquired")
        meter.emit("lock_wait_finished", "DistributedMutex", "", 0.1, "released")
        assert meter.flush(5)
    (first, second) = sink.calls
    assert first[2] == threading.get_ident()  # the slow call itself ran inline
    assert second[2] != threading.get_ident()  # then the delivery thread took over
    assert second[1] == "etcd-recipes-metrics[Inline]"
    stats = meter.stats()
    assert (stats.delivered, stats.slow_events, stats.errors) == (2, 1, 0)
    assert "delivery=thread" in repr(meter)
    assert any("inline lock_wait_finished call took over" in r.getMessage() for r in caplog.records)


def test_the_ready_made_sinks_deliver_inline() -> None:
    from etcd_recipes.contrib.otel import OpenTelemetryMetrics
    from etcd_recipes.contrib.prometheus import PrometheusMetrics

    assert PrometheusMetrics.deliver_inline
    assert OpenTelemetryMetrics.deliver_inline
    assert not EtcdMetrics.deliver_inline  # a user's sink is isolated by a thread by default


async def test_a_mutex_cycle_is_in_prometheus_as_soon_as_it_returns(
    etcd_server, etcd_prefix
) -> None:
    from prometheus_client import CollectorRegistry

    from etcd_recipes import DistributedMutex, ResilienceConfig, connect
    from etcd_recipes.contrib.prometheus import PrometheusMetrics

    registry = CollectorRegistry()
    sink = PrometheusMetrics(registry=registry)
    labels = {"recipe": "DistributedMutex", "name": "inline"}
    async with connect(
        **etcd_server.client_kwargs(), resilience=ResilienceConfig(metrics=sink)
    ) as c:
        mutex = DistributedMutex(c, etcd_prefix + "m", metrics_name="inline")
        assert await mutex.acquire()
        waits = registry.get_sample_value(
            "etcd_recipes_lock_wait_seconds_count", {**labels, "outcome": "acquired"}
        )
        assert waits == 1.0  # read with no flush: the event was delivered inline
        assert await mutex.release()
        held = registry.get_sample_value(
            "etcd_recipes_lock_hold_seconds_count", {**labels, "ended": "released"}
        )
        assert held == 1.0
        await mutex.aclose()
    names = {t.name for t in threading.enumerate()}
    assert "etcd-recipes-metrics[PrometheusMetrics]" not in names
