"""No thundering herd: with N queued waiters, each release wakes one waiter, so the RPCs and
watch events per hand-off stay flat as N grows (anchors B #30)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedMutex, DistributedReadWriteLock, DistributedSemaphore

from .helpers import queued, traffic


async def _chain(client, acquire_all, count_keys: int, prefix: str, release_first):
    """Queue everything, then count the traffic of the whole hand-off chain."""
    tasks = acquire_all()
    await queued(client, prefix, count_keys)
    await asyncio.sleep(0.3)  # every waiter parked on its watch
    with traffic(client) as seen:
        await release_first()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return seen


async def _mutex_handoffs(client, path: str, waiters: int) -> tuple[float, float]:
    holder = DistributedMutex(client, path)
    others = [DistributedMutex(client, path) for _ in range(waiters)]
    await holder.acquire()
    order: list[int] = []

    async def take(i: int) -> None:
        async with others[i]:
            order.append(i)

    seen = await _chain(
        client,
        lambda: [asyncio.create_task(take(i)) for i in range(waiters)],
        1,  # one client: its waiters queue locally, behind its one key in etcd
        path + "/",
        holder.release,
    )
    assert order == list(range(waiters))  # first come, first served
    for m in (holder, *others):
        await m.aclose()
    return seen.rpc_total / waiters, seen.event_messages / waiters


@pytest.mark.parametrize("kind", ["mutex", "semaphore", "rw-writers"])
async def test_traffic_per_handoff_is_flat(etcd_client, etcd_prefix, kind):
    results = {}
    for waiters in (10, 50):
        path = f"{etcd_prefix}{kind}-{waiters}"
        if kind == "mutex":
            results[waiters] = await _mutex_handoffs(etcd_client, path, waiters)
        elif kind == "semaphore":
            results[waiters] = await _semaphore_handoffs(etcd_client, path, waiters)
        else:
            results[waiters] = await _rw_handoffs(etcd_client, path, waiters)
    (rpcs10, events10), (rpcs50, events50) = results[10], results[50]
    # Measured: mutex 2 RPCs (release + the successor's queueing) and no event per hand-off
    # (its waiters queue locally), writers 2 RPCs and 1 event; semaphore about 3.2 RPCs and 1.3 events (+ the admitted waiter's touch).
    limit_rpcs, limit_events = (4.0, 2.0) if kind == "semaphore" else (2.5, 1.5)
    assert rpcs10 <= limit_rpcs and rpcs50 <= limit_rpcs, results
    assert events10 <= limit_events and events50 <= limit_events, results
    assert rpcs50 <= rpcs10 + 0.5 and events50 <= events10 + 0.5, results  # flat in N


async def _semaphore_handoffs(client, path: str, waiters: int) -> tuple[float, float]:
    permits = 2
    holders = [DistributedSemaphore(client, path, permits) for _ in range(permits)]
    others = [DistributedSemaphore(client, path, permits) for _ in range(waiters)]
    for h in holders:
        await h.acquire()
    inside, peak = [0], [0]

    async def take(i: int) -> None:
        async with others[i]:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            await asyncio.sleep(0.002)
            inside[0] -= 1

    async def release_holders() -> None:
        for h in holders:
            await h.release()

    seen = await _chain(
        client,
        lambda: [asyncio.create_task(take(i)) for i in range(waiters)],
        waiters + permits,
        path + "/holders/",
        release_holders,
    )
    assert peak[0] <= permits
    for s in (*holders, *others):
        await s.aclose()
    return seen.rpc_total / waiters, seen.event_messages / waiters


async def _rw_handoffs(client, path: str, waiters: int) -> tuple[float, float]:
    holder = DistributedReadWriteLock(client, path)
    others = [DistributedReadWriteLock(client, path) for _ in range(waiters)]
    await holder.write_lock.acquire()

    async def take(i: int) -> None:
        async with others[i].write_lock:
            pass

    seen = await _chain(
        client,
        lambda: [asyncio.create_task(take(i)) for i in range(waiters)],
        waiters + 1,
        path + "/",
        holder.write_lock.release,
    )
    for rw in (holder, *others):
        await rw.aclose()
    return seen.rpc_total / waiters, seen.event_messages / waiters
