"""A queued mutex waiter survives a server restart, and a compaction while it is cut off: it
still acquires the lock when the holder releases it, with a larger fencing token."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedMutex, connect


@pytest.mark.slow
async def test_waiter_survives_server_restart(fresh_etcd_server, etcd_prefix):
    path = etcd_prefix + "lock"
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as a_client, connect(**kwargs) as b_client:
        holder = DistributedMutex(a_client, path, lease_ttl=10)
        waiter = DistributedMutex(b_client, path, lease_ttl=10)
        assert await holder.acquire()
        first_token = holder.fencing_token
        pending = asyncio.create_task(waiter.acquire(timeout=30))
        await asyncio.sleep(0.3)
        fresh_etcd_server.kill()
        await asyncio.sleep(0.3)
        fresh_etcd_server.restart()
        await asyncio.sleep(1.0)
        assert not pending.done()  # still queued behind the holder
        assert await holder.release()
        assert await asyncio.wait_for(pending, 15) is True
        assert waiter.fencing_token is not None
        assert first_token is not None
        assert waiter.fencing_token > first_token
        assert await waiter.release()
        await holder.aclose()
        await waiter.aclose()
        assert (await a_client.get_prefix(path + "/")).kvs == []


@pytest.mark.slow
async def test_waiter_survives_compaction_while_cut_off(etcd_client, etcd_proxy, etcd_prefix):
    path = etcd_prefix + "lock"
    async with connect(etcd_proxy.url, keepalive_time=1, keepalive_timeout=0.5) as far:
        holder = DistributedMutex(etcd_client, path, lease_ttl=10)
        waiter = DistributedMutex(far, path, lease_ttl=10)
        assert await holder.acquire()
        pending = asyncio.create_task(waiter.acquire(timeout=30))
        await asyncio.sleep(0.3)
        etcd_proxy.blackhole()
        assert await holder.release()  # the waiter cannot see this DELETE ...
        for i in range(3):
            await etcd_client.put(etcd_prefix + f"noise/{i}", b"x")
        rev = (await etcd_client.put(etcd_prefix + "noise/last", b"x")).revision
        await etcd_client.compact(rev)  # ... and the history holding it is gone
        await asyncio.sleep(2.5)
        etcd_proxy.restore()
        assert await asyncio.wait_for(pending, 20) is True
        assert await waiter.release()
        await holder.aclose()
        await waiter.aclose()
