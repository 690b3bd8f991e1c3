"""DistributedSemaphore with several permits per acquisition: n holder keys in one transaction
(readable by key-counting clients), all or nothing, FIFO with one-permit waiters, cancel-safe,
never more than ``permits`` in use, the inspection view and the blocking facade."""

from __future__ import annotations

import asyncio
import random

import pytest

from etcd_recipes import DistributedSemaphore, InvalidArgumentError, PermitLostError
from etcd_recipes.locks.inspection import semaphore_state

from .helpers import GIVE_UP, keys, queued


async def test_two_permits_are_two_keys_of_one_transaction(etcd_client, etcd_prefix):
    path = etcd_prefix + "s"
    semaphore = DistributedSemaphore(etcd_client, path, permits=3)
    assert await semaphore.acquire(permits=2)
    assert semaphore.held_permits == 2
    assert await semaphore.available_permits() == 1  # what a key-counting client computes
    found = (await etcd_client.get_prefix(path + "/holders/")).kvs
    assert len(found) == 2
    lead, extra = sorted(kv.key for kv in found)
    assert extra == lead + b".2"
    assert len({kv.create_revision for kv in found}) == 1  # one transaction
    assert {kv.lease for kv in found} == {semaphore.hold.lease_id}
    assert {kv.value for kv in found} == {semaphore.client_id.encode()}
    assert semaphore.hold.key == lead
    assert [p.is_holder for p in await semaphore.holders()] == [True, True]
    state = await semaphore_state(etcd_client, path)
    assert len(state.holders) == 2 and state.waiters == []
    assert await semaphore.try_acquire()  # the third permit
    assert not await semaphore.try_acquire()
    assert await semaphore.release()  # the last acquisition: one permit
    assert await semaphore.release()  # then both permits of the first
    assert await keys(etcd_client, path + "/holders/") == []
    await semaphore.aclose()


async def test_bad_permit_counts_write_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "s"
    semaphore = DistributedSemaphore(etcd_client, path, permits=2)
    for bad in (0, 3, True, 1.5):
        with pytest.raises(InvalidArgumentError):
            await semaphore.acquire(permits=bad)  # type: ignore[arg-type]
    assert await keys(etcd_client, path + "/") == []
    await semaphore.aclose()


async def test_try_acquire_is_all_or_nothing(etcd_client, etcd_prefix, rivals):
    path = etcd_prefix + "s"
    (other,) = await rivals(1)
    theirs = DistributedSemaphore(other, path, permits=3)
    mine = DistributedSemaphore(etcd_client, path, permits=3)
    assert await theirs.acquire(permits=2)
    before = await keys(etcd_client, path + "/holders/")
    assert not await mine.try_acquire(permits=2)
    assert not await mine.acquire(timeout=0.3, permits=2)
    assert await keys(etcd_client, path + "/holders/") == before  # nothing left queued
    assert await mine.try_acquire(permits=1)
    await mine.release()
    await theirs.release()
    await mine.aclose()
    await theirs.aclose()


async def test_waiter_for_two_keeps_its_place_in_line(etcd_client, etcd_prefix, rivals):
    """permits=3, two single permits held: a waiter for two queues, then a waiter for one.
    The first release admits the pair (not the single one behind it); the second, the single."""
    path = etcd_prefix + "s"
    clients = await rivals(3)
    holder, pair, single = (DistributedSemaphore(c, path, permits=3) for c in clients)
    assert await holder.acquire() and await holder.acquire()
    taking_pair = asyncio.create_task(pair.acquire(timeout=20, permits=2))
    await queued(etcd_client, path + "/holders/", 4)
    taking_single = asyncio.create_task(single.acquire(timeout=20))
    await queued(etcd_client, path + "/holders/", 5)
    state = await semaphore_state(etcd_client, path)
    assert len(state.holders) == 2 and len(state.waiters) == 3  # the pair is not half-admitted
    await holder.release()
    assert await asyncio.wait_for(taking_pair, 10)
    await asyncio.sleep(0.3)
    assert not taking_single.done()  # 1 + 2 permits in use: none left
    await holder.release()
    assert await asyncio.wait_for(taking_single, 10)
    assert pair.held_permits == 2 and single.held_permits == 1
    await pair.release()
    await single.release()
    for s in (holder, pair, single):
        await s.aclose()
    assert await keys(etcd_client, path + "/holders/") == []


@pytest.mark.parametrize("how", list(GIVE_UP))
async def test_cancelled_wait_for_several_permits_leaves_no_key(
    etcd_client, etcd_prefix, rivals, how
):
    path = etcd_prefix + "s"
    (other,) = await rivals(1)
    theirs = DistributedSemaphore(other, path, permits=3)
    mine = DistributedSemaphore(etcd_client, path, permits=3)
    assert await theirs.acquire(permits=2)
    before = await keys(etcd_client, path + "/holders/")
    await GIVE_UP[how](mine.acquire(permits=3))

    async def scoped() -> None:
        async with mine.with_permit(permits=2):
            raise AssertionError("the body must not run")

    await GIVE_UP[how](scoped())
    assert await keys(etcd_client, path + "/holders/") == before
    assert mine.held_permits == 0
    await theirs.release()
    assert await keys(etcd_client, path + "/holders/") == []
    await mine.aclose()
    await theirs.aclose()


async def test_never_more_than_permits_in_use(etcd_client, etcd_prefix, rivals):
    path = etcd_prefix + "s"
    clients = [etcd_client, *await rivals(3)]
    in_use, peak, errors = 0, 0, []

    async def worker(i: int) -> None:
        nonlocal in_use, peak
        rng = random.Random(i)
        semaphore = DistributedSemaphore(clients[i % len(clients)], path, permits=4)
        try:
            for _ in range(4):
                n = rng.randint(1, 3)
                async with semaphore.with_permit(timeout=30, permits=n):
                    in_use += n
                    peak = max(peak, in_use)
                    if in_use > 4:
                        errors.append(in_use)
                    await asyncio.sleep(rng.uniform(0, 0.01))
                    in_use -= n
        finally:
            await semaphore.aclose()

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(8))), 90)
    assert errors == [] and 1 < peak <= 4
    assert await keys(etcd_client, path + "/holders/") == []


async def test_losing_the_lease_of_several_permits_cancels_the_body(etcd_client, etcd_prefix):
    path = etcd_prefix + "s"
    semaphore = DistributedSemaphore(etcd_client, path, permits=3)
    entered = asyncio.Event()

    async def body() -> None:
        async with semaphore.with_permit(timeout=5, permits=3) as permit:
            entered.set()
            await etcd_client.lease_revoke(permit.lease_id)  # out of band
            await asyncio.sleep(30)

    with pytest.raises(PermitLostError):
        await asyncio.wait_for(body(), 10)
    assert entered.is_set()
    assert await keys(etcd_client, path + "/holders/") == []  # the lease took all three
    assert await semaphore.try_acquire(permits=3)
    await semaphore.release()
    await semaphore.aclose()


def test_blocking_facade_takes_several_permits(etcd_server, etcd_prefix):
    from etcd_recipes.sync import DistributedSemaphore as SyncSemaphore
    from etcd_recipes.sync import LockTimeoutError, connect

    path = etcd_prefix + "s"
    with connect(**etcd_server.client_kwargs()) as client:
        semaphore = SyncSemaphore(client, path, permits=2)
        assert semaphore.try_acquire(permits=2)
        assert not semaphore.try_acquire()
        with pytest.raises(LockTimeoutError):
            with semaphore.with_permit(timeout=0.2, permits=1):
                pass
        assert semaphore.release()
        with semaphore.with_permit(timeout=5, permits=2) as permit:
            assert permit.fencing_token > 0 and semaphore.held_permits == 2
        assert client.get_prefix(path + "/holders/").kvs == []
        semaphore.close()


@pytest.mark.slow
async def test_waiter_for_several_permits_survives_restart_and_compaction(
    fresh_etcd_server, etcd_prefix
):
    from etcd_recipes import connect

    path = etcd_prefix + "s"
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as mine, connect(**kwargs) as theirs:
        holder = DistributedSemaphore(theirs, path, permits=3, lease_ttl=10)
        waiter = DistributedSemaphore(mine, path, permits=3, lease_ttl=10)
        assert await holder.acquire(permits=2)
        pending = asyncio.create_task(waiter.acquire(timeout=30, permits=2))
        await queued(mine, path + "/holders/", 4)
        fresh_etcd_server.kill()
        await asyncio.sleep(0.3)
        fresh_etcd_server.restart()
        assert await holder.release()  # the waiter's watch may not see this delete live ...
        for i in range(3):
            rev = (await theirs.put(f"{etcd_prefix}noise/{i}", b"x")).revision
        await theirs.compact(rev)  # ... and its history is gone: the probe finds it
        assert await asyncio.wait_for(pending, 20) is True
        assert waiter.held_permits == 2
        assert await waiter.release()
        assert await keys(mine, path + "/holders/") == []
        await holder.aclose()
        await waiter.aclose()
