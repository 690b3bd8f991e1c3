"""ServiceDiscovery: queries, the caches and providers it hands out (closed with it), bad
records in a one-shot query, and the blocking facade's twins."""

from __future__ import annotations

import pytest

from etcd_recipes import (
    JSON,
    CodecError,
    ServiceDiscovery,
    ServiceInstance,
    ServiceInstanceNotFoundError,
)
from etcd_recipes import sync as blocking


async def test_queries_and_factories(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    discovery = ServiceDiscovery(etcd_client, path, codec=JSON)
    async with discovery:
        a = ServiceInstance("orders", {"n": 1}, port=8081)
        b = ServiceInstance("orders", {"n": 2}, port=8082)
        c = ServiceInstance("billing", {"n": 3}, port=9000)
        for instance in (a, b, c):
            await discovery.register(instance)
        assert await discovery.query_for_names() == ["billing", "orders"]
        found = await discovery.query_for_instances("orders")
        assert sorted(i.id for i in found) == sorted([a.id, b.id])
        assert (await discovery.query_for_instance("billing", c.id)).payload == {"n": 3}
        with pytest.raises(ServiceInstanceNotFoundError):
            await discovery.query_for_instance("billing", "missing")
        cache = discovery.service_cache("orders")
        provider = discovery.service_provider("orders", error_threshold=1)
        await cache.start()
        await provider.start()
        assert len(cache.instances()) == 2
        picked = provider.get_instance()
        provider.note_error(picked)  # threshold 1: out at once
        assert provider.get_instance().id != picked.id
    assert cache.is_closed and provider.is_closed  # closed with the facade
    assert await etcd_client.count(path + "/") == 0  # and everything unregistered
    assert etcd_client._leases.lease_count == 0


async def test_a_bad_record_is_skipped_by_a_query_and_raised_by_a_lookup(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    await etcd_client.put(f"{path}/names/orders/broken", b"\x00 not json")
    good = ServiceInstance("orders", "ok")
    await etcd_client.put(f"{path}/names/orders/{good.id}", good.to_json())
    async with ServiceDiscovery(etcd_client, path) as discovery:
        assert [i.id for i in await discovery.query_for_instances("orders")] == [good.id]
        assert isinstance(discovery.exceptions[0].exception, CodecError)
        with pytest.raises(CodecError):
            await discovery.query_for_instance("orders", "broken")


def test_the_blocking_facade(etcd_server, etcd_prefix):
    path = etcd_prefix + "services"
    with (
        blocking.connect(**etcd_server.client_kwargs()) as client,
        blocking.ServiceDiscovery(client, path) as discovery,
    ):
        me = blocking.ServiceInstance("orders", "", address="127.0.0.1", port=8080)
        discovery.register(me)
        with discovery.service_provider("orders", empty_grace=0) as provider:
            assert provider.get_instance().id == me.id
            lists = provider.instance_lists()
            assert [i.id for i in next(lists)] == [me.id]
            discovery.unregister(me)
            assert next(lists) == ()  # no grace: empty at once
        assert discovery.query_for_names() == []
