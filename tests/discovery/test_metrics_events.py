"""Discovery's metrics against a real etcd: the provider's stale latency through the meter,
a registration's lease loss as ``lease_lost``, and ``metrics_name`` on every recipe (the
facade passing its own on to what it creates)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    InvalidArgumentError,
    LeaseRestored,
    NamingEndpoints,
    ServiceCache,
    ServiceDiscovery,
    ServiceInstance,
    ServiceProvider,
    ServiceRegistry,
)
from tests.helpers import eventually


async def test_the_provider_reports_how_long_it_served_a_stale_list(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "services"
    base = f"{path}/names/orders/"
    first = ServiceInstance("orders", "", port=80)
    await client.put(base + first.id, first.to_json())
    provider = ServiceProvider(client, path, "orders", empty_grace=30, metrics_name="orders")
    async with provider:
        await client.delete(base + first.id)
        await eventually(lambda: provider.is_stale, what="stale")
        assert sink.of("record_latency") == [("cache.start",)]  # still stale: not reported yet
        second = ServiceInstance("orders", "", port=81)
        await client.put(base + second.id, second.to_json())
        await eventually(lambda: not provider.is_stale, what="fresh again")
    assert sink.of("record_latency") == [("cache.start",), ("discovery.stale",)]
    # Its cache's loads and sizes come from the PrefixCache under it, with the same name.
    assert sink.of("cache_synced") == [("PrefixCache", "orders", "initial", 1)]
    assert sum(int(str(c[2])) for c in sink.of("cache_size_changed")) == 0  # closed


async def test_a_registration_lease_loss_is_lease_lost(metered, etcd_prefix):
    client, sink = metered
    async with ServiceRegistry(client, etcd_prefix + "services", metrics_name="web") as registry:
        me = ServiceInstance("web", "", port=80)
        await registry.register(me)
        events = registry.lease_events()
        await client.lease_revoke(registry.lease_id(me))  # out of band: the record goes
        while not isinstance(await asyncio.wait_for(anext(events), 10), LeaseRestored):
            pass
        await events.aclose()
    assert sink.of("lease_lost") == [("ServiceRegistry", "web", "expired")]


async def test_metrics_name_everywhere(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "services"
    async with ServiceDiscovery(client, path, metrics_name="disc") as discovery:
        assert discovery.registry.metrics_name == "disc"
        assert discovery.service_cache("a").metrics_name == "disc"
        assert discovery.service_cache("a", metrics_name="mine").metrics_name == "mine"
        assert discovery.service_provider("a").metrics_name == "disc"
        assert discovery.service_provider("a", metrics_name="p").metrics_name == "p"
    assert ServiceCache(client, path, "a", metrics_name="c").metrics_name == "c"
    view = NamingEndpoints(client, etcd_prefix + "grpc/echo", metrics_name="echo")
    async with view:
        pass
    assert sink.of("cache_synced") == [("PrefixCache", "echo", "initial", 0)]
    with pytest.raises(InvalidArgumentError):
        ServiceRegistry(client, path, metrics_name=42)  # type: ignore[arg-type]
