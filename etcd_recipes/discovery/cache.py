"""ServiceCache: the live instances of one service, from a PrefixCache of its records.

A :class:`~etcd_recipes.PrefixCache` of ``<service_path>/names/<name>/`` whose values are
decoded into :class:`~etcd_recipes.ServiceInstance` s, so it inherits the cache's guarantees:
a snapshot at one revision, a watch from the snapshot's revision + 1 on the client's shared
stream, a resync that reports the difference after compaction or a restore, and no I/O on
reads.

Guaranteed: :meth:`ServiceCache.instances` holds only well-formed records of this service --
a record that does not parse, names another service, or whose JSON ``id`` is not its key's
last segment (a duplicated or copied record) is **skipped** and recorded once as a background
exception; the cache goes on.

Metrics: the cache's loads and entry counts (``cache_synced``, ``cache_size_changed``) are
reported by the :class:`~etcd_recipes.PrefixCache` under it, with the recipe label
``PrefixCache`` and this cache's ``metrics_name``.

Not guaranteed: freshness beyond the watch's (an instance that just died is listed until its
lease expires); while the connection is down the cache serves what it last saw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._core.streams import DEFAULT_STREAM_BUFFER, EventStream
from .._core.validate import check_path_segment
from .._recipe.recipe import Recipe
from ..caches.events import CacheBatch
from ..caches.prefix import PrefixCache
from ..codecs import Codec
from ..errors import CodecError
from ..events import WatchRecoveryEvent
from ._keys import service_prefix
from .instance import PayloadT, ServiceInstance

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["ServiceCache"]


class _InstanceCodec(Generic[PayloadT]):
    """Record bytes <-> ServiceInstance, the payload through the user's codec."""

    def __init__(self, codec: Codec[PayloadT] | None) -> None:
        self._codec = codec

    def encode(self, value: ServiceInstance[PayloadT]) -> bytes:
        return value.to_json(self._codec)

    def decode(self, data: bytes) -> ServiceInstance[PayloadT]:
        return ServiceInstance.from_json(data, self._codec)  # type: ignore[return-value]


class ServiceCache(Recipe, Generic[PayloadT]):
    """The instances of service ``name`` under ``service_path``, kept current by a watch.

    Example::

        from etcd_recipes import ServiceCache, ServiceInstance, ServiceRegistry

        async with (
            ServiceRegistry(client, f"{prefix}/services") as registry,
            ServiceCache(client, f"{prefix}/services", "orders") as cache,
        ):
            me = ServiceInstance("orders", "", address="10.0.0.7", port=8080)
            await registry.register(me)
            await cache.wait_for_revision((await client.get(registry.key_of(me))).mod_revision)
            assert [i.id for i in cache.instances()] == [me.id]  # no I/O
    """

    def __init__(
        self,
        client: EtcdClient,
        service_path: str,
        name: str,
        *,
        codec: Codec[PayloadT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        self.name: str = check_path_segment(name, what="a service name")
        """The service whose instances are cached."""
        path = service_prefix(service_path, name)
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.service_path: str = service_path
        """The discovery root (the registry's ``service_path``)."""
        self._cache: PrefixCache[ServiceInstance[PayloadT]] = PrefixCache(
            client, self.path, codec=_InstanceCodec(codec), metrics_name=metrics_name
        )
        self._cache.add_exception_listener(self._inner_failed)
        self._cache.add_connection_state_listener(lambda new, old: self._set_state(new))
        self._snap_revision = -1
        self._snap_resyncs = -1
        self._snap: tuple[ServiceInstance[PayloadT], ...] = ()
        self._reported: set[tuple[str, int]] = set()

    def __repr__(self) -> str:
        return (
            f"<{self.exception_context} {self._lifecycle} instances={len(self._snapshot())} "
            f"revision={self._cache.revision} {self._state.value}>"
        )

    # ---------------------------------------------------------------- reads (no I/O)

    def instances(self) -> list[ServiceInstance[PayloadT]]:
        """The well-formed instances, by key (id). No I/O."""
        return list(self._snapshot())

    def get(self, instance_id: str) -> ServiceInstance[PayloadT] | None:
        """The instance with ``instance_id``, or ``None``. No I/O."""
        for instance in self._snapshot():
            if instance.id == instance_id:
                return instance
        return None

    def __len__(self) -> int:
        return len(self._snapshot())

    @property
    def revision(self) -> int:
        """The revision the cache reflects."""
        return self._cache.revision

    @property
    def is_synced(self) -> bool:
        """Whether the cache is loaded and its watch live."""
        return self._cache.is_synced

    async def wait_for_revision(self, revision: int, timeout: float | None = 10.0) -> int:
        """Wait until the cache reflects ``revision`` (see
        :meth:`PrefixCache.wait_for_revision <etcd_recipes.PrefixCache.wait_for_revision>`)."""
        return await self._cache.wait_for_revision(revision, timeout)

    def _snapshot(self) -> tuple[ServiceInstance[PayloadT], ...]:
        """The instances, rebuilt only after the cache changed (every change moves its
        revision or, for a re-read, its resync count): the hot path of ``get_instance()``."""
        cache = self._cache
        if cache.revision != self._snap_revision or cache.resync_count != self._snap_resyncs:
            self._snap_revision, self._snap_resyncs = cache.revision, cache.resync_count
            self._snap = self._build()
        return self._snap

    def _build(self) -> tuple[ServiceInstance[PayloadT], ...]:
        found: list[ServiceInstance[PayloadT]] = []
        start = len(self.path)
        for entry in self._cache.entries():
            instance = entry.value
            if entry.error is not None or instance is None:
                continue  # recorded by the cache when it was decoded
            segment = entry.key[start:]
            if instance.id == segment and instance.name == self.name:
                found.append(instance)
                continue
            mark = (entry.key, entry.mod_revision)
            if mark not in self._reported:
                self._reported.add(mark)
                self._record_exception(
                    CodecError(
                        f"{entry.key}: a record of {instance.name!r} with id {instance.id!r} "
                        "is not this key's (copied or hand-written?); skipped"
                    ),
                    "record",
                )
        return tuple(found)

    def _inner_failed(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rpartition(":")[2] or "cache")

    # ---------------------------------------------------------------- events

    def events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[CacheBatch[ServiceInstance[PayloadT]]]:
        """The record changes, one :class:`~etcd_recipes.CacheBatch` per revision, as an
        async iterator starting with an ``INITIAL`` batch (see
        :meth:`PrefixCache.events <etcd_recipes.PrefixCache.events>`). Events carry the
        decoded instance as ``value`` (``None`` for a record that did not parse).

        Example::

            from etcd_recipes import ServiceCache, ServiceInstance, ServiceRegistry

            async with (
                ServiceRegistry(client, f"{prefix}/services") as registry,
                ServiceCache(client, f"{prefix}/services", "orders") as cache,
            ):
                events = cache.events()
                assert len(await anext(events)) == 0  # INITIAL: nothing registered yet
                await registry.register(ServiceInstance("orders", "", port=8080))
                (event,) = await anext(events)
                assert event.value.port == 8080
        """
        return self._cache.events(maxsize)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the cache's watch (``WatchSuspended``,
        ``WatchResubscribed``, ``WatchResynced``, ``WatchFailed``); see
        :meth:`PrefixCache.recovery_events <etcd_recipes.PrefixCache.recovery_events>`."""
        return self._cache.recovery_events(maxsize)

    def add_listener(
        self, listener: Callable[[CacheBatch[ServiceInstance[PayloadT]]], Any]
    ) -> None:
        """Call ``listener(batch)`` for every batch, in order, from a task of its own."""
        self._cache.add_listener(listener)

    def remove_listener(
        self, listener: Callable[[CacheBatch[ServiceInstance[PayloadT]]], Any]
    ) -> None:
        """Stop calling ``listener``."""
        self._cache.remove_listener(listener)

    # ---------------------------------------------------------------- lifecycle

    async def _do_start(self) -> None:
        await self._cache.start()

    async def _do_close(self) -> None:
        await self._cache.aclose()
