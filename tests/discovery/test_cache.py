"""ServiceCache against a real etcd: typed instances and events, records written by someone
else that do not parse (skipped, recorded, never a crash), and recovery after a restart."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    JSON,
    BatchKind,
    CacheEventType,
    CodecError,
    ServiceCache,
    ServiceInstance,
    ServiceRegistry,
    connect,
)
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


async def test_instances_and_events(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    async with (
        ServiceRegistry(etcd_client, path, codec=JSON) as registry,
        ServiceCache(etcd_client, path, "orders", codec=JSON) as cache,
    ):
        events = cache.events()
        assert (await anext(events)).kind is BatchKind.INITIAL
        a = ServiceInstance("orders", {"zone": "eu"}, port=8081)
        await registry.register(a)
        await registry.register(ServiceInstance("billing", {}, port=9000))  # another service
        (created,) = await asyncio.wait_for(anext(events), 10)
        assert created.type is CacheEventType.CREATED and created.value == a
        assert cache.instances() == [a] and cache.get(a.id).payload == {"zone": "eu"}
        await registry.unregister(a)
        (deleted,) = await asyncio.wait_for(anext(events), 10)
        assert deleted.type is CacheEventType.DELETED and deleted.prev_value == a
        assert cache.instances() == [] and len(cache) == 0


async def test_a_started_cache_sees_what_was_registered_before(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    async with ServiceRegistry(etcd_client, path) as registry:
        mine = [ServiceInstance("orders", str(i), port=8000 + i) for i in range(5)]
        for instance in mine:
            await registry.register(instance)
        async with ServiceCache(etcd_client, path, "orders") as cache:
            assert sorted(i.id for i in cache.instances()) == sorted(i.id for i in mine)
            assert [i.id for i in cache.instances()] == sorted(i.id for i in mine)  # by key


async def test_bad_records_are_skipped_and_recorded(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    base = f"{path}/names/orders/"
    good = ServiceInstance("orders", "ok", port=80)
    copied = ServiceInstance("orders", "copy", port=81, id="Original")
    await etcd_client.put(base + good.id, good.to_json())
    await etcd_client.put(base + "garbage", b"{not json")
    await etcd_client.put(base + "Copy0001", copied.to_json())  # its id is not its key's
    await etcd_client.put(base + "other", ServiceInstance("billing", "", id="other").to_json())
    async with ServiceCache(etcd_client, path, "orders") as cache:
        assert [i.id for i in cache.instances()] == [good.id]
        await eventually(lambda: len(cache.exceptions) >= 3, what="three recorded records")
        assert all(isinstance(e.exception, CodecError) for e in cache.exceptions)
        # ... and the cache goes on: a later bad record does not stop later good ones.
        await etcd_client.put(base + "garbage2", b"\xff")
        later = ServiceInstance("orders", "later", port=82)
        written = await etcd_client.put(base + later.id, later.to_json())
        await cache.wait_for_revision(written.revision)
        assert sorted(i.id for i in cache.instances()) == sorted([good.id, later.id])
        assert cache.is_synced
        count = len(cache.exceptions)
        cache.instances()
        assert len(cache.exceptions) == count  # recorded once, not at every read


@pytest.mark.slow
async def test_the_cache_follows_through_a_restart(fresh_etcd_server):
    server = fresh_etcd_server
    async with (
        connect(**server.client_kwargs(), **FAST) as client,
        ServiceRegistry(client, "/svc", lease_ttl=5) as registry,
        ServiceCache(client, "/svc", "orders") as cache,
    ):
        first = ServiceInstance("orders", "", port=80)
        await registry.register(first)
        await eventually(lambda: len(cache) == 1, what="the first instance")
        server.restart()
        second = ServiceInstance("orders", "", port=81)
        for _ in range(50):  # the registry's first call after the restart may fail fast
            try:
                await registry.register(second)
                break
            except Exception:
                await asyncio.sleep(0.2)
        await eventually(lambda: len(cache) == 2, timeout=20, what="the second instance")
        assert cache.is_synced
