"""ServiceProvider: one instance of a service per call, from a live cache, with no I/O.

``get_instance()`` is synchronous: a strategy's pick among the *available* instances -- the
cached ones that are ``enabled``, pass ``instance_filter`` and are not **down**.

Down-instance policy: ``note_error(instance)`` counts an error against the instance's **id**
(not its value, as the Kotlin library does: an update of the payload keeps the count, and two
instances with identical fields are not confused); ``error_threshold`` errors within
``error_window`` seconds take it out for ``down_period`` seconds, after which it is available
again by itself.

Empty-snapshot protection: when the cached list drops from non-empty to **empty** (a resync
that found nothing, a burst of lease expiries after a partition, an etcd restored from an old
backup), the provider keeps serving the instances that left in that burst (within 3 s of each
other: the list as it was before, not only its last survivor) for ``empty_grace`` seconds,
``is_stale`` is ``True`` meanwhile, a warning is logged, and the time spent stale is reported
to the metrics hook as latency ``"discovery.stale"``. Any instance coming back ends it.

Guaranteed: ``get_instance()`` never returns an instance inside its down window, nor (outside
the grace) one that is not cached; ``instance_lists()`` yields the available list now and
then each change (conflated: a slow reader skips to the newest).

Not guaranteed: the instance returned is alive (it may have died since its lease's last
renewal); ``empty_grace`` also delays the end of a service whose last instance was
unregistered on purpose (set ``empty_grace=0`` where that matters more than a hiccup).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._core.logctx import library_logger
from .._core.streams import Broadcast, EventStream
from .._core.validate import check_count, check_duration
from .._recipe.recipe import Recipe
from ..codecs import Codec
from ..errors import EventStreamOverflowError, InvalidArgumentError, NoInstancesError
from .cache import ServiceCache
from .instance import PayloadT, ServiceInstance
from .strategies import InstanceFilter, ProviderStrategy, RoundRobinStrategy

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["ServiceProvider"]

log = library_logger("etcd_recipes.discovery")

_MAX_NAP = 1.0  # seconds the follower sleeps at most between checks of its timers
_BURST_WINDOW = 3.0  # seconds: departures this close together count as one burst


class ServiceProvider(Recipe, Generic[PayloadT]):
    """Picks an instance of service ``name`` per call (``get_instance()``, no I/O), from an
    owned :class:`~etcd_recipes.ServiceCache`.

    ``strategy`` defaults to a new :class:`~etcd_recipes.RoundRobinStrategy`;
    ``error_threshold`` errors (``note_error``) within ``error_window`` seconds take an
    instance out for ``down_period`` seconds; ``empty_grace`` seconds of empty-snapshot
    protection (0: off); ``instance_filter`` keeps only the instances it accepts.

    Example::

        from etcd_recipes import ServiceInstance, ServiceProvider, ServiceRegistry

        path = f"{prefix}/services"
        async with ServiceRegistry(client, path) as registry:
            for port in (8081, 8082):
                await registry.register(ServiceInstance("orders", "", port=port))
            async with ServiceProvider(client, path, "orders") as provider:
                picked = [provider.get_instance().port for _ in range(4)]
                assert sorted(picked) == [8081, 8081, 8082, 8082]  # round-robin
                victim = provider.get_instance()
                for _ in range(3):
                    provider.note_error(victim)  # 3 errors: out for down_period
                assert all(provider.get_instance().id != victim.id for _ in range(4))
    """

    def __init__(
        self,
        client: EtcdClient,
        service_path: str,
        name: str,
        *,
        strategy: ProviderStrategy | None = None,
        error_threshold: int = 3,
        down_period: float = 30.0,
        error_window: float = 30.0,
        empty_grace: float = 10.0,
        instance_filter: InstanceFilter | None = None,
        codec: Codec[PayloadT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        cache: ServiceCache[PayloadT] = ServiceCache(
            client, service_path, name, codec=codec, metrics_name=metrics_name
        )
        super().__init__(client, cache.path, client_id=client_id, metrics_name=metrics_name)
        self.name: str = cache.name
        """The service this provider picks instances of."""
        self.service_path: str = service_path
        """The discovery root."""
        if strategy is not None and not callable(getattr(strategy, "select", None)):
            raise InvalidArgumentError("strategy must have a select(instances) method")
        if instance_filter is not None and not callable(instance_filter):
            raise InvalidArgumentError("instance_filter must be callable")
        self.strategy: ProviderStrategy = strategy if strategy is not None else RoundRobinStrategy()
        """The strategy ``get_instance()`` uses."""
        self.error_threshold: int = check_count(error_threshold, what="error_threshold")
        """Errors within ``error_window`` that take an instance out."""
        self.down_period: float = check_duration(down_period, what="down_period")
        """Seconds an instance stays out once it reached the threshold."""
        self.error_window: float = check_duration(error_window, what="error_window")
        """Seconds within which ``error_threshold`` errors must fall."""
        self.empty_grace: float = check_duration(empty_grace, what="empty_grace", inclusive=True)
        """Seconds the last non-empty list is served after the cache went empty (0: off)."""
        self._filter = instance_filter
        self._cache = cache
        cache.add_exception_listener(lambda context, exc: self._record_exception(exc, "cache"))
        cache.add_connection_state_listener(lambda new, old: self._set_state(new))
        self._clock: Callable[[], float] = time.monotonic
        self._source: tuple[ServiceInstance[PayloadT], ...] | None = None
        self._base: tuple[ServiceInstance[PayloadT], ...] = ()
        self._stale: tuple[ServiceInstance[PayloadT], ...] | None = None
        self._stale_since = 0.0
        self._stale_until = 0.0
        self._available: tuple[ServiceInstance[PayloadT], ...] = ()
        self._published: tuple[tuple[str, ServiceInstance[PayloadT]], ...] | None = None
        self._down: dict[str, float] = {}
        self._gone: dict[str, tuple[float, ServiceInstance[PayloadT]]] = {}
        self._error_times: dict[str, deque[float]] = {}
        self._next_check = math.inf
        self._lists: Broadcast[tuple[ServiceInstance[PayloadT], ...]] = Broadcast(
            "instance-lists", self._record_listener_error, current=self._current_list
        )

    def __repr__(self) -> str:
        stale = " stale" if self._stale is not None else ""
        return (
            f"<{self.exception_context} {self._lifecycle} available={len(self._available)} "
            f"down={len(self._down)}{stale} {self._state.value}>"
        )

    # ---------------------------------------------------------------- reads (no I/O)

    def get_instance(self) -> ServiceInstance[PayloadT]:
        """An available instance, picked by the strategy. No I/O.

        Raises :class:`~etcd_recipes.errors.NoInstancesError` when none is available, and
        :class:`~etcd_recipes.errors.NotStartedError` before ``start()``."""
        if self._lifecycle != "started":
            self._check_started()
        now = self._clock()
        if now >= self._next_check or self._cache._snapshot() is not self._source:
            self._refresh(now)
        picked = self.strategy.select(self._available)
        if picked is None:
            raise NoInstancesError(
                f"no instances available for service {self.name!r}"
                f" ({len(self._base)} cached, {len(self._down)} down)",
                service=self.name,
            )
        return picked

    def instances(self) -> list[ServiceInstance[PayloadT]]:
        """The available instances (what ``get_instance()`` picks from), by id. No I/O."""
        self._check_started()
        now = self._clock()
        if now >= self._next_check or self._cache._snapshot() is not self._source:
            self._refresh(now)
        return list(self._available)

    def all_instances(self) -> list[ServiceInstance[PayloadT]]:
        """Every cached instance of the service, down, disabled and filtered-out ones
        included. No I/O."""
        return self._cache.instances()

    @property
    def is_stale(self) -> bool:
        """Whether empty-snapshot protection is serving the last non-empty list."""
        if self._stale is not None and self._clock() >= self._stale_until:
            self._refresh(self._clock())
        return self._stale is not None

    def is_down(self, instance: ServiceInstance[PayloadT]) -> bool:
        """Whether ``instance`` (by id) is inside its down window now."""
        return self._down.get(instance.id, -math.inf) > self._clock()

    # ---------------------------------------------------------------- errors

    def note_error(self, instance: ServiceInstance[PayloadT]) -> None:
        """Count an error (a failed connect, a 5xx) against ``instance`` (by id); at
        ``error_threshold`` errors within ``error_window`` seconds it is out for
        ``down_period`` seconds. No I/O; never raises for an unknown instance."""
        if not isinstance(instance, ServiceInstance):
            raise InvalidArgumentError(f"expected a ServiceInstance, got {type(instance).__name__}")
        now = self._clock()
        errors = self._error_times.setdefault(instance.id, deque())
        errors.append(now)
        horizon = now - self.error_window
        while errors and errors[0] <= horizon:
            errors.popleft()
        if len(errors) >= self.error_threshold:
            del self._error_times[instance.id]
            self._down[instance.id] = now + self.down_period
            log.warning(
                "%s: %s had %d errors within %.1fs; out for %.1fs",
                self.exception_context,
                instance.id,
                self.error_threshold,
                self.error_window,
                self.down_period,
            )
            self._refresh(now)

    # ---------------------------------------------------------------- lists

    def instance_lists(
        self, maxsize: int = 1
    ) -> EventStream[tuple[ServiceInstance[PayloadT], ...]]:
        """The available list now (once started), then each changed list, as an async
        iterator. Conflated: a reader that falls behind gets the newest list, never a
        backlog (it never overflows). Ends when the provider is closed.

        Example::

            from etcd_recipes import ServiceInstance, ServiceProvider, ServiceRegistry

            path = f"{prefix}/services"
            async with (
                ServiceRegistry(client, path) as registry,
                ServiceProvider(client, path, "orders") as provider,
            ):
                lists = provider.instance_lists()
                assert await anext(lists) == ()  # nothing registered yet
                await registry.register(ServiceInstance("orders", "", port=8080))
                assert [i.port for i in await anext(lists)] == [8080]
        """
        return self._lists.stream(maxsize, conflate=True)

    def _current_list(self) -> tuple[ServiceInstance[PayloadT], ...] | None:
        return self._available if self._lifecycle == "started" else None

    def _refresh(self, now: float) -> None:
        """Recompute the available list from the cache, the down windows and the grace."""
        if self._lifecycle == "closed":
            return  # the cache is being cleared: that is no empty snapshot
        source = self._cache._snapshot()
        if source is not self._source:
            had = bool(self._source)
            self._source = source
            base = tuple(
                i for i in source if i.enabled and (self._filter is None or self._filter(i))
            )
            self._note_departures(now, source)
            if source:
                if self._stale is not None:
                    self._end_stale(now, "instances are back")
            elif had and self.empty_grace > 0 and self._stale is None and self._gone:
                # The burst: every available instance that left within the burst window.
                self._stale = tuple(i for _, (_, i) in sorted(self._gone.items()))
                self._stale_since, self._stale_until = now, now + self.empty_grace
                log.warning(
                    "%s: the instance list went empty (cache %s); serving the last %d "
                    "instances for %.1fs, marked stale",
                    self.exception_context,
                    "synced" if self._cache.is_synced else "not synced",
                    len(self._stale),
                    self.empty_grace,
                )
            self._base = base
        if self._stale is not None and now >= self._stale_until:
            self._end_stale(now, "the grace period passed; no instances")
        next_check = math.inf
        for instance_id, until in list(self._down.items()):
            if until <= now:
                del self._down[instance_id]
            else:
                next_check = min(next_check, until)
        if self._stale is not None:
            next_check = min(next_check, self._stale_until)
        self._next_check = next_check
        pool = self._stale if self._stale is not None else self._base
        down = self._down
        self._available = tuple(i for i in pool if i.id not in down) if down else pool
        marks = tuple((i.id, i) for i in self._available)
        if marks != self._published:
            self._published = marks
            if self._lifecycle == "started":
                self._lists.publish(self._available)

    def _note_departures(self, now: float, source: tuple[ServiceInstance[PayloadT], ...]) -> None:
        """Remember the available instances that left the cache within the burst window
        (what empty-snapshot protection serves); forget those that came back."""
        present = {i.id for i in source}
        for instance in self._base:
            if instance.id not in present and instance.id not in self._gone:
                self._gone[instance.id] = (now, instance)
        horizon = now - _BURST_WINDOW
        for instance_id, (left, _) in list(self._gone.items()):
            if instance_id in present or left < horizon:
                del self._gone[instance_id]

    def _end_stale(self, now: float, why: str) -> None:
        self._stale = None
        log.warning("%s: stale instance list dropped: %s", self.exception_context, why)
        self._meter.latency("discovery.stale", now - self._stale_since)

    # ---------------------------------------------------------------- lifecycle

    async def _do_start(self) -> None:
        stream = self._cache.events(maxsize=1000)
        try:
            await self._cache.start()
        except BaseException:
            await stream.aclose()
            raise
        self._refresh(self._clock())
        self._lifecycle = "started"  # so the first list is published to early readers
        self._lists.publish(self._available)
        self._spawn(self._follow(stream), "follow")

    async def _follow(self, stream: EventStream[Any]) -> None:
        while True:
            nap = min(_MAX_NAP, max(0.0, self._next_check - self._clock()))
            try:
                await asyncio.wait_for(anext(stream), nap)
            except asyncio.TimeoutError:
                pass
            except StopAsyncIteration:
                return
            except EventStreamOverflowError:
                stream = self._cache.events(maxsize=1000)
            self._refresh(self._clock())

    async def _do_close(self) -> None:
        with contextlib.suppress(Exception):
            await self._cache.aclose()
        self._down.clear()
        self._error_times.clear()
        await self._lists.aclose()
