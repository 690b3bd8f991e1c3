"""Lock loss by time: the server is paused past the lease TTL. The holder's body is cancelled
with LockLostError, the listeners fire once, a successor acquires, and the old holder's fenced
write is rejected by etcd -- the reason a lease-based lock needs fencing."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import ConnectionState, DistributedMutex, LockLostError, Op, connect
from tests.helpers import eventually


@pytest.mark.slow
async def test_pause_past_the_ttl(fresh_etcd_server):
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as first, connect(**kwargs) as second:
        holder = DistributedMutex(first, "/locks/p", lease_ttl=2)
        successor = DistributedMutex(second, "/locks/p", lease_ttl=2)
        causes: list[object] = []
        holder.add_lock_lost_listener(causes.append)
        body_finished = False
        paused = asyncio.Event()

        async def hold_it():
            nonlocal body_finished
            async with holder.with_lock() as hold:
                assert (await hold.guarded_txn([Op.put("/data", b"holder")])).succeeded
                paused.set()
                await asyncio.sleep(30)
                body_finished = True

        holding = asyncio.create_task(hold_it())
        await paused.wait()
        stale = holder.hold
        waiting = asyncio.create_task(successor.acquire())
        await asyncio.sleep(0.3)
        fresh_etcd_server.pause()
        try:
            await asyncio.sleep(4)  # > TTL: renewals fail, the lease is lost
        finally:
            fresh_etcd_server.resume()
        with pytest.raises(LockLostError):
            await asyncio.wait_for(holding, 15)
        assert not body_finished and stale is not None and stale.is_lost
        assert await asyncio.wait_for(waiting, 20)  # the successor got the lock
        await eventually(lambda: len(causes) == 1, what="one lock-lost notification")
        assert holder.connection_state is ConnectionState.LOST
        # The old holder's write is fenced off; the successor's commits.
        assert not (await stale.guarded_txn([Op.put("/data", b"stale")])).succeeded
        assert (await successor.guarded_txn([Op.put("/data", b"successor")])).succeeded
        assert (await second.get("/data")).value == b"successor"
        assert successor.fencing_token > stale.fencing_token
        await asyncio.sleep(0.3)
        assert len(causes) == 1
        await successor.release()
        await holder.aclose()
        await successor.aclose()
