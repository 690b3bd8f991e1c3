"""contrib.prometheus: the exposition of a scripted scenario (golden file), cardinality, the
multiprocess mode with real worker processes, the cached collectors and a client end to end,
the last two against a real etcd.

Regenerate the golden file after an intended change with
``ETCD_RECIPES_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/contrib/test_prometheus.py -k golden``
and review its diff.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from etcd_recipes import (
    DistributedMutex,
    DistributedQueue,
    DistributedSemaphore,
    InvalidArgumentError,
    ResilienceConfig,
    connect,
)
from etcd_recipes._core.metering import meter_for
from etcd_recipes.contrib.prometheus import (
    AvailablePermitsCollector,
    PrometheusMetrics,
    QueueDepthCollector,
)
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "prometheus_scenario.txt"


def _exposition(registry: CollectorRegistry) -> str:
    """``generate_latest`` without the ``*_created`` families (their values are timestamps)."""
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line) + "\n"


def _series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in registry.collect()
        for s in family.samples
    }


def _scenario(sink: PrometheusMetrics) -> None:
    """Every sink method, in a fixed order, with exactly representable durations."""
    sink.rpc_finished("put", 0.0009765625, 1, "ok")
    sink.rpc_finished("put", 0.0078125, 3, "ok")
    sink.rpc_finished("range", 0.5, 2, "unavailable")
    sink.record_rpc("txn", 0.03125, 1, True)  # v1: outcome "error"
    sink.increment_watch_recovery("suspended", b"/secret/watched/key")
    sink.increment_watch_recovery("resubscribed", b"/secret/watched/key")
    sink.increment_keep_alive("renewal", 7587861231234567)
    sink.increment_keep_alive("renewal", 7587861231234567)
    sink.increment_keep_alive("expired", 7587861231234567)
    sink.lease_lost("DistributedMutex", "orders", "expired")
    sink.lock_wait_finished("DistributedMutex", "orders", 0.015625, "acquired")
    sink.lock_wait_finished("DistributedMutex", "orders", 45.0, "timeout")
    sink.lock_hold_finished("DistributedMutex", "orders", 300.0, "released")
    sink.lock_wait_finished("DistributedSemaphore", "", 0.0625, "acquired")
    sink.lock_hold_finished("DistributedSemaphore", "", 2.0, "lost")
    sink.leadership_changed("LeaderSelector", "jobs", "acquired")
    sink.leadership_changed("LeaderSelector", "jobs", "lost")
    sink.leadership_changed("LeaderLatch", "", "acquired")
    sink.barrier_wait_finished("DistributedBarrier", "deploy", 1.5, "passed")
    sink.queue_operation("DistributedWorkQueue", "emails", "enqueue", 0.00390625, "ok")
    sink.queue_operation("DistributedWorkQueue", "emails", "receive", 12.0, "ok")
    sink.queue_operation("DistributedWorkQueue", "emails", "ack", 0.00390625, "stale")
    sink.queue_redelivered("DistributedWorkQueue", "emails", 3)
    sink.cache_synced("PrefixCache", "users", "initial", 0.25, 100)
    sink.cache_synced("PrefixCache", "users", "resync", 0.125, 98)
    sink.cache_size_changed("PrefixCache", "users", 100)
    sink.cache_size_changed("PrefixCache", "users", -2)
    sink.shared_value_written("SharedValue", "config", "try_set", "conflict")
    sink.shared_value_written("SharedValue", "config", "try_set", "ok")
    sink.record_latency("queue.dequeue", 0.75)


def test_the_scenario_matches_the_golden_exposition() -> None:
    registry = CollectorRegistry()
    _scenario(PrometheusMetrics(registry=registry))
    text = _exposition(registry)
    if os.environ.get("ETCD_RECIPES_UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
    # What the golden file pins, said out loud:
    assert "/secret" not in text and "7587861231234567" not in text
    assert all(line.startswith(("# HELP etcd_recipes_", "# TYPE etcd_recipes_", "etcd_recipes_"))
               for line in text.splitlines())  # fmt: skip
    assert registry.get_sample_value("etcd_recipes_rpc_retries_total", {"operation": "put"}) == 2
    leader = {"recipe": "LeaderSelector", "name": "jobs"}
    assert registry.get_sample_value("etcd_recipes_leader", leader) == 0
    entries = {"recipe": "PrefixCache", "name": "users"}
    assert registry.get_sample_value("etcd_recipes_cache_entries", entries) == 98
    shared = {"recipe": "SharedValue", "name": "config", "operation": "try_set"}
    written = "etcd_recipes_shared_value_writes_total"
    assert registry.get_sample_value(written, {**shared, "outcome": "conflict"}) == 1


def test_every_histogram_family_has_about_ten_buckets_reaching_minutes() -> None:
    registry = CollectorRegistry()
    _scenario(PrometheusMetrics(registry=registry))
    bounds: dict[str, set[str]] = {}
    for family in registry.collect():
        if family.type == "histogram":
            bounds[family.name] = {
                s.labels["le"] for s in family.samples if s.name.endswith("_bucket")
            }
    assert len(bounds) == 7, sorted(bounds)
    for name, les in bounds.items():
        assert 10 <= len(les) <= 12, (name, les)
    assert "600.0" in bounds["etcd_recipes_lock_wait_seconds"]
    assert "5.0" in bounds["etcd_recipes_rpc_duration_seconds"]


def test_ten_thousand_lock_paths_make_no_new_series() -> None:
    registry = CollectorRegistry()
    sink = PrometheusMetrics(registry=registry)

    def run(paths: int) -> None:
        for i in range(paths):
            path = f"/locks/tenant-{i}/orders/{i * 7919}"
            assert sink.start_span("DistributedMutex", "orders", "lock.acquire", path, {}) is None
            sink.lock_wait_finished("DistributedMutex", "orders", 0.001 * (i % 50), "acquired")
            sink.lock_hold_finished("DistributedMutex", "orders", 0.002, "released")
            sink.increment_keep_alive("renewal", 10_000_000 + i)
            sink.increment_watch_recovery("resubscribed", path.encode())

    run(3)
    before = _series(registry)
    run(10_000)
    assert _series(registry) == before
    assert len(before) < 80
    text = generate_latest(registry).decode()
    assert "tenant-" not in text and "10000001" not in text


def test_a_second_sink_on_one_registry_is_a_clear_error_and_registers_nothing() -> None:
    registry = CollectorRegistry()
    first = PrometheusMetrics(registry=registry)
    series = _series(registry)
    with pytest.raises(InvalidArgumentError, match="already registered"):
        PrometheusMetrics(registry=registry)
    assert _series(registry) == series
    first.unregister()
    assert _series(registry) == set()
    PrometheusMetrics(registry=registry)  # the names are free again


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="namespace"):
        PrometheusMetrics(registry=CollectorRegistry(), namespace="etcd-recipes")
    with pytest.raises(InvalidArgumentError, match="registry"):
        PrometheusMetrics(registry="default")  # type: ignore[arg-type]


def test_a_custom_namespace_prefixes_every_name() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry=registry, namespace="shop").rpc_finished("put", 0.01, 1, "ok")
    names = {name for name, _ in _series(registry)}
    assert names and all(n.startswith("shop_") for n in names), names


# -- multiprocess mode ------------------------------------------------------------------------


def _worker(index: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.contrib.prom_worker", str(index)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_multiprocess_mode_aggregates_real_worker_processes(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = [_worker(i, env) for i in range(3)]
    try:
        for w in workers:
            assert w.stdout is not None
            assert w.stdout.readline().strip() == "READY"
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        put = {"operation": "put", "outcome": "ok"}
        assert registry.get_sample_value("etcd_recipes_rpc_duration_seconds_count", put) == 6
        assert (
            registry.get_sample_value("etcd_recipes_rpc_retries_total", {"operation": "put"}) == 6
        )
        users = {"recipe": "PrefixCache", "name": "users"}
        assert registry.get_sample_value("etcd_recipes_cache_entries", users) == 10 + 20 + 30
        jobs = {"recipe": "LeaderSelector", "name": "jobs"}
        assert registry.get_sample_value("etcd_recipes_leader", jobs) == 1

        # A worker that exits (gunicorn calls mark_process_dead) leaves the live gauges.
        last = workers.pop()
        assert last.stdin is not None
        last.stdin.close()
        assert last.wait(30) == 0
        mark_process_dead(last.pid, path=str(tmp_path))
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        assert registry.get_sample_value("etcd_recipes_cache_entries", users) == 10 + 20
        # Counters and histograms keep the dead worker's counts.
        assert registry.get_sample_value("etcd_recipes_rpc_duration_seconds_count", put) == 6
    finally:
        for w in workers:
            assert w.stdin is not None
            w.stdin.close()
            w.wait(30)


# -- against a real etcd ----------------------------------------------------------------------


async def test_a_client_records_rpcs_and_lock_events(etcd_server, etcd_prefix) -> None:
    registry = CollectorRegistry()
    sink = PrometheusMetrics(registry=registry)
    resilience = ResilienceConfig(metrics=sink)
    async with connect(**etcd_server.client_kwargs(), resilience=resilience) as client:
        await client.put(etcd_prefix + "k", b"v")
        async with DistributedMutex(client, etcd_prefix + "lock") as mutex:
            assert await mutex.acquire(timeout=5)
            await mutex.release()
    assert meter_for(sink).flush(10)

    def value(metric: str, **labels: str) -> float:
        return registry.get_sample_value(metric, labels) or 0.0

    # rpc_finished (or the v1 record_rpc it replaces)
    assert value("etcd_recipes_rpc_duration_seconds_count", operation="put", outcome="ok") >= 1
    # lock_wait_finished and lock_hold_finished (emitted by DistributedMutex)
    mutex = {"recipe": "DistributedMutex", "name": ""}
    assert value("etcd_recipes_lock_wait_seconds_count", **mutex, outcome="acquired") == 1
    assert value("etcd_recipes_lock_hold_seconds_count", **mutex, ended="released") == 1
    text = generate_latest(registry).decode()
    assert etcd_prefix not in text


async def test_queue_depth_is_cached_and_refreshed_off_the_scrape(etcd_client, etcd_prefix) -> None:
    registry = CollectorRegistry()
    async with DistributedQueue(etcd_client, etcd_prefix + "q") as queue:
        await queue.enqueue_all([b"a", b"b"])
        depth = QueueDepthCollector(queue, max_staleness=2.0, registry=registry)
        labels = {"recipe": "DistributedQueue", "name": ""}

        def scrape() -> float | None:
            return registry.get_sample_value("etcd_recipes_queue_depth", labels)

        assert scrape() is None  # never read yet: no sample, and a refresh was started
        await eventually(lambda: scrape() == 2, what="the first background reading")
        await queue.enqueue(b"c")
        # Within max_staleness every scrape serves the cached reading without an RPC ...
        assert scrape() == 2
        # ... and once it is older, a scrape (here from another thread, as an HTTP exporter
        # does) starts one refresh on the queue's loop.
        await eventually(
            lambda: asyncio.to_thread(lambda: scrape() == 3), what="the refreshed depth"
        )
        assert depth.errors == 0
    # A closed queue cannot be read: failed readings are counted and, after twice
    # max_staleness, the stale sample disappears.
    await eventually(lambda: scrape() is None and depth.errors > 0, what="the sample to go")


async def test_available_permits_of_a_semaphore(etcd_client, etcd_prefix) -> None:
    registry = CollectorRegistry()
    semaphore = DistributedSemaphore(etcd_client, etcd_prefix + "sem", permits=3)
    try:
        free = AvailablePermitsCollector(semaphore, max_staleness=60, registry=registry)
        assert await free.refresh() == 3
        async with semaphore:
            assert await free.refresh() == 2
            labels = {"recipe": "DistributedSemaphore", "name": ""}
            sample = registry.get_sample_value("etcd_recipes_semaphore_available_permits", labels)
            assert sample == 2
    finally:
        await semaphore.aclose()


def test_a_blocking_queue_is_read_on_a_thread(etcd_server, etcd_prefix) -> None:
    from etcd_recipes.sync import DistributedWorkQueue
    from etcd_recipes.sync import connect as sync_connect

    registry = CollectorRegistry()
    with (
        sync_connect(**etcd_server.client_kwargs()) as client,
        DistributedWorkQueue(client, etcd_prefix + "jobs") as queue,
    ):
        queue.enqueue(b"job")
        QueueDepthCollector(queue, max_staleness=30, registry=registry)
        labels = {"recipe": "DistributedWorkQueue", "name": ""}
        asyncio.run(
            eventually(
                lambda: registry.get_sample_value("etcd_recipes_queue_depth", labels) == 1,
                what="the blocking reading",
            )
        )


async def test_collectors_reject_bad_input(etcd_client, etcd_prefix) -> None:
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    with pytest.raises(InvalidArgumentError, match="max_staleness"):
        QueueDepthCollector(queue, max_staleness=0, registry=None)
    with pytest.raises(InvalidArgumentError, match="size"):
        QueueDepthCollector(object(), registry=None)
    with pytest.raises(InvalidArgumentError, match="event loop"):
        await asyncio.to_thread(QueueDepthCollector, queue, registry=None)
