"""A ready-made Prometheus sink for the library's metrics (extra ``prometheus``: prometheus-client).

:class:`PrometheusMetrics` turns every :class:`~etcd_recipes.EtcdMetrics` event into a
Prometheus series under ``etcd_recipes_`` (not ``etcd_``: etcd servers and kube-apiserver
export that namespace). Install it once per process and share it by every client::

    resilience = ResilienceConfig(metrics=PrometheusMetrics())

Guaranteed:

* names carry base units and the usual suffixes (``_seconds``, ``_total``); labels are the
  fixed vocabularies of :class:`~etcd_recipes.EtcdMetrics` plus ``recipe`` (a class name) and
  ``name`` (a recipe's ``metrics_name``). **Keys, paths and lease ids are never labels**, so
  the number of series does not grow with the number of locks, keys or leases;
* every gauge is set when its value changes (never read by a callback at scrape time), so the
  sink works unchanged in ``prometheus_client``'s multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``,
  gunicorn): gauges aggregate with ``livesum`` over live processes;
* the sink never raises into the library and never does I/O: the library delivers events on
  one daemon thread per sink (see ``etcd_recipes._core.metering``); a ``prometheus_client``
  update is a lock and a few additions.

Not guaranteed: every event is counted (the library drops events when a sink's queue is full,
and events still queued when the interpreter exits are lost); the opt-in
:class:`QueueDepthCollector` and :class:`AvailablePermitsCollector` read etcd, so they show a
value up to ``max_staleness`` seconds old, and they work in a single process only (a
multiprocess scrape handler does not run collectors registered in the workers).

Example::

    from prometheus_client import CollectorRegistry
    from etcd_recipes.contrib.prometheus import PrometheusMetrics

    sink = PrometheusMetrics(registry=CollectorRegistry())
    sink.lock_wait_finished("DistributedMutex", "orders", 0.02, "acquired")
    labels = {"recipe": "DistributedMutex", "name": "orders", "outcome": "acquired"}
    print(sink.registry.get_sample_value("etcd_recipes_lock_wait_seconds_count", labels))  # 1.0
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "etcd_recipes.contrib.prometheus needs prometheus-client: "
        "pip install 'etcd-recipes[prometheus]'"
    ) from exc

from .. import EtcdMetrics, InvalidArgumentError

__all__ = [
    "DURATION_BUCKETS",
    "RPC_BUCKETS",
    "AvailablePermitsCollector",
    "PrometheusMetrics",
    "QueueDepthCollector",
]

log = logging.getLogger("etcd_recipes.contrib.prometheus")

RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
"""Upper bounds (seconds) of ``etcd_recipes_rpc_duration_seconds``: 1 ms to 5 s (retries
included: a call that retried through an outage lands in the top buckets)."""

DURATION_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0, 120.0, 600.0)
"""Upper bounds (seconds) of every recipe-level histogram (lock waits and holds, barrier
waits, queue operations, cache syncs, v1 latencies): 1 ms to 10 minutes, since a lock can be
held and a queue waited on for minutes."""

_NAMESPACE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not (namespace == "" or _NAMESPACE.fullmatch(namespace)):
        raise InvalidArgumentError(
            f"namespace must be '' or a Prometheus name ([a-zA-Z_:][a-zA-Z0-9_:]*), "
            f"got {namespace!r}"
        )
    return namespace


def _register_all(registry: CollectorRegistry, collectors: Iterable[Collector]) -> None:
    """Register every collector, or none of them (a clear error instead of a half-done sink)."""
    done: list[Collector] = []
    try:
        for collector in collectors:
            registry.register(collector)
            done.append(collector)
    except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
        for collector in done:
            registry.unregister(collector)
        raise InvalidArgumentError(
            f"these metrics are already registered on this registry ({exc}); create one sink "
            "per registry and share it by every client, or pass registry=CollectorRegistry()"
        ) from exc


class PrometheusMetrics(EtcdMetrics):
    """A metrics sink that records every library event in ``prometheus_client`` metrics.

    :param registry: where the metrics are registered (default: ``prometheus_client.REGISTRY``,
        what ``start_http_server`` and ``make_asgi_app`` serve). One sink per registry: a
        second one on the same registry raises :class:`~etcd_recipes.InvalidArgumentError`.
    :param namespace: the names' prefix (default ``"etcd_recipes"``; ``""`` for none).

    The series (``<ns>`` is the namespace; the docs' observability page lists the buckets):

    ============================================  ===========  ===============================
    name                                          type         labels
    ============================================  ===========  ===============================
    ``<ns>_rpc_duration_seconds``                 histogram    operation, outcome
    ``<ns>_rpc_retries_total``                    counter      operation
    ``<ns>_watch_recoveries_total``               counter      kind
    ``<ns>_keepalive_events_total``               counter      kind
    ``<ns>_lease_lost_total``                     counter      recipe, name, kind
    ``<ns>_lock_wait_seconds``                    histogram    recipe, name, outcome
    ``<ns>_lock_hold_seconds``                    histogram    recipe, name, ended
    ``<ns>_leadership_transitions_total``         counter      recipe, name, transition
    ``<ns>_leader``                               gauge        recipe, name
    ``<ns>_partition_transitions_total``          counter      recipe, name, transition
    ``<ns>_partition_items``                      gauge        recipe, name
    ``<ns>_barrier_wait_seconds``                 histogram    recipe, name, outcome
    ``<ns>_queue_operation_seconds``              histogram    recipe, name, operation, outcome
    ``<ns>_queue_redeliveries_total``             counter      recipe, name
    ``<ns>_cache_sync_seconds``                   histogram    recipe, name, kind
    ``<ns>_cache_entries``                        gauge        recipe, name
    ``<ns>_recipe_latency_seconds``               histogram    name (the v1 latency's name)
    ============================================  ===========  ===============================

    ``<ns>_leader`` is this process's number of leading candidates of that recipe and name
    (1 while leading, 0 after stepping down or losing); ``<ns>_cache_entries`` is the sum of
    the entry counts of the caches with that recipe and name. Both are changed by the events,
    never read at scrape time, and aggregate with ``livesum`` in multiprocess mode.

    Example::

        from prometheus_client import CollectorRegistry
        from etcd_recipes import ResilienceConfig, connect
        from etcd_recipes.contrib.prometheus import PrometheusMetrics

        sink = PrometheusMetrics(registry=CollectorRegistry())
        async with connect(endpoints, resilience=ResilienceConfig(metrics=sink)) as measured:
            await measured.put(prefix + "/k", b"v")
        print(sink.registry is not None)  # True

    Events are delivered inline (:attr:`~etcd_recipes.EtcdMetrics.deliver_inline`): each
    one is an in-memory update of about a microsecond, which is cheaper than handing it to a
    thread.
    """

    deliver_inline = True

    def __init__(
        self, *, registry: CollectorRegistry | None = None, namespace: str = "etcd_recipes"
    ) -> None:
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise InvalidArgumentError(
                f"registry must be a prometheus_client CollectorRegistry, got {registry!r}"
            )
        self.namespace = _check_namespace(namespace)
        """The names' prefix."""
        self.registry: CollectorRegistry = REGISTRY if registry is None else registry
        """The registry the metrics are registered on."""
        ns = self.namespace
        recipe = ("recipe", "name")

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: Any) -> Histogram:
            return Histogram(
                name, doc, labels, namespace=ns, unit="seconds", registry=None, buckets=buckets
            )

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, namespace=ns, registry=None)

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
            return Gauge(
                name, doc, labels, namespace=ns, registry=None, multiprocess_mode="livesum"
            )

        long = DURATION_BUCKETS
        self._rpc = histogram(
            "rpc_duration", "Unary etcd RPCs, all attempts included.", ("operation", "outcome"),
            RPC_BUCKETS,
        )  # fmt: skip
        self._retries = counter("rpc_retries", "Retried RPC attempts.", ("operation",))
        self._watch = counter("watch_recoveries", "Watch recovery events.", ("kind",))
        self._keepalive = counter("keepalive_events", "Lease keep-alive events.", ("kind",))
        self._lease_lost = counter(
            "lease_lost", "Leases a recipe lost its keys with.", (*recipe, "kind")
        )
        self._lock_wait = histogram(
            "lock_wait", "Lock and semaphore acquisitions.", (*recipe, "outcome"), long
        )
        self._lock_hold = histogram(
            "lock_hold", "Holds of locks and semaphore permits.", (*recipe, "ended"), long
        )
        self._transitions = counter(
            "leadership_transitions", "Changes of a candidate's role.", (*recipe, "transition")
        )
        self._leader = gauge("leader", "Candidates of this process that lead now.", recipe)
        self._partition = counter(
            "partition_transitions", "Items a partitioner took or gave up.", (*recipe, "transition")
        )
        self._partition_items = gauge("partition_items", "Items owned now.", recipe)
        self._barrier = histogram("barrier_wait", "Barrier waits.", (*recipe, "outcome"), long)
        self._queue = histogram(
            "queue_operation", "Queue operations, waits on an empty queue included.",
            (*recipe, "operation", "outcome"), long,
        )  # fmt: skip
        self._redeliveries = counter(
            "queue_redeliveries", "Work items whose claim expired, back in the queue.", recipe
        )
        self._cache_sync = histogram(
            "cache_sync", "Full loads of a cache.", (*recipe, "kind"), long
        )
        self._cache_entries = gauge("cache_entries", "Entries held by caches.", recipe)
        self._shared_writes = counter(
            "shared_value_writes", "Writes of shared values.", (*recipe, "operation", "outcome")
        )
        self._latency = histogram(
            "recipe_latency", "Recipe-level latencies (the v1 record_latency).", ("name",), long
        )
        self._all: tuple[MetricWrapperBase, ...] = (
            self._rpc, self._retries, self._watch, self._keepalive, self._lease_lost,
            self._lock_wait, self._lock_hold, self._transitions, self._leader, self._barrier,
            self._queue, self._redeliveries, self._cache_sync, self._cache_entries,
            self._latency,
            self._shared_writes,
        )  # fmt: skip
        self._all += (self._partition, self._partition_items)
        _register_all(self.registry, self._all)
        # labels() validates and locks on every call (~2 us); the label sets are few (no key,
        # path or lease id is a label), so the children are kept: one dict lookup per event.
        self._children: dict[tuple[object, ...], Any] = {}

    def __repr__(self) -> str:
        return f"<PrometheusMetrics namespace={self.namespace!r}>"

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def unregister(self) -> None:
        """Remove this sink's metrics from its registry (a later event still updates them).

        Example::

            from prometheus_client import CollectorRegistry
            from etcd_recipes.contrib.prometheus import PrometheusMetrics

            registry = CollectorRegistry()
            PrometheusMetrics(registry=registry).unregister()
            PrometheusMetrics(registry=registry)  # the names are free again
        """
        for metric in self._all:
            try:
                self.registry.unregister(metric)
            except KeyError:
                pass

    # -- v1 -----------------------------------------------------------------------------------

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        """The v1 RPC event, recorded as :meth:`rpc_finished` with outcome ``ok``/``error``."""
        self.rpc_finished(op, duration, attempts, "error" if failed else "ok")

    def increment_watch_recovery(self, kind: str, key: bytes) -> None:
        """Counts ``<ns>_watch_recoveries_total{kind}`` (``key`` is not a label)."""
        self._watch.labels(kind).inc()

    def increment_keep_alive(self, kind: str, lease_id: int) -> None:
        """Counts ``<ns>_keepalive_events_total{kind}`` (``lease_id`` is not a label)."""
        self._keepalive.labels(kind).inc()

    def record_latency(self, name: str, seconds: float) -> None:
        """Observes ``<ns>_recipe_latency_seconds{name}``."""
        self._child(self._latency, name).observe(seconds)

    # -- v2 -----------------------------------------------------------------------------------

    def rpc_finished(self, operation: str, duration: float, attempts: int, outcome: str) -> None:
        """Observes ``<ns>_rpc_duration_seconds`` and adds ``attempts - 1`` retries."""
        self._child(self._rpc, operation, outcome).observe(duration)
        if attempts > 1:
            self._retries.labels(operation).inc(attempts - 1)

    def lease_lost(self, recipe: str, name: str, kind: str) -> None:
        """Counts ``<ns>_lease_lost_total``."""
        self._lease_lost.labels(recipe, name, kind).inc()

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """Observes ``<ns>_lock_wait_seconds``."""
        self._child(self._lock_wait, recipe, name, outcome).observe(duration)

    def lock_hold_finished(self, recipe: str, name: str, duration: float, ended: str) -> None:
        """Observes ``<ns>_lock_hold_seconds``."""
        self._child(self._lock_hold, recipe, name, ended).observe(duration)

    def partition_changed(self, recipe: str, name: str, transition: str) -> None:
        """Counts the transition and moves ``<ns>_partition_items``: +1 on ``assigned``, -1
        on ``released`` and ``lost``."""
        self._partition.labels(recipe, name, transition).inc()
        if transition == "assigned":
            self._partition_items.labels(recipe, name).inc()
        elif transition in ("released", "lost"):
            self._partition_items.labels(recipe, name).dec()

    def leadership_changed(self, recipe: str, name: str, transition: str) -> None:
        """Counts the transition and moves ``<ns>_leader``: +1 on ``acquired``, -1 otherwise."""
        self._transitions.labels(recipe, name, transition).inc()
        if transition == "acquired":
            self._leader.labels(recipe, name).inc()
        elif transition in ("relinquished", "lost"):
            self._leader.labels(recipe, name).dec()

    def barrier_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """Observes ``<ns>_barrier_wait_seconds``."""
        self._barrier.labels(recipe, name, outcome).observe(duration)

    def queue_operation(
        self, recipe: str, name: str, operation: str, duration: float, outcome: str
    ) -> None:
        """Observes ``<ns>_queue_operation_seconds``."""
        self._child(self._queue, recipe, name, operation, outcome).observe(duration)

    def queue_redelivered(self, recipe: str, name: str, count: int) -> None:
        """Adds ``count`` to ``<ns>_queue_redeliveries_total``."""
        self._redeliveries.labels(recipe, name).inc(count)

    def cache_synced(self, recipe: str, name: str, kind: str, duration: float, size: int) -> None:
        """Observes ``<ns>_cache_sync_seconds`` (its ``_count`` is the number of loads)."""
        self._cache_sync.labels(recipe, name, kind).observe(duration)

    def cache_size_changed(self, recipe: str, name: str, delta: int) -> None:
        """Moves ``<ns>_cache_entries`` by ``delta``."""
        self._cache_entries.labels(recipe, name).inc(delta)

    def shared_value_written(self, recipe: str, name: str, operation: str, outcome: str) -> None:
        """Counts ``<ns>_shared_value_writes_total``."""
        self._child(self._shared_writes, recipe, name, operation, outcome).inc()


# -- opt-in collectors that read etcd ----------------------------------------------------------


class _CachedReading(Collector):
    """A gauge family read from a recipe at most every ``max_staleness`` seconds.

    A scrape returns the last reading at once; when it is older than ``max_staleness`` the
    scrape starts one refresh (on the recipe's event loop for an async recipe, on a short-lived
    thread for a blocking :mod:`etcd_recipes.sync` one) and does not wait for it."""

    _metric = ""
    _doc = ""
    _method = ""

    def __init__(
        self,
        recipe: Any,
        *,
        max_staleness: float,
        registry: CollectorRegistry | None,
        namespace: str,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        reader = getattr(recipe, self._method, None)
        if not callable(reader):
            raise InvalidArgumentError(
                f"{type(self).__name__}: {recipe!r} has no {self._method}() method"
            )
        if (
            isinstance(max_staleness, bool)
            or not isinstance(max_staleness, (int, float))
            or not 0 < max_staleness < float("inf")
        ):
            raise InvalidArgumentError(
                f"max_staleness must be finite seconds > 0, got {max_staleness!r}"
            )
        self.recipe = recipe
        """The recipe read."""
        self.max_staleness = float(max_staleness)
        """Seconds a reading is served before a scrape starts the next one."""
        self.name = f"{_check_namespace(namespace)}_{self._metric}".lstrip("_")
        """The gauge's name."""
        self._reader = reader
        self._is_async = inspect.iscoroutinefunction(reader)
        if self._is_async and loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise InvalidArgumentError(
                    f"{type(self).__name__}: create it on the recipe's event loop, or pass loop="
                ) from None
        self._loop = loop
        self._labels = [type(recipe).__name__, str(getattr(recipe, "metrics_name", ""))]
        self._lock = threading.Lock()
        self._value: float | None = None
        self._read_at = -float("inf")
        self._refreshing = False
        self._refresh_started = -float("inf")
        self.errors = 0
        """How many readings failed (the last good value is served until it is too old)."""
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Any]:
        # No names: several collectors of one kind (one per recipe) can share a registry.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            now = time.monotonic()
            stale = now - self._read_at >= self.max_staleness
            # A refresh that never reported back (its loop stopped) does not block the next.
            busy = self._refreshing and now - self._refresh_started < 2 * self.max_staleness
            start = stale and not busy
            if start:
                self._refreshing, self._refresh_started = True, now
            value, read_at = self._value, self._read_at
        if start:
            self._start_refresh()
        if value is None or time.monotonic() - read_at >= 2 * self.max_staleness:
            return  # never read, or the last good reading is too old to show
        family = GaugeMetricFamily(self.name, self._doc, labels=["recipe", "name"])
        family.add_metric(self._labels, value)
        yield family

    def _start_refresh(self) -> None:
        try:
            if not self._is_async:
                threading.Thread(target=self._refresh_blocking, daemon=True).start()
                return
            loop = self._loop
            assert loop is not None
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(self.refresh())
            else:
                asyncio.run_coroutine_threadsafe(self.refresh(), loop)
        except Exception:  # a closed loop, no threads left: serve nothing new
            with self._lock:
                self._refreshing = False

    def _store(self, value: float | None) -> None:
        with self._lock:
            if value is None:
                self.errors += 1
            else:
                self._value, self._read_at = value, time.monotonic()
            self._refreshing = False

    def _failed(self, exc: Exception) -> None:
        log.debug("%s: reading %r failed: %r", type(self).__name__, self.recipe, exc)
        self._store(None)

    def _refresh_blocking(self) -> None:
        try:
            value = float(self._reader())
        except Exception as exc:  # a background read: counted, never raised into a scrape
            self._failed(exc)
        else:
            self._store(value)

    async def refresh(self) -> float | None:
        """Read the value now (one RPC) and keep it; ``None`` when the read failed.

        Scrapes call it when the reading is stale; call it once after creating the collector
        so the first scrape has a value. An async recipe only."""
        try:
            value = float(await self._reader())
        except Exception as exc:  # EtcdRecipeError, RecipeClosedError...: counted
            self._failed(exc)
            return None
        self._store(value)
        return value


class QueueDepthCollector(_CachedReading):
    """Opt-in gauge ``etcd_recipes_queue_depth{recipe,name}``: a queue's ``size()``, cached.

    ``queue`` is a :class:`~etcd_recipes.DistributedQueue`,
    :class:`~etcd_recipes.DistributedPriorityQueue` or
    :class:`~etcd_recipes.DistributedWorkQueue` (ready items only), async or from
    :mod:`etcd_recipes.sync`. A scrape serves the last reading and, when it is older than
    ``max_staleness`` seconds, starts one count read in the background without waiting for
    it: at most one RPC per ``max_staleness``, however often Prometheus scrapes. No sample is
    shown before the first reading, nor once readings have failed for ``2 * max_staleness``.

    **Single process only**: in multiprocess mode the scrape handler's collector reads the
    workers' files, not their collectors. Give each queue its own ``metrics_name`` (two
    collectors with the same ``recipe`` and ``name`` give duplicate series). An async queue's
    collector must be created on its event loop (or given ``loop=``); ``registry=None``
    registers it nowhere.

    Example::

        from prometheus_client import CollectorRegistry, generate_latest
        from etcd_recipes import DistributedQueue
        from etcd_recipes.contrib.prometheus import QueueDepthCollector

        registry = CollectorRegistry()
        async with DistributedQueue(client, f"{prefix}/q") as queue:
            await queue.enqueue(b"job")
            depth = QueueDepthCollector(queue, max_staleness=10, registry=registry)
            await depth.refresh()
            print(generate_latest(registry).decode().splitlines()[-1])
            # etcd_recipes_queue_depth{name="",recipe="DistributedQueue"} 1.0
    """

    _metric = "queue_depth"
    _doc = "Items waiting in a queue (a cached count read)."
    _method = "size"

    def __init__(
        self,
        queue: Any,
        *,
        max_staleness: float = 15.0,
        registry: CollectorRegistry | None = REGISTRY,
        namespace: str = "etcd_recipes",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(
            queue, max_staleness=max_staleness, registry=registry, namespace=namespace, loop=loop
        )


class AvailablePermitsCollector(_CachedReading):
    """Opt-in gauge ``etcd_recipes_semaphore_available_permits{recipe,name}``, cached.

    A :class:`~etcd_recipes.DistributedSemaphore`'s ``available_permits()`` (``permits`` minus
    holders and waiters; async or from :mod:`etcd_recipes.sync`), read and served exactly like
    :class:`QueueDepthCollector` (at most one RPC per ``max_staleness`` seconds; **single
    process only**; one ``metrics_name`` per semaphore).

    Example::

        from prometheus_client import CollectorRegistry
        from etcd_recipes import DistributedSemaphore
        from etcd_recipes.contrib.prometheus import AvailablePermitsCollector

        semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=3)
        async with semaphore:
            free = AvailablePermitsCollector(semaphore, registry=CollectorRegistry())
            print(await free.refresh())  # 2.0
        await semaphore.aclose()
    """

    _metric = "semaphore_available_permits"
    _doc = "Free permits of a semaphore (a cached count read)."
    _method = "available_permits"

    def __init__(
        self,
        semaphore: Any,
        *,
        max_staleness: float = 15.0,
        registry: CollectorRegistry | None = REGISTRY,
        namespace: str = "etcd_recipes",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(
            semaphore,
            max_staleness=max_staleness,
            registry=registry,
            namespace=namespace,
            loop=loop,
        )
