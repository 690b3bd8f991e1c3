"""Lock loss by time: the server is paused past the lease TTL. The holder's body is cancelled
with LockLostError, the listeners fire once, a successor acquires, and the old holder's fenced
write is rejected by etcd -- the reason a lease-based lock needs fencing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedMutex,
    DistributedSemaphore,
    LockLostError,
    Op,
    connect,
)
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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mutex", "semaphore"])
async def test_cancelled_acquisition_waits_for_its_write_then_cleans_up(fresh_etcd_server, kind):
    """Regression: etcd may apply a write whose RPC was cancelled *after* the cleanup's delete,
    leaving a waiter key (kept alive by the session lease) that blocks the lock for good. The
    randomized semaphore test hit it under CPU load. A cancelled acquisition now waits for its
    create to be answered before it cleans up."""
    slow_keepalive = {"keepalive_time": 60, "keepalive_timeout": 20}
    async with connect(**fresh_etcd_server.client_kwargs(), **slow_keepalive) as client:
        if kind == "mutex":
            recipe: DistributedMutex | DistributedSemaphore = DistributedMutex(client, "/c/l")
        else:
            recipe = DistributedSemaphore(client, "/c/l", 1)
        assert await recipe.acquire(timeout=5)  # the session lease exists from here on
        await recipe.release()
        calls: list[tuple[str, str]] = []
        call = client._call

        async def logging_call(op: str, method: str, *args: Any, **kwargs: Any) -> Any:
            calls.append(("start", op))
            try:
                result = await call(op, method, *args, **kwargs)
            except BaseException as exc:
                calls.append(("end", f"{op}: {type(exc).__name__}"))
                raise
            calls.append(("end", f"{op}: answered"))
            return result

        client._call = logging_call  # type: ignore[method-assign]
        fresh_etcd_server.pause()
        try:
            acquiring = asyncio.create_task(recipe.acquire())
            await asyncio.sleep(0.3)  # its create transaction is in flight
            acquiring.cancel()
            await asyncio.sleep(0.3)
        finally:
            fresh_etcd_server.resume()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(acquiring, 10)
        del client._call
        # The create was answered (not abandoned) before the cleanup's delete was sent.
        assert calls[:3] == [("start", "txn"), ("end", "txn: answered"), ("start", "delete")]
        left = await client.range("/c/l/", prefix=True, keys_only=True)
        holders = [kv.key for kv in left.kvs if not kv.key.endswith(b"/permits")]
        assert holders == []
        assert await recipe.acquire(timeout=5)  # nothing blocks the next holder
        await recipe.aclose()
