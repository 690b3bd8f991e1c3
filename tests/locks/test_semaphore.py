"""DistributedSemaphore: a randomized property test (never more than N holders), the canonical
count and its mismatch error, instance-owned permits, permit loss, timeouts."""

from __future__ import annotations

import asyncio
import gc
import random

import anyio
import pytest

from etcd_recipes import (
    INT32,
    ConnectionState,
    DistributedSemaphore,
    LockHold,
    LockNotHeldError,
    LockTimeoutError,
    Op,
    PermitLostError,
    SemaphorePermitMismatchError,
)
from tests.helpers import eventually, first_item_then_break, take

from .helpers import keys, queued


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_never_more_than_n_holders(etcd_client, etcd_prefix, seed):
    """Random mixes of scoped permits, split acquire/release from other tasks, timeouts and
    cancellations, on several instances; a checker counts holders the whole time."""
    rng = random.Random(seed)
    permits = rng.choice([1, 2, 3])
    path = etcd_prefix + "sem"
    instances = [DistributedSemaphore(etcd_client, path, permits) for _ in range(3)]
    inside = [0]
    peak = [0]
    completed = [0]

    def enter() -> None:
        inside[0] += 1
        peak[0] = max(peak[0], inside[0])
        assert inside[0] <= permits

    async def worker(i: int) -> None:
        r = random.Random(seed * 100 + i)
        sem = instances[i % len(instances)]
        for _ in range(6):
            choice = r.random()
            if choice < 0.5:
                async with sem.with_permit() as permit:
                    assert isinstance(permit, LockHold)
                    enter()
                    await asyncio.sleep(r.uniform(0, 0.01))
                    inside[0] -= 1
            elif choice < 0.75:
                # Split form: release from another task (permits belong to the instance).
                if await sem.acquire(timeout=2):
                    enter()
                    await asyncio.sleep(r.uniform(0, 0.01))
                    inside[0] -= 1
                    assert await asyncio.create_task(sem.release())
            else:
                try:
                    with anyio.fail_after(r.uniform(0.001, 0.02)):
                        async with sem:
                            enter()
                            try:
                                await asyncio.sleep(r.uniform(0, 0.02))
                            finally:
                                inside[0] -= 1
                except TimeoutError:
                    pass
            completed[0] += 1

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(12))), 60)
    assert completed[0] == 72 and 1 <= peak[0] <= permits
    # Nothing left behind: no holder keys; the permit count stays.
    assert await keys(etcd_client, path + "/holders/") == []
    assert INT32.decode((await etcd_client.get(path + "/permits")).value) == permits
    assert await instances[0].available_permits() == permits
    for sem in instances:
        await sem.aclose()


async def test_permit_count_is_fixed_by_the_first_instance(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    first = DistributedSemaphore(etcd_client, path, 3)
    async with first:
        pass
    assert (await etcd_client.get(path + "/permits")).value == b"\x00\x00\x00\x03"
    wrong = DistributedSemaphore(etcd_client, path, 5)
    with pytest.raises(SemaphorePermitMismatchError) as info:
        await wrong.acquire()
    assert (info.value.requested, info.value.canonical) == (5, 3)
    assert isinstance(info.value, ValueError) and "3" in str(info.value)
    with pytest.raises(ValueError):
        DistributedSemaphore(etcd_client, path, 0)
    await first.aclose()
    await wrong.aclose()


async def test_permits_belong_to_the_instance(etcd_client, etcd_prefix):
    sem = DistributedSemaphore(etcd_client, etcd_prefix + "sem", 2)
    with pytest.raises(LockNotHeldError):
        await sem.release()
    assert await sem.acquire() and await sem.acquire()
    assert sem.held_permits == 2 and await sem.available_permits() == 0
    first, second = await keys(etcd_client, etcd_prefix + "sem/holders/")
    assert sem.hold.key == second  # the most recent permit
    assert await asyncio.create_task(sem.release()) is True  # LIFO, from any task
    assert await keys(etcd_client, etcd_prefix + "sem/holders/") == [first]
    await sem.aclose()
    assert await sem.release() is False  # released by aclose()


async def test_with_permit_timeout_never_runs_the_body(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    holder = DistributedSemaphore(etcd_client, path, 1)
    other = DistributedSemaphore(etcd_client, path, 1)
    entered = False
    async with holder.with_permit():
        with pytest.raises(LockTimeoutError):
            async with other.with_permit(timeout=0.4):
                entered = True
        assert not await other.acquire(timeout=0.2)
        assert len(await keys(etcd_client, path + "/holders/")) == 1
    assert not entered
    await holder.aclose()
    await other.aclose()


async def test_permit_loss(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    sem = DistributedSemaphore(etcd_client, path, 1)
    successor = DistributedSemaphore(etcd_client, path, 1)
    causes: list[object] = []
    sem.add_permit_lost_listener(causes.append)
    finished = False
    with pytest.raises(PermitLostError):
        async with sem.with_permit() as permit:
            waiting = asyncio.create_task(successor.acquire())
            await queued(etcd_client, path + "/holders/", 2)
            await etcd_client.lease_revoke(permit.lease_id)
            await asyncio.sleep(10)
            finished = True
    assert not finished
    assert await asyncio.wait_for(waiting, 5)
    await eventually(lambda: len(causes) == 1, what="one permit-lost notification")
    assert sem.connection_state is ConnectionState.LOST
    assert not (await permit.guarded_txn([Op.put(etcd_prefix + "d", b"x")])).succeeded
    assert (await successor.hold.guarded_txn([Op.put(etcd_prefix + "d", b"y")])).succeeded
    await successor.release()
    # The split form: release() of a lost permit returns False.
    assert await sem.acquire(timeout=2)
    await etcd_client.lease_revoke(sem.hold.lease_id)
    await eventually(lambda: sem.held_permits == 0, what="the loss to be noticed")
    assert await sem.release() is False
    with pytest.raises(LockNotHeldError):
        await sem.release()
    await sem.aclose()
    await successor.aclose()


async def test_a_waiter_behind_a_released_waiter_is_not_stranded(etcd_client, etcd_prefix):
    """Waiters further back watch their predecessor; when it leaves (timeout) rather than
    being admitted, the one behind must re-evaluate, not wait forever."""
    path = etcd_prefix + "sem"
    holder, a, b, c = (DistributedSemaphore(etcd_client, path, 1) for _ in range(4))
    await holder.acquire()
    ta = asyncio.create_task(a.acquire(timeout=0.6))
    await queued(etcd_client, path + "/holders/", 2)
    tb = asyncio.create_task(b.acquire())
    await queued(etcd_client, path + "/holders/", 3)
    tc = asyncio.create_task(c.acquire())
    await queued(etcd_client, path + "/holders/", 4)
    assert await ta is False  # a gave up; b and c are still queued
    await holder.release()
    assert await asyncio.wait_for(tb, 5)
    assert not tc.done()
    await b.release()
    assert await asyncio.wait_for(tc, 5)
    await c.release()
    for s in (holder, a, b, c):
        await s.aclose()


async def test_permit_lost_events_yield_each_loss_and_end_on_close(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    sem = DistributedSemaphore(etcd_client, path, 2)
    losses = sem.permit_lost_events()
    causes: list[object] = []
    sem.add_permit_lost_listener(causes.append)
    for _ in range(2):  # two losses, one after the other
        assert await sem.acquire(timeout=5)
        await etcd_client.lease_revoke(sem.hold.lease_id)
        await eventually(lambda: sem.held_permits == 0, what="the loss to be noticed")
        assert await sem.release() is False
    got = await take(losses, 2)
    await eventually(lambda: len(causes) == 2, what="the listeners")
    assert got == causes and got[0] is not got[1]
    broke = asyncio.create_task(first_item_then_break(sem.permit_lost_events()))
    await eventually(lambda: sem._lost_events.stream_count == 2, what="registered")
    broke.cancel()
    await asyncio.wait({broke})
    del broke
    gc.collect()
    assert sem._lost_events.stream_count == 1
    await sem.aclose()
    assert [c async for c in losses] == []
    assert await keys(etcd_client, path + "/holders/") == []
