"""GroupMember against a real etcd: join with a payload, the members snapshot and events,
update, leave at once, duplicates refused, lease loss healed with the latest payload,
cancellation leaving nothing, and the view recovering after a compaction and a restart."""

from __future__ import annotations

import asyncio
import random

import pytest

from etcd_recipes import (
    JSON,
    ConnectionState,
    DuplicateMemberError,
    GroupMember,
    GroupResynced,
    LeaseExpired,
    LeaseRestored,
    MemberJoined,
    MemberLeft,
    MemberUpdated,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import ETCD_QUIET_BEFORE_KILL, eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


async def test_join_members_events_update_leave(etcd_client, etcd_prefix):
    path = etcd_prefix + "g"
    async with GroupMember(etcd_client, path, {"n": 1}, member_id="a", codec=JSON) as a:
        assert a.key == f"{path}/members/a"
        kv = await etcd_client.get(a.key)
        assert kv.value == b'{"n":1}' and kv.lease == a.lease_id != 0
        await a.wait_for_revision(a.joined_revision)
        assert a.members() == {"a": {"n": 1}} and a.member_ids() == ["a"]
        events = a.events()
        b = GroupMember(etcd_client, path, {"n": 2}, member_id="b", codec=JSON)
        await b.start()
        joined = await asyncio.wait_for(anext(events), 10)
        assert joined == MemberJoined("b", {"n": 2}, b.joined_revision)
        await b.update({"n": 3})
        updated = await asyncio.wait_for(anext(events), 10)
        assert updated == MemberUpdated("b", {"n": 3}, b.joined_revision)
        assert a.members() == {"a": {"n": 1}, "b": {"n": 3}}
        await b.leave()
        assert await etcd_client.get(b.key) is None  # at once, not at the TTL
        left = await asyncio.wait_for(anext(events), 10)
        assert isinstance(left, MemberLeft) and left.member_id == "b"
        assert "joined" in repr(a) and "members=1" in repr(a)
    assert await etcd_client.get(f"{path}/members/a") is None
    assert etcd_client._leases.lease_count == 0


async def test_a_duplicate_member_id_is_refused_and_writes_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "g"
    async with GroupMember(etcd_client, path, b"first", member_id="x") as first:
        twin = GroupMember(etcd_client, path, b"second", member_id="x")
        with pytest.raises(DuplicateMemberError):
            await twin.start()
        assert (await etcd_client.get(first.key)).value == b"first"
        assert etcd_client._leases.lease_count == 1  # the twin's lease was revoked
        await twin.aclose()


async def test_a_lost_lease_heals_with_the_latest_payload(etcd_client, etcd_prefix):
    async with GroupMember(etcd_client, etcd_prefix + "g", b"v1", member_id="m") as me:
        events = me.events()
        await me.update(b"v2")
        await asyncio.wait_for(anext(events), 10)  # the update
        old = me.lease_id
        await etcd_client.lease_revoke(old)  # out of band: the key goes
        seen = []
        while not any(isinstance(e, LeaseRestored) for e in seen) or not any(
            isinstance(e, MemberJoined) for e in seen
        ):
            seen.append(await asyncio.wait_for(anext(events), 10))
        kinds = [type(e) for e in seen]
        assert LeaseExpired in kinds and MemberLeft in kinds
        kv = await etcd_client.get(me.key)
        assert kv.value == b"v2" and kv.lease == me.lease_id != old
        assert me.connection_state is ConnectionState.RECONNECTED
        assert me.is_member


async def test_a_member_key_deleted_out_of_band_is_recreated(etcd_client, etcd_prefix):
    async with GroupMember(etcd_client, etcd_prefix + "g", b"p", member_id="m") as me:
        events = me.events()
        lease = me.lease_id
        await etcd_client.delete(me.key)  # an operator
        left, back = [await asyncio.wait_for(anext(events), 10) for _ in range(2)]
        assert isinstance(left, MemberLeft) and isinstance(back, MemberJoined)
        assert back.member_id == "m" and back.payload == b"p"
        kv = await etcd_client.get(me.key)
        assert kv.value == b"p" and kv.lease == lease == me.lease_id  # the same lease


async def test_cancelled_joins_leave_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "g"
    rng = random.Random(11)
    for i in range(20):
        member = GroupMember(etcd_client, path, member_id=f"m{i}")
        task = asyncio.create_task(member.start())
        await asyncio.sleep(rng.uniform(0, 0.02))
        task.cancel()
        try:
            await task
            await member.aclose()  # it had joined before the cancel: leave
        except asyncio.CancelledError:
            await member.aclose()
    assert len(await etcd_client.get_prefix(path + "/")) == 0
    assert etcd_client._leases.lease_count == 0


async def _members_are(member, ids) -> bool:
    return member.member_ids() == ids


@pytest.mark.slow
async def test_the_view_resyncs_after_a_compaction(fresh_etcd_server):
    """Changes made while the view could not follow, then compacted away: the view re-reads
    and reports the difference (synthetic), then GroupResynced."""
    server = fresh_etcd_server
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            await direct.put("/grp/members/ghost", b"g")
            async with GroupMember(through, "/grp", member_id="me", lease_ttl=30) as me:
                await me.wait_for_revision(me.joined_revision)
                events = me.events()
                proxy.blackhole()
                await eventually(
                    lambda: me.connection_state is ConnectionState.SUSPENDED,
                    timeout=8,
                    what="the view to notice",
                )
                await direct.delete("/grp/members/ghost")
                await direct.put("/grp/members/late", b"l")
                await direct.compact((await direct.status()).revision)
                proxy.restore()
                found = []
                while not any(isinstance(e, GroupResynced) for e in found):
                    found.append(await asyncio.wait_for(anext(events), 20))
                changes = {(type(e).__name__, e.member_id, e.synthetic) for e in found[:-1]}
                assert changes == {("MemberLeft", "ghost", True), ("MemberJoined", "late", True)}
                assert me.members() == {"late": b"l", "me": b""}
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_a_restart_past_the_ttl_rejoins_and_the_view_follows(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        async with GroupMember(client, "/grp", b"p", member_id="me") as me:
            restored = asyncio.Event()
            me.add_listener(lambda e: restored.set() if isinstance(e, LeaseRestored) else None)
            await asyncio.sleep(ETCD_QUIET_BEFORE_KILL)
            server.kill()
            await asyncio.sleep(3.5)  # past the TTL: the keeper gives the lease up
            server.restart()
            await asyncio.wait_for(restored.wait(), 20)
            other = await client.put("/grp/members/new", b"n")
            await me.wait_for_revision(other.revision, timeout=20)
            await eventually(lambda: me.members() == {"me": b"p", "new": b"n"}, what="view")
            kv = await client.get(me.key)
            assert kv.value == b"p" and kv.lease == me.lease_id
