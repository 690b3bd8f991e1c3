"""The cancellation contract at its sharpest: cancel at arbitrary points, including while a
gRPC call is in flight, and check the caller sees its own cancellation and nothing is left."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from etcd_recipes import DistributedBarrier
from tests.helpers import eventually

DEADLINES = [0.0001, 0.0003, 0.0006, 0.001, 0.002, 0.004]


async def test_anyio_fail_after_around_rpcs_raises_timeout_error(etcd_client, etcd_prefix):
    """grpc.aio replaces cancellation exceptions; anyio must still recognise its own."""
    outcomes = {"timeout": 0, "completed": 0}
    for deadline in DEADLINES:
        for i in range(10):
            try:
                with anyio.fail_after(deadline):
                    await etcd_client.put(etcd_prefix + f"k{i}", b"v")
                outcomes["completed"] += 1
            except TimeoutError:
                outcomes["timeout"] += 1
    assert outcomes["timeout"] > 0  # the scope really fired mid-call at least sometimes
    assert sum(outcomes.values()) == len(DEADLINES) * 10


async def test_asyncio_timeout_around_rpcs_raises_timeout_error(etcd_client, etcd_prefix):
    timeouts = 0
    for deadline in DEADLINES:
        for _ in range(10):
            try:
                async with asyncio.timeout(deadline):
                    await etcd_client.get(etcd_prefix + "k")
            except TimeoutError:
                timeouts += 1
    assert timeouts > 0


@pytest.mark.parametrize("deadline", [0.0005, 0.002, 0.01, 0.05])
async def test_barrier_wait_cancelled_at_any_point_leaves_nothing(
    etcd_client, etcd_prefix, deadline
):
    path = etcd_prefix + "gate"
    async with DistributedBarrier(etcd_client, path) as setter:
        await setter.set_barrier()
        leases = etcd_client._leases.lease_count
        for _ in range(5):
            waiter = DistributedBarrier(etcd_client, path)
            with pytest.raises(TimeoutError):
                with anyio.fail_after(deadline):
                    await waiter.wait_on_barrier()
        await eventually(lambda: etcd_client._watch_hub.watcher_count == 0, what="no watches")
        assert etcd_client._leases.lease_count == leases
        assert [kv.key for kv in await etcd_client.get_prefix(etcd_prefix)] == [path.encode()]


async def test_cleanup_survives_a_second_native_cancel(etcd_client, etcd_prefix):
    """A task cancelled again while its recipe cleans up (as a task group does when a sibling
    fails) still finishes the cleanup: the transient key and its lease are gone."""
    from etcd_recipes.keyvalue import TransientKeyValue

    key = etcd_prefix + "presence"
    started = asyncio.Event()
    lease_ids: list[int] = []

    async def owner() -> None:
        async with TransientKeyValue(etcd_client, key, b"x", lease_ttl=30) as tkv:
            lease_ids.append(tkv.lease_id)
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(owner())
    await started.wait()
    task.cancel()
    for _ in range(20):  # keep cancelling while __aexit__ revokes the lease
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await etcd_client.get(key) is None
    assert (await etcd_client.lease_time_to_live(lease_ids[0])).ttl == -1
