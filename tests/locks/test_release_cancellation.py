"""Writes a lock cancels in flight are answered before anything else happens (the RPC funnel's
``settle``): a release cancelled while its guarded delete is in flight still deletes the key and
reports ``released``, then the cancellation propagates -- unchanged, for a native
``task.cancel()`` as for an anyio deadline; an acquisition whose deadline fires while its
create is in flight waits for the answer, then cleans up. The server is paused so that the
write is certainly in flight when the cancellation comes."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from etcd_recipes import DistributedMutex, ResilienceConfig, connect
from etcd_recipes.metrics import EtcdMetrics


class HoldEnds(EtcdMetrics):
    def __init__(self) -> None:
        self.ends: list[str] = []

    def lock_hold_finished(self, recipe: str, name: str, duration: float, ended: str) -> None:
        self.ends.append(ended)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["task-cancel", "anyio-deadline"])
async def test_cancelled_release_still_deletes_the_key(fresh_etcd_server: Any, how: str) -> None:
    sink = HoldEnds()
    slow_keepalive: dict[str, Any] = {"keepalive_time": 60, "keepalive_timeout": 20}
    config = ResilienceConfig(metrics=sink)
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs, resilience=config, **slow_keepalive) as client:
        mutex = DistributedMutex(client, "/r/l", lease_ttl=30)
        acquired, go = asyncio.Event(), asyncio.Event()
        keys: list[bytes] = []

        async def hold_then_release() -> None:  # holds are per task: one task does both
            assert await mutex.acquire(timeout=5)
            assert mutex.hold is not None
            keys.append(mutex.hold.key)
            acquired.set()
            await go.wait()
            if how == "task-cancel":
                await mutex.release()
            else:
                with anyio.fail_after(0.3):
                    await mutex.release()

        releasing = asyncio.create_task(hold_then_release())
        await acquired.wait()
        fresh_etcd_server.pause()
        try:
            go.set()
            await asyncio.sleep(0.3)  # the delete is in flight (the deadline fires now, too)
            if how == "task-cancel":
                releasing.cancel()
            await asyncio.sleep(0.5)
            assert not releasing.done()  # waiting for the delete's answer, not abandoning it
        finally:
            fresh_etcd_server.resume()
        expected = asyncio.CancelledError if how == "task-cancel" else TimeoutError
        with pytest.raises(expected):
            await asyncio.wait_for(releasing, 10)
        assert (await client.range(keys[0])).kvs == []  # deleted, not left to the lease
        assert not mutex.is_held
        await client.aclose()  # flushes the metrics
        assert sink.ends == ["released"]


@pytest.mark.slow
async def test_acquisition_timing_out_with_its_create_in_flight_leaves_no_key(
    fresh_etcd_server: Any,
) -> None:
    """The acquisition's own deadline (an anyio scope) fires while its queueing transaction is
    in flight: the create is answered first, then deleted by the cleanup, and ``acquire``
    answers False -- no waiter key is left behind to block the lock."""
    slow_keepalive: dict[str, Any] = {"keepalive_time": 60, "keepalive_timeout": 20}
    async with connect(**fresh_etcd_server.client_kwargs(), **slow_keepalive) as client:
        mutex = DistributedMutex(client, "/r/t", lease_ttl=30)
        assert await mutex.acquire(timeout=5)  # the pooled lease exists from here on
        await mutex.release()
        fresh_etcd_server.pause()
        try:
            acquiring = asyncio.create_task(mutex.acquire(timeout=0.3))
            await asyncio.sleep(0.8)  # the deadline has passed; the create is unanswered
            assert not acquiring.done()
        finally:
            fresh_etcd_server.resume()
        assert await asyncio.wait_for(acquiring, 10) is False
        assert (await client.range("/r/t/", prefix=True, keys_only=True)).kvs == []
        assert await mutex.acquire(timeout=5)  # nothing blocks the next holder
        await mutex.aclose()
