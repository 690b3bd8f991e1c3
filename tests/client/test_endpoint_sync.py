"""Endpoint sync (issue 31, item 4): the client's endpoints follow the cluster's members --
a member added while recipes run is dialled, and a removed one (the very member the client
was configured with) is dropped while a watch, a lease and a lock holder keep going."""

from __future__ import annotations

import asyncio

from etcd_recipes import DistributedMutex, connect
from etcd_recipes.testing import EtcdCluster
from tests.helpers import eventually


async def test_the_endpoints_follow_members_added_and_removed(etcd_prefix):
    key = etcd_prefix + "sync/k"
    with EtcdCluster(1) as cluster:
        first = cluster.members[0]
        async with connect(first.url, endpoint_sync_interval=0.3) as client:
            assert client.endpoints == first.endpoint
            rev = (await client.put(key, b"0")).revision
            async with (
                client.watch(key, start_revision=rev) as watch,
                client.lease(10) as lease,
                DistributedMutex(client, etcd_prefix + "sync/lock", lease_ttl=10) as held,
            ):
                it = watch.__aiter__()
                assert (await anext(it)).kv.value == b"0"
                # The harness blocks (etcdctl, waits): off the loop, so renewals go on meanwhile.
                added = await asyncio.to_thread(cluster.add_member)
                await eventually(
                    lambda: added.endpoint in client.endpoints, timeout=10, what="n2 dialled"
                )
                assert first.endpoint in client.endpoints
                await asyncio.to_thread(
                    cluster.remove_member, first.name
                )  # the configured endpoint
                await eventually(
                    lambda: client.endpoints.strip() == added.endpoint, timeout=10, what="dropped"
                )
                await client.put(key, b"1")  # served by the member it learned of
                event = await asyncio.wait_for(anext(it), 15)  # the watch moved, gapless
                assert event.kv.value == b"1"
                await asyncio.sleep(4)  # renewals go on, on the new stream
                assert not lease.is_lost and held.is_held
                assert (await client.lease_time_to_live(lease.id)).ttl > 0


async def test_sync_endpoints_on_demand_reports_whether_anything_changed(etcd_prefix):
    with EtcdCluster(2) as cluster:
        n1 = cluster.members[0]
        async with connect(n1.url) as client:
            assert await client.sync_endpoints() is True  # n2 was not configured
            assert sorted(e.strip() for e in client.endpoints.split(",")) == sorted(
                cluster.endpoints
            )
            assert await client.sync_endpoints() is False  # nothing new
            await client.put(etcd_prefix + "k", b"v")
