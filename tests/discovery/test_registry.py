"""ServiceRegistry against a real etcd: records on self-healing leases, heals that write the
latest JSON (also after a restart that outlived the TTL), duplicates refused, unregistration
at once, a SIGKILLed registrant gone within TTL + 1 s, and cancellation leaving nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etcd_recipes import (
    JSON,
    ConnectionState,
    DuplicateServiceInstanceError,
    LeaseExpired,
    LeaseFailed,
    LeaseRestored,
    ServiceInstance,
    ServiceInstanceNotFoundError,
    ServiceRegistry,
    connect,
)
from tests.helpers import eventually

HELPER = Path(__file__).with_name("proc_helper.py")
FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


async def record(client, registry, instance, codec=None):
    kv = await client.get(registry.key_of(instance))
    return None if kv is None else ServiceInstance.from_json(kv.value, codec)


async def test_register_update_unregister(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    async with ServiceRegistry(etcd_client, path, codec=JSON) as registry:
        me = ServiceInstance("orders", {"v": 1}, address="10.0.0.7", port=8080)
        await registry.register(me)
        key = f"{path}/names/orders/{me.id}"
        assert registry.key_of(me) == key
        kv = await etcd_client.get(key)
        assert kv.value == me.to_json(JSON) and kv.lease == registry.lease_id(me) != 0
        await asyncio.sleep(3)  # longer than the TTL: kept alive
        assert (await record(etcd_client, registry, me, JSON)) == me
        newer = dataclasses.replace(me, payload={"v": 2})
        await registry.update(newer)
        assert (await record(etcd_client, registry, me, JSON)).payload == {"v": 2}
        assert registry.registered() == [newer]
        await registry.unregister(newer)
        assert await etcd_client.get(key) is None  # at once, not at TTL
        with pytest.raises(ServiceInstanceNotFoundError):
            await registry.unregister(me)
        with pytest.raises(ServiceInstanceNotFoundError):
            await registry.update(me)
        await registry.register(me)  # may register again
    assert await etcd_client.get(key) is None  # aclose() unregistered it
    assert etcd_client._leases.lease_count == 0


async def test_duplicates_are_refused_and_leave_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    me = ServiceInstance("orders", "a", port=80)
    async with (
        ServiceRegistry(etcd_client, path) as first,
        ServiceRegistry(etcd_client, path) as second,
    ):
        await first.register(me)
        with pytest.raises(DuplicateServiceInstanceError):
            await first.register(me)
        with pytest.raises(DuplicateServiceInstanceError):
            await second.register(dataclasses.replace(me, payload="b"))  # same id, someone else's
        assert (await record(etcd_client, first, me)).payload == "a"  # untouched
        assert etcd_client._leases.lease_count == 1  # the loser's lease was revoked
        assert second.registered() == []


async def test_a_heal_writes_the_latest_json(etcd_client, etcd_prefix):
    """CURATOR-181: a re-registration after a lease loss must not resurrect the first payload."""
    async with ServiceRegistry(etcd_client, etcd_prefix + "s", codec=JSON) as registry:
        events = registry.lease_events()
        me = ServiceInstance("orders", {"v": 1}, port=80)
        await registry.register(me)
        await registry.update(dataclasses.replace(me, payload={"v": 2}))
        old = registry.lease_id(me)
        await etcd_client.lease_revoke(old)  # out of band: the record goes
        assert isinstance(await asyncio.wait_for(anext(events), 10), LeaseExpired)
        restored = await asyncio.wait_for(anext(events), 10)
        assert isinstance(restored, LeaseRestored) and restored.old_lease_id == old
        kv = await etcd_client.get(registry.key_of(me))
        assert ServiceInstance.from_json(kv.value, JSON).payload == {"v": 2}
        assert kv.lease == registry.lease_id(me) == restored.new_lease_id
        assert registry.connection_state is ConnectionState.RECONNECTED
        assert registry.has_exceptions  # the expiry was recorded


async def test_registered_after_construction_heal_too(etcd_client, etcd_prefix):
    async with ServiceRegistry(etcd_client, etcd_prefix + "s") as registry:
        instances = [ServiceInstance("orders", str(i), port=8000 + i) for i in range(3)]
        for instance in instances:
            await registry.register(instance)
            await asyncio.sleep(0.1)
        for instance in instances:
            await etcd_client.lease_revoke(registry.lease_id(instance))
        for instance in instances:
            await eventually(
                lambda i=instance: _on_current_lease(etcd_client, registry, i), what="healed"
            )


async def _on_current_lease(client, registry, instance) -> bool:
    kv = await client.get(registry.key_of(instance))
    return kv is not None and kv.lease == registry.lease_id(instance) != 0


async def test_a_record_taken_over_by_someone_else_is_left_alone(etcd_client, etcd_prefix):
    async with ServiceRegistry(etcd_client, etcd_prefix + "s") as registry:
        failed = asyncio.Event()
        registry.add_lease_listener(lambda e: failed.set() if isinstance(e, LeaseFailed) else None)
        me = ServiceInstance("orders", "mine", port=80)
        await registry.register(me)
        key = registry.key_of(me)
        async with etcd_client.lease(10) as foreign:
            await etcd_client.put(key, b"theirs", lease=foreign.id)  # moves the key off our lease
            await etcd_client.lease_revoke(registry.lease_id(me))
            await asyncio.wait_for(failed.wait(), 10)
            assert (await etcd_client.get(key)).value == b"theirs"
            assert registry.registered() == []


@pytest.mark.slow
async def test_update_then_restart_past_the_ttl_brings_back_the_latest(fresh_etcd_server):
    """etcd comes back with the record still on the lease we gave up on: the heal takes it
    over (a CAS-only heal would fail, and the record would expire for good)."""
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        async with ServiceRegistry(client, "/svc", codec=JSON) as registry:
            restored = asyncio.Event()
            registry.add_lease_listener(
                lambda e: restored.set() if isinstance(e, LeaseRestored) else None
            )
            me = ServiceInstance("orders", {"v": 1}, port=80)
            await registry.register(me)
            await registry.update(dataclasses.replace(me, payload={"v": 2}))
            server.kill()
            await asyncio.sleep(3.5)  # past the TTL: the keeper gives the lease up
            server.restart()
            await asyncio.wait_for(restored.wait(), 20)
            await asyncio.sleep(2 * registry.ttl + 1)  # a record left on a dead lease expires
            kv = await client.get(registry.key_of(me))
            assert kv is not None, "the record expired: the heal did not take it over"
            assert ServiceInstance.from_json(kv.value, JSON).payload == {"v": 2}
            assert kv.lease == registry.lease_id(me)


@pytest.mark.slow
async def test_a_sigkilled_registrant_disappears_within_ttl_plus_one_second(
    etcd_client, etcd_server, etcd_prefix
):
    path = etcd_prefix + "services"
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), etcd_server.endpoint, path, "orders", "8080", "2"],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        key = json.loads(line)["key"]
        assert await etcd_client.get(key) is not None
        await asyncio.sleep(2.5)  # renewed at least once
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        await eventually(lambda: _gone(etcd_client, key), timeout=10, interval=0.02)
        assert time.monotonic() - killed < 2 + 1.0
    finally:
        proc.kill()
        proc.wait()


async def _gone(client, key) -> bool:
    return await client.get(key) is None


async def test_cancelled_registrations_leave_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    rng = random.Random(7)
    async with ServiceRegistry(etcd_client, path) as registry:
        for _ in range(25):
            task = asyncio.create_task(registry.register(ServiceInstance("orders", "", port=80)))
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        kept = {registry.key_of(i) for i in registry.registered()}
        on_server = {kv.key_text for kv in await etcd_client.get_prefix(path + "/")}
        assert on_server == kept  # only the registrations that completed before the cancel
        assert etcd_client._leases.lease_count == len(kept)
    assert len(await etcd_client.get_prefix(path + "/")) == 0
    assert etcd_client._leases.lease_count == 0


async def test_cancelled_unregister_still_removes(etcd_client, etcd_prefix):
    async with ServiceRegistry(etcd_client, etcd_prefix + "s") as registry:
        me = ServiceInstance("orders", "", port=80)
        await registry.register(me)
        task = asyncio.create_task(registry.unregister(me))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await etcd_client.get(registry.key_of(me)) is None
        assert etcd_client._leases.lease_count == 0


async def test_a_record_that_expires_during_the_takeover_is_recreated(etcd_client, etcd_prefix):
    """The keeper gave up on a lease etcd still has; while the heal moves the record over,
    the old lease expires (here: the record is deleted just before the takeover's commit).
    The heal must look again and re-create it, not give up (a lost race found on a busy
    machine by benchmarks/discovery.py)."""
    async with ServiceRegistry(etcd_client, etcd_prefix + "s") as registry:
        restored, failed = asyncio.Event(), asyncio.Event()
        registry.add_lease_listener(
            lambda e: (
                (restored if isinstance(e, LeaseRestored) else failed).set()
                if isinstance(e, (LeaseRestored, LeaseFailed))
                else None
            )
        )
        me = ServiceInstance("orders", "mine", port=80)
        await registry.register(me)
        key = registry.key_of(me)
        real_txn = etcd_client.txn
        calls = 0

        async def racing_txn(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == 2:  # the takeover: the old lease expires first
                await etcd_client.delete(key)
            return await real_txn(*args, **kwargs)

        etcd_client.txn = racing_txn
        try:
            reg = registry._regs[key]
            reg.lease._on_lost(None)  # what the keeper does when renewals stop past the TTL
            await asyncio.wait_for(asyncio.shield(_first(restored, failed)), 10)
        finally:
            etcd_client.txn = real_txn
        assert restored.is_set() and not failed.is_set()
        kv = await etcd_client.get(key)
        assert kv is not None and kv.lease == registry.lease_id(me) and kv.value == me.to_json()


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


async def test_lease_ttl_is_the_name_and_ttl_a_deprecated_alias(etcd_client, etcd_prefix):
    from etcd_recipes import InvalidArgumentError, ServiceDiscovery

    registry = ServiceRegistry(etcd_client, etcd_prefix + "svc", lease_ttl=7)
    assert registry.lease_ttl == 7 and registry.ttl == 7
    with pytest.warns(DeprecationWarning, match="lease_ttl="):
        old = ServiceRegistry(etcd_client, etcd_prefix + "svc", ttl=9)
    assert old.lease_ttl == 9
    with (
        pytest.warns(DeprecationWarning, match="deprecated"),
        pytest.raises(InvalidArgumentError, match="not both"),
    ):
        ServiceRegistry(etcd_client, etcd_prefix + "svc", lease_ttl=7, ttl=9)
    with pytest.warns(DeprecationWarning, match="ServiceDiscovery"):
        facade = ServiceDiscovery(etcd_client, etcd_prefix + "svc", ttl=8)
    assert facade.registry.lease_ttl == 8
    for recipe in (registry, old, facade):
        await recipe.aclose()
