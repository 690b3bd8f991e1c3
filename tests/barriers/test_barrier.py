"""DistributedBarrier against a real etcd: happy path, fixes of the reference's quirks,
cancellation, lease loss, server restart and compaction while waiting."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedBarrier,
    EmptyPathError,
    RecipeClosedError,
    connect,
)
from tests.helpers import eventually


async def test_set_wait_remove(etcd_client, etcd_prefix):
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path) as setter:
        assert await setter.set_barrier() is True
        assert await setter.is_barrier_set() is True
        assert await setter.set_barrier() is False  # already set
        kv = await etcd_client.get(path)
        assert kv is not None and kv.text.startswith(setter.client_id + ":")
        assert kv.lease != 0

        waiter = DistributedBarrier(etcd_client, path)
        task = asyncio.create_task(waiter.wait_on_barrier())
        await asyncio.sleep(0.2)
        assert not task.done()
        assert await setter.remove_barrier() is True
        assert await asyncio.wait_for(task, 5) is True
        assert await etcd_client.get(path) is None
        await waiter.aclose()


async def test_wait_times_out_and_missing_barrier_modes(etcd_client, etcd_prefix):
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path) as setter:
        await setter.set_barrier()
        waiter = DistributedBarrier(etcd_client, path)
        assert await waiter.wait_on_barrier(timeout=0.3) is False
    # Not set, wait_on_missing_barriers=False: returns at once.
    eager = DistributedBarrier(etcd_client, etcd_prefix + "never", wait_on_missing_barriers=False)
    assert await eager.wait_on_barrier(timeout=2) is True
    # Not set, default: waits for set-then-remove.
    patient = DistributedBarrier(etcd_client, etcd_prefix + "later")
    task = asyncio.create_task(patient.wait_on_barrier(timeout=10))
    await asyncio.sleep(0.2)
    async with DistributedBarrier(etcd_client, etcd_prefix + "later") as other:
        await other.set_barrier()
        await asyncio.sleep(0.2)
        assert not task.done()
        await other.remove_barrier()
    assert await asyncio.wait_for(task, 5) is True


async def test_only_the_setter_removes_and_rearm_works(etcd_client, etcd_prefix):
    path = etcd_prefix + "gate"
    async with (
        DistributedBarrier(etcd_client, path) as a,
        DistributedBarrier(etcd_client, path) as b,
    ):
        assert await a.set_barrier()
        assert await b.remove_barrier() is False  # b never set it: the reference deleted it
        assert await a.is_barrier_set()
        assert await a.remove_barrier() is True
        assert not await a.is_barrier_set()
        assert await a.set_barrier() is True  # re-arm after removal (the reference could not)
        assert await b.remove_barrier(force=True) is True
        assert not await a.is_barrier_set()


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
async def test_cancelled_wait_leaves_nothing_behind(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path) as setter:
        await setter.set_barrier()
        leases_before = etcd_client._leases.lease_count
        waiter = DistributedBarrier(etcd_client, path)
        if how == "task-cancel":
            task = asyncio.create_task(waiter.wait_on_barrier())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "anyio-fail-after":
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await waiter.wait_on_barrier()
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await waiter.wait_on_barrier()
        # Nothing left: only the setter's key under the prefix, no extra lease, no live watch.
        keys = [kv.key for kv in await etcd_client.get_prefix(etcd_prefix)]
        assert keys == [path.encode()]
        assert etcd_client._leases.lease_count == leases_before
        await eventually(lambda: etcd_client._watch_hub.watcher_count == 0, what="watch cleanup")
        await waiter.aclose()


async def test_waiters_released_when_setter_lease_is_lost(etcd_client, etcd_prefix):
    """Revoking the setter's lease out of band deletes the key: waiters are released (the
    documented spurious-lift window), then the lease heals and the barrier is set again."""
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path, lease_ttl=2) as setter:
        states: list[ConnectionState] = []
        setter.add_connection_state_listener(lambda new, old: states.append(new))
        await setter.set_barrier()
        old_lease = (await etcd_client.get(path)).lease
        waiter = DistributedBarrier(etcd_client, path)
        task = asyncio.create_task(waiter.wait_on_barrier(timeout=10))
        await asyncio.sleep(0.2)
        await etcd_client.lease_revoke(old_lease)
        assert await asyncio.wait_for(task, 5) is True

        # Healed: the key is back on a new lease, and the state went LOST -> RECONNECTED.
        async def rearmed() -> bool:
            kv = await etcd_client.get(path)
            return kv is not None and kv.lease != old_lease

        await eventually(rearmed, what="barrier re-armed by the healed lease")
        await eventually(lambda: states[-2:] == [ConnectionState.LOST, ConnectionState.RECONNECTED])
        assert setter.has_exceptions


@pytest.mark.slow
async def test_waiter_survives_restart_and_compaction(fresh_etcd_server, etcd_prefix):
    path = etcd_prefix + "gate"
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        async with DistributedBarrier(client, path, lease_ttl=10) as setter:
            await setter.set_barrier()
            waiter = DistributedBarrier(client, path)
            task = asyncio.create_task(waiter.wait_on_barrier(timeout=30))
            await asyncio.sleep(0.2)
            fresh_etcd_server.kill()
            await asyncio.sleep(0.3)
            fresh_etcd_server.restart()
            await asyncio.sleep(0.5)
            assert not task.done()
            # Churn and compact while the waiter is parked, then remove.
            for i in range(5):
                await client.put(etcd_prefix + f"noise/{i}", b"x")
            rev = (await client.put(etcd_prefix + "noise/last", b"x")).revision
            await client.compact(rev)
            assert not task.done()
            await setter.remove_barrier()
            assert await asyncio.wait_for(task, 10) is True


async def test_misuse(etcd_client, etcd_prefix):
    with pytest.raises(EmptyPathError):
        DistributedBarrier(etcd_client, "")
    with pytest.raises(ValueError):
        DistributedBarrier(etcd_client, etcd_prefix + "x", lease_ttl=-1)
    b = DistributedBarrier(etcd_client, etcd_prefix + "x")
    with pytest.raises(ValueError):
        await b.wait_on_barrier(timeout=0)
    await b.aclose()
    await b.aclose()  # idempotent
    with pytest.raises(RecipeClosedError):
        await b.set_barrier()
    with pytest.raises(RecipeClosedError):
        await b.start()


@pytest.mark.slow
async def test_waiter_resyncs_after_compaction_while_disconnected(
    etcd_client, etcd_proxy, etcd_prefix
):
    """The waiter's connection is blackholed; meanwhile the barrier is removed and history is
    compacted past the waiter's resume revision. On reconnect its watch gets a compaction
    error, the resync probe sees the barrier gone, and the waiter returns True."""
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path, lease_ttl=10) as setter:
        await setter.set_barrier()
        async with connect(etcd_proxy.url, keepalive_time=1, keepalive_timeout=0.5) as far:
            waiter = DistributedBarrier(far, path)
            events: list[object] = []
            waiter.add_connection_state_listener(lambda new, old: events.append(new))
            task = asyncio.create_task(waiter.wait_on_barrier(timeout=30))
            await asyncio.sleep(0.3)
            etcd_proxy.blackhole()
            await setter.remove_barrier()
            for i in range(3):
                await etcd_client.put(etcd_prefix + f"noise/{i}", b"x")
            rev = (await etcd_client.put(etcd_prefix + "noise/last", b"x")).revision
            await etcd_client.compact(rev)
            await asyncio.sleep(2.5)  # keepalive notices the dead peer
            etcd_proxy.restore()
            assert await asyncio.wait_for(task, 15) is True
            await eventually(lambda: ConnectionState.RECONNECTED in events)
            await waiter.aclose()
