"""The cancellation contract for lock acquisitions: a cancelled acquire leaves no waiter key and
no lease (read back from etcd: its pooled lease carries no key and is revoked once idle),
re-raises the caller's own cancellation, and does not delay the next waiter in line."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from etcd_recipes import DistributedMutex, DistributedReadWriteLock, DistributedSemaphore
from tests.helpers import eventually

from .helpers import GIVE_UP, keys, lease_alive, lease_keys, lease_of, queued, short_idle_window


@pytest.fixture(autouse=True)
def _short_idle(monkeypatch):
    short_idle_window(monkeypatch)


_cancel_task = GIVE_UP["task-cancel"]
_fail_after = GIVE_UP["anyio-fail-after"]
HOW = GIVE_UP


@pytest.mark.parametrize("how", list(HOW))
async def test_cancelled_mutex_waiter_leaves_nothing_and_delays_no_one(
    etcd_client, etcd_prefix, how, rivals
):
    path = etcd_prefix + "m"
    # Three clients: three waiter keys in etcd (one client's mutexes queue locally).
    holder, cancelled, next_in_line = (
        DistributedMutex(c, path) for c in (etcd_client, *await rivals(2))
    )
    await holder.acquire()
    attempt = asyncio.create_task(HOW[how](cancelled.acquire()))
    _, doomed = await queued(etcd_client, path + "/", 2)
    next_task = asyncio.create_task(next_in_line.acquire())
    await queued(etcd_client, path + "/", 3)
    await attempt  # cancelled meanwhile (it was queued between the holder and next_in_line)
    remaining = await keys(etcd_client, path + "/")
    assert doomed not in remaining and len(remaining) == 2
    assert await lease_keys(etcd_client, lease_of(doomed)) == []
    assert cancelled._session.leases == []
    await eventually(
        lambda: _dead(etcd_client, lease_of(doomed)), what="the idle lease to be revoked"
    )
    released = time.monotonic()
    await holder.release()
    assert await asyncio.wait_for(next_task, 5)
    assert time.monotonic() - released < 0.5  # a prompt hand-off, not a timeout somewhere
    await next_in_line.release()
    for m in (holder, cancelled, next_in_line):
        await m.aclose()


@pytest.mark.parametrize("deadline", [0.0005, 0.002, 0.005, 0.02])
async def test_cancelled_at_any_point_leaves_nothing(etcd_client, etcd_prefix, deadline):
    """Cancel at arbitrary points, including mid-RPC (the lease grant, the queueing
    transaction, the predecessor read, the watch set-up)."""
    granted: list[int] = []
    grant = etcd_client._grant_lease  # every grant goes through it (lease_grant too)

    async def recording_grant(ttl, **kwargs):
        result = await grant(ttl, **kwargs)
        granted.append(result.id)
        return result

    etcd_client._grant_lease = recording_grant
    path = etcd_prefix + "m"
    holder = DistributedMutex(etcd_client, path)
    await holder.acquire()
    outcomes = set()
    for _ in range(6):
        waiter = DistributedMutex(etcd_client, path)
        try:
            with anyio.fail_after(deadline):
                await waiter.acquire()
            outcomes.add("acquired?!")
        except TimeoutError:
            outcomes.add("timeout")
    del etcd_client._grant_lease
    assert outcomes == {"timeout"}
    assert [lease_of(k) for k in await keys(etcd_client, path + "/")] == [holder.hold.lease_id]
    for lease in granted:
        if lease != holder.hold.lease_id:
            assert await lease_keys(etcd_client, lease) == []
            await eventually(
                lambda gone=lease: _dead(etcd_client, gone), what="idle leases revoked"
            )
    assert await lease_alive(etcd_client, holder.hold.lease_id)
    await holder.aclose()


async def _dead(client, lease_id: int) -> bool:
    return not await lease_alive(client, lease_id)


async def test_cancelled_rw_waiter_leaves_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "rw"
    holder = DistributedReadWriteLock(etcd_client, path)
    waiter = DistributedReadWriteLock(etcd_client, path)
    await holder.read_lock.acquire()
    await _fail_after(waiter.write_lock.acquire())
    (key,) = await keys(etcd_client, path + "/")
    assert key.startswith(f"{path}/read-".encode())
    assert waiter._session.leases == []
    await holder.aclose()
    await waiter.aclose()


async def test_cancelled_semaphore_waiter_leaves_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    holder = DistributedSemaphore(etcd_client, path, 1)
    waiter, next_in_line = (DistributedSemaphore(etcd_client, path, 1) for _ in range(2))
    await holder.acquire()
    attempt = asyncio.create_task(_cancel_task(waiter.acquire()))
    await queued(etcd_client, path + "/holders/", 2)
    next_task = asyncio.create_task(next_in_line.acquire())
    await queued(etcd_client, path + "/holders/", 3)
    await attempt
    assert len(await keys(etcd_client, path + "/holders/")) == 2
    assert waiter._session.leases == []
    await holder.release()
    assert await asyncio.wait_for(next_task, 2)
    await next_in_line.release()
    for s in (holder, waiter, next_in_line):
        await s.aclose()
