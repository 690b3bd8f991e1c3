"""Leases under real conditions: a self-healing lease keeps its key, heals after the server is
paused past its TTL, and an acquisition lease reports loss (and is never re-granted) after an
out-of-band revoke or a pause past its TTL."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import (
    Cmp,
    LeaseExpired,
    LeaseFailed,
    LeaseResilience,
    LeaseRestored,
    LeaseSuspended,
    Op,
    ResilienceConfig,
    RetryPolicy,
    connect,
)
from tests.helpers import eventually, first_item_then_break, take

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


def _without_suspended(events: list) -> list:
    return [e for e in events if not isinstance(e, LeaseSuspended)]


@pytest.mark.slow
async def test_self_healing_lease_keeps_its_key(etcd_client, etcd_prefix):
    key = etcd_prefix + "member"
    granted: list[int] = []

    async def establish(lease_id: int) -> bool:
        granted.append(lease_id)
        await etcd_client.put(key, b"here", lease=lease_id)
        return True

    events: list = []
    lease = etcd_client.self_healing_lease(2, establish)
    lease.add_listener(events.append)
    assert await lease.start() is True
    lease_id = lease.current_lease_id
    assert granted == [lease_id]
    assert lease.is_healthy
    for _ in range(20):  # 10 s: five TTLs
        await asyncio.sleep(0.5)
        kv = await etcd_client.get(key)
        assert kv is not None
        assert kv.lease == lease_id
    assert lease.current_lease_id == lease_id
    assert lease.is_healthy
    assert not lease.has_failed
    assert _without_suspended(events) == []
    assert granted == [lease_id]  # never re-granted while healthy
    await lease.aclose()
    assert await etcd_client.get(key) is None
    assert not lease.is_healthy
    assert (await etcd_client.lease_time_to_live(lease_id)).ttl == -1


async def test_self_healing_lease_declined_establish(etcd_client, etcd_prefix):
    key = etcd_prefix + "taken"
    await etcd_client.put(key, b"someone-else")

    async def establish(lease_id: int) -> bool:
        r = await etcd_client.txn([Cmp.missing(key)], [Op.put(key, b"me", lease=lease_id)])
        return r.succeeded

    lease = etcd_client.self_healing_lease(2, establish)
    assert await lease.start() is False
    assert lease.current_lease_id == 0
    assert (await etcd_client.get(key)).value == b"someone-else"  # type: ignore[union-attr]
    assert etcd_client._leases.lease_count == 0


@pytest.mark.slow
async def test_self_healing_lease_heals_after_pause_past_ttl(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        granted: list[int] = []

        async def establish(lease_id: int) -> bool:
            granted.append(lease_id)
            await client.put("/heal/me", b"present", lease=lease_id)
            return True

        events: list = []
        lease = client.self_healing_lease(2, establish)
        lease.add_listener(events.append)
        assert await lease.start()
        old = lease.current_lease_id

        server.pause()
        try:
            await eventually(
                lambda: any(isinstance(e, LeaseExpired) for e in events),
                timeout=4,
                what="LeaseExpired while paused",
            )
            assert not lease.is_healthy
            await asyncio.sleep(4 - 2)  # paused for about 4 s in total
        finally:
            server.resume()

        await eventually(
            lambda: any(isinstance(e, LeaseRestored) for e in events),
            timeout=15,
            what="LeaseRestored",
        )
        significant = _without_suspended(events)
        assert [type(e) for e in significant] == [LeaseExpired, LeaseRestored]
        expired, restored = significant
        assert expired.lease_id == old
        assert restored.old_lease_id == old
        assert restored.new_lease_id != old
        new = restored.new_lease_id
        assert lease.current_lease_id == new
        assert lease.is_healthy
        assert granted == [old, new]  # the establish hook ran again, with the new lease

        # The key exists again, attached to the new lease, and stays (the old lease's
        # expiry on the server does not take it away).
        kv = await client.get("/heal/me")
        assert kv is not None
        assert kv.lease == new
        assert kv.value == b"present"
        await eventually(
            lambda: _ttl_is(client, old, -1), timeout=5, what="the old lease to be gone"
        )
        await asyncio.sleep(1.0)
        kv = await client.get("/heal/me")
        assert kv is not None
        assert kv.lease == new
        assert not any(isinstance(e, LeaseFailed) for e in events)
        await lease.aclose()
        assert await client.get("/heal/me") is None


async def _ttl_is(client, lease_id: int, ttl: int) -> bool:
    return (await client.lease_time_to_live(lease_id)).ttl == ttl


async def test_acquisition_lease_lost_after_out_of_band_revoke(
    etcd_server, etcd_client, etcd_prefix
):
    key = etcd_prefix + "lock"
    events: list = []
    async with etcd_client.lease(3) as lease:
        lease.add_listener(events.append)
        await etcd_client.put(key, b"held", lease=lease.id)
        assert not lease.is_lost
        # Someone else revokes it (an operator, a fencing process...).
        async with connect(**etcd_server.client_kwargs()) as other:
            assert await other.lease_revoke(lease.id) is True
        await asyncio.wait_for(lease.wait_lost(), 5)
        assert lease.is_lost
        assert lease.lost_cause is not None
        await eventually(lambda: len(events) >= 1, timeout=2, what="the LeaseExpired listener")
        assert [type(e) for e in _without_suspended(events)] == [LeaseExpired]
        assert events[-1].lease_id == lease.id
        # Never re-granted: same id, nothing kept alive, no key.
        lost_id = lease.id
        await asyncio.sleep(1.5)
        assert lease.id == lost_id
        assert etcd_client._leases.lease_count == 0
        assert len(_without_suspended(events)) == 1
        assert await etcd_client.get(key) is None
        assert (await etcd_client.lease_time_to_live(lost_id)).ttl == -1
    # Exiting (revoking an already-gone lease) is quiet.
    assert lease.is_lost


@pytest.mark.slow
async def test_acquisition_lease_lost_after_pause_past_ttl(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        events: list = []
        lease = await client.lease(2).grant()
        lease.add_listener(events.append)
        await client.put("/acq/k", b"held", lease=lease.id)
        lost_id = lease.id
        server.pause()
        try:
            # Detected on the client while the server is still frozen: renewals stopped.
            await asyncio.wait_for(lease.wait_lost(), 4)
            await asyncio.sleep(4 - 2.5)
        finally:
            server.resume()
        assert lease.is_lost
        await eventually(
            lambda: any(isinstance(e, LeaseExpired) for e in events), timeout=2, what="event"
        )
        await eventually(
            lambda: _ttl_is(client, lost_id, -1), timeout=5, what="the lease to expire"
        )
        assert await client.get("/acq/k") is None
        await asyncio.sleep(1.0)
        assert [type(e) for e in _without_suspended(events)] == [LeaseExpired]
        assert lease.id == lost_id
        assert client._leases.lease_count == 0
        await lease.revoke()  # quiet on a lost lease
        assert not any(isinstance(e, LeaseRestored) for e in events)


@pytest.mark.slow
async def test_acquisition_lease_survives_a_quick_server_restart(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        events: list = []
        async with client.lease(3) as lease:
            lease.add_listener(events.append)
            await client.put("/restart/k", b"held", lease=lease.id)
            server.kill()
            server.restart()  # etcd re-arms every lease with its full TTL on recovery
            await asyncio.sleep(4.5)  # one and a half TTLs
            assert not lease.is_lost
            kv = await client.get("/restart/k")
            assert kv is not None
            assert kv.lease == lease.id
            assert not any(isinstance(e, LeaseExpired) for e in events)
            assert client._leases.streams_opened >= 2  # the keep-alive stream was rebuilt
        assert await client.get("/restart/k") is None


async def test_lease_events_stream_in_order_and_end_on_revoke(etcd_client, etcd_prefix):
    key = etcd_prefix + "member"

    async def establish(lease_id: int) -> bool:
        await etcd_client.put(key, b"here", lease=lease_id)
        return True

    lease = etcd_client.self_healing_lease(2, establish)
    events = lease.events()
    assert await lease.start()
    first = lease.current_lease_id
    await etcd_client.lease_revoke(first)  # out of band: expired, then healed
    got = _without_suspended(await take(events, 2))
    assert [type(e) for e in got] == [LeaseExpired, LeaseRestored]
    assert got[0].lease_id == first and got[1].old_lease_id == first
    assert got[1].new_lease_id == lease.current_lease_id != first
    await lease.aclose()  # ends the iteration
    assert _without_suspended([e async for e in events]) == []
    assert await etcd_client.get(key) is None


async def test_breaking_out_of_lease_events_unregisters(etcd_client):
    async with etcd_client.lease(2) as lease:
        consumer = asyncio.create_task(first_item_then_break(lease.events()))
        await eventually(lambda: lease._events.stream_count == 1, what="registered")
        await etcd_client.lease_revoke(lease.id)
        assert isinstance(await asyncio.wait_for(consumer, 10), LeaseExpired)
        gc.collect()
        assert lease._events.stream_count == 0
        # A cancelled consumer unregisters too.
        consumer = asyncio.create_task(first_item_then_break(lease.events()))
        await eventually(lambda: lease._events.stream_count == 1, what="registered")
        consumer.cancel()
        await asyncio.wait({consumer})
        del consumer
        gc.collect()
        assert lease._events.stream_count == 0
    assert etcd_client._leases.lease_count == 0
    assert (await etcd_client.lease_time_to_live(lease.id)).ttl == -1


async def test_a_self_healing_lease_with_a_never_policy_does_not_heal(etcd_server, etcd_prefix):
    """``LeaseResilience(RetryPolicy.never())`` disables healing (the reference's DISABLED):
    the policy is asked before every heal attempt, the first included, so a lost lease is
    reported failed without a new grant or a second establish."""
    key = etcd_prefix + "presence"
    no_heal = ResilienceConfig(lease=LeaseResilience(RetryPolicy.never()))
    async with connect(**etcd_server.client_kwargs(), resilience=no_heal) as client:
        granted: list[int] = []

        async def establish(lease_id: int) -> bool:
            granted.append(lease_id)
            await client.put(key, b"here", lease=lease_id)
            return True

        lease = client.self_healing_lease(3, establish)
        events: list = []
        lease.add_listener(events.append)
        assert await lease.start()
        first = lease.current_lease_id
        assert await client.lease_revoke(first) is True
        await eventually(
            lambda: any(isinstance(e, LeaseFailed) for e in events), timeout=5, what="LeaseFailed"
        )
        assert [type(e) for e in _without_suspended(events)] == [LeaseExpired, LeaseFailed]
        assert granted == [first]  # establish ran once: no re-grant
        assert not lease.is_healthy
        assert await client.get(key) is None
        await lease.aclose()
