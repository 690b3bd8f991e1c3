"""ServiceDiscovery: one object for a discovery root -- its registry, one-shot queries, and
the caches and providers it hands out (and closes on ``aclose()``).

Guaranteed: ``aclose()`` closes every cache and provider it created (their failures are
recorded, never raised), then unregisters what its registry registered. Queries are one read
each; a record that does not parse is skipped (and recorded) by ``query_for_instances`` and
raises :class:`~etcd_recipes.errors.CodecError` from ``query_for_instance``.

Not guaranteed: queries are snapshots (use a cache or a provider to follow changes).
Deviation from the Kotlin library: ``query_for_names()`` returns the distinct service **names**,
not one full key per instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._core.validate import check_path_segment
from .._recipe.recipe import Recipe
from ..codecs import Codec
from ..errors import CodecError, ServiceInstanceNotFoundError
from ..events import LeaseEvent
from ._keys import names_path, service_prefix
from .cache import ServiceCache
from .instance import PayloadT, ServiceInstance
from .provider import ServiceProvider
from .registry import DEFAULT_TTL, ServiceRegistry, _lease_ttl
from .strategies import InstanceFilter, ProviderStrategy

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["ServiceDiscovery"]


class ServiceDiscovery(Recipe, Generic[PayloadT]):
    """Register, query and follow the services under ``service_path``.

    Example::

        from etcd_recipes import ServiceDiscovery, ServiceInstance

        async with ServiceDiscovery(client, f"{prefix}/services") as discovery:
            me = ServiceInstance("orders", "", address="10.0.0.7", port=8080)
            await discovery.register(me)
            assert await discovery.query_for_names() == ["orders"]
            assert (await discovery.query_for_instance("orders", me.id)).port == 8080
            async with discovery.service_provider("orders") as provider:
                assert provider.get_instance().id == me.id
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        service_path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        codec: Codec[PayloadT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
        ttl: float | None = None,
    ) -> None:
        super().__init__(client, service_path, client_id=client_id, metrics_name=metrics_name)
        self._codec = codec
        self.registry: ServiceRegistry[PayloadT] = ServiceRegistry(
            client,
            service_path,
            lease_ttl=_lease_ttl(lease_ttl, ttl, type(self).__name__),
            codec=codec,
            metrics_name=self.metrics_name,
        )
        """The registry behind ``register``/``update``/``unregister``."""
        self.registry.add_exception_listener(
            lambda context, exc: self._record_exception(exc, "registry")
        )
        self._handed: list[Recipe] = []

    def __repr__(self) -> str:
        return (
            f"<{self.exception_context} {self._lifecycle} "
            f"registered={len(self.registry.registered())} handed_out={len(self._handed)}>"
        )

    # ---------------------------------------------------------------- the registry

    async def register(self, instance: ServiceInstance[PayloadT]) -> None:
        """:meth:`ServiceRegistry.register <etcd_recipes.ServiceRegistry.register>`."""
        self._check_open()
        await self.registry.register(instance)

    async def update(self, instance: ServiceInstance[PayloadT]) -> None:
        """:meth:`ServiceRegistry.update <etcd_recipes.ServiceRegistry.update>`."""
        self._check_open()
        await self.registry.update(instance)

    async def unregister(self, instance: ServiceInstance[PayloadT]) -> None:
        """:meth:`ServiceRegistry.unregister <etcd_recipes.ServiceRegistry.unregister>`."""
        await self.registry.unregister(instance)

    def add_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with the lease events of every registration."""
        self.registry.add_lease_listener(listener)

    def remove_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self.registry.remove_lease_listener(listener)

    # ---------------------------------------------------------------- queries (one read)

    async def query_for_names(self) -> list[str]:
        """The names of the services with at least one record, sorted (one keys-only read)."""
        root = names_path(self.path) + "/"
        read = await self._client.range(root, prefix=True, keys_only=True)
        names = {kv.key_text[len(root) :].partition("/")[0] for kv in read.kvs}
        return sorted(n for n in names if n)

    async def query_for_instances(self, name: str) -> list[ServiceInstance[PayloadT]]:
        """The well-formed instances of ``name``, by id (one read); bad records are skipped
        and recorded as background exceptions."""
        prefix = service_prefix(self.path, check_path_segment(name, what="a service name"))
        read = await self._client.range(prefix, prefix=True)
        found: list[ServiceInstance[PayloadT]] = []
        for kv in read.kvs:
            try:
                found.append(self._parse(kv.key_text, kv.value, prefix, name))
            except CodecError as exc:
                self._record_exception(exc, "query")
        return found

    async def query_for_instance(self, name: str, instance_id: str) -> ServiceInstance[PayloadT]:
        """The instance ``instance_id`` of ``name`` (one read). Raises
        :class:`~etcd_recipes.errors.ServiceInstanceNotFoundError` when absent."""
        prefix = service_prefix(self.path, check_path_segment(name, what="a service name"))
        key = prefix + check_path_segment(instance_id, what="a service instance id")
        kv = await self._client.get(key)
        if kv is None:
            raise ServiceInstanceNotFoundError(f"service instance {key} is not registered")
        return self._parse(key, kv.value, prefix, name)

    def _parse(self, key: str, data: bytes, prefix: str, name: str) -> ServiceInstance[PayloadT]:
        instance = ServiceInstance.from_json(data, self._codec)
        if instance.id != key[len(prefix) :] or instance.name != name:
            raise CodecError(f"{key}: the record's name/id ({instance.name}/{instance.id}) differ")
        return instance  # type: ignore[return-value]

    # ---------------------------------------------------------------- factories

    def service_cache(
        self, name: str, *, metrics_name: str | None = None
    ) -> ServiceCache[PayloadT]:
        """A new, **unstarted** cache of ``name`` (use ``async with``), closed with the
        facade; ``metrics_name`` defaults to the facade's."""
        self._check_open()
        label = self.metrics_name if metrics_name is None else metrics_name
        cache: ServiceCache[PayloadT] = ServiceCache(
            self._client, self.path, name, codec=self._codec, metrics_name=label
        )
        self._handed.append(cache)
        return cache

    def service_provider(
        self,
        name: str,
        *,
        strategy: ProviderStrategy | None = None,
        error_threshold: int = 3,
        down_period: float = 30.0,
        error_window: float = 30.0,
        empty_grace: float = 10.0,
        instance_filter: InstanceFilter | None = None,
        metrics_name: str | None = None,
    ) -> ServiceProvider[PayloadT]:
        """A new, **unstarted** provider of ``name`` (use ``async with``), closed with the
        facade; the arguments are :class:`~etcd_recipes.ServiceProvider`'s (``metrics_name``
        defaults to the facade's)."""
        self._check_open()
        provider: ServiceProvider[PayloadT] = ServiceProvider(
            self._client,
            self.path,
            name,
            strategy=strategy,
            error_threshold=error_threshold,
            down_period=down_period,
            error_window=error_window,
            empty_grace=empty_grace,
            instance_filter=instance_filter,
            codec=self._codec,
            metrics_name=self.metrics_name if metrics_name is None else metrics_name,
        )
        self._handed.append(provider)
        return provider

    async def _do_close(self) -> None:
        handed, self._handed = self._handed, []
        for recipe in handed:
            try:
                await recipe.aclose()
            except Exception as exc:  # recorded, never raised: the registry must close too
                self._record_exception(exc, "close")
        await self.registry.aclose()
