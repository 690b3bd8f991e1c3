"""Self-healing leases across server outages (issue 16 items 24 and 25).

* An outage longer than the TTL: the client has declared the lease lost, but etcd restores
  leases on restart (with a fresh TTL), so the old key still exists under the old lease when
  the heal's create-if-absent runs. The heal must re-create the key, not give up.
* A keep-alive failure that recovers well within the TTL: ``connection_state`` goes
  ``SUSPENDED`` and back to ``RECONNECTED``.
"""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    Cmp,
    ConnectionState,
    DistributedBarrier,
    DistributedMutex,
    LeaderLatch,
    LeaseEvent,
    LeaseExpired,
    LeaseFailed,
    LeaseRestored,
    LeaseResumed,
    LeaseSuspended,
    Op,
    TransientKeyValue,
    connect,
)
from tests.helpers import eventually

TTL = 5  # long enough that etcd's restored lease outlives the heal's first attempts


@pytest.mark.slow
async def test_heal_after_an_outage_longer_than_the_ttl_recreates_its_own_keys(
    fresh_etcd_server, etcd_prefix
):
    server = fresh_etcd_server
    presence = etcd_prefix + "presence/me"
    path = etcd_prefix + "election"
    async with connect(**server.client_kwargs()) as client:

        async def establish(lease_id: int) -> bool:  # the documented create-if-absent hook
            r = await client.txn([Cmp.missing(presence)], [Op.put(presence, b"me", lease=lease_id)])
            return r.succeeded

        lease = client.self_healing_lease(TTL, establish)
        events: list[LeaseEvent] = []
        lease.add_listener(events.append)
        assert await lease.start()
        first = lease.current_lease_id
        latch = LeaderLatch(client, path, client_id="node-1", lease_ttl=TTL)
        await latch.start()
        assert await latch.await_leadership(timeout=10)
        participant = path + "/participants/node-1"
        old_participation = (await client.get(participant)).lease
        transient = TransientKeyValue(client, etcd_prefix + "transient", "up", lease_ttl=TTL)
        await transient.start()
        gate = DistributedBarrier(client, etcd_prefix + "gate", lease_ttl=TTL)
        await gate.start()
        assert await gate.set_barrier()
        old_gate = (await client.get(etcd_prefix + "gate")).lease

        server.kill()
        await eventually(
            lambda: any(isinstance(e, LeaseExpired) for e in events),
            timeout=TTL + 5,
            what="the client declares the lease lost",
        )
        await asyncio.sleep(1)
        server.restart()

        await eventually(lambda: lease.is_healthy, timeout=TTL + 10, what="the lease healed")
        assert not lease.has_failed
        assert not any(isinstance(e, LeaseFailed) for e in events)
        assert any(isinstance(e, LeaseRestored) and e.old_lease_id == first for e in events)
        kv = await client.get(presence)
        assert kv is not None and kv.lease == lease.current_lease_id != first

        async def participant_healed() -> bool:
            kv = await client.get(participant)
            return kv is not None and kv.lease not in (0, old_participation)

        await eventually(participant_healed, timeout=TTL + 10, what="the participant key")

        async def gate_healed() -> bool:  # a create-if-absent establish too
            kv = await client.get(etcd_prefix + "gate")
            return kv is not None and kv.lease not in (0, old_gate)

        await eventually(gate_healed, timeout=TTL + 10, what="the barrier key")
        await eventually(lambda: transient.lease_id != 0, timeout=TTL + 10, what="transient")
        assert (await client.get(transient.key)).lease == transient.lease_id
        await transient.aclose()
        await gate.aclose()
        await latch.aclose()
        await lease.aclose()
        assert await client.get(presence) is None
        assert await client.get(participant) is None


@pytest.mark.slow
async def test_connection_state_returns_after_a_recovered_keep_alive_failure(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs()) as client:
        tkv = TransientKeyValue(client, "/outage/transient", "up", lease_ttl=30)
        states: list[ConnectionState] = []
        lease_events: list[LeaseEvent] = []
        tkv.add_connection_state_listener(lambda new, old: states.append(new))
        tkv.add_lease_listener(lease_events.append)
        await tkv.start()
        lease_id = tkv.lease_id

        server.kill()  # down well under the TTL: the lease survives, its keep-alives resume
        await asyncio.sleep(1.5)  # the keep-alive stream fails meanwhile (SUSPENDED)
        server.restart()

        await eventually(
            lambda: any(isinstance(e, LeaseResumed) for e in lease_events),
            timeout=20,
            what="the keep-alives resume",
        )
        assert ConnectionState.SUSPENDED in states
        assert states[-1] is ConnectionState.RECONNECTED
        assert tkv.connection_state is ConnectionState.RECONNECTED
        # Every suspension was followed by a recovery, in order.
        assert states[0] is ConnectionState.SUSPENDED
        assert ConnectionState.LOST not in states
        kinds = [type(e) for e in lease_events]
        assert kinds.index(LeaseSuspended) < kinds.index(LeaseResumed)
        assert tkv.lease_id == lease_id  # the same lease: it was never lost
        assert (await client.get("/outage/transient")).lease == lease_id
        assert tkv.is_healthy()
        await tkv.aclose()


@pytest.mark.slow
async def test_a_held_mutex_leaves_suspended_once_its_keep_alives_resume(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs()) as client:
        mutex = DistributedMutex(client, "/outage/lock", lease_ttl=30)
        states: list[ConnectionState] = []
        mutex.add_connection_state_listener(lambda new, old: states.append(new))
        await mutex.acquire()
        server.kill()
        await asyncio.sleep(1.5)
        server.restart()
        await eventually(
            lambda: states[-1:] == [ConnectionState.RECONNECTED], timeout=20, what="recovered"
        )
        assert states == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]
        assert mutex.is_held
        assert await mutex.release()
        await mutex.aclose()
