"""``timeout=0`` means "try once, do not wait", as everywhere else in Python: it takes a free
lock or permit, and gives up at once (leaving no waiter key) when it is taken."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    InvalidArgumentError,
    LockTimeoutError,
)

from .helpers import keys


async def test_mutex_try_once(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    first = DistributedMutex(etcd_client, path)
    second = DistributedMutex(etcd_client, path)
    assert await first.acquire(timeout=0)  # free: taken at once
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert not await second.acquire(timeout=0)
    assert loop.time() - t0 < 1.0
    assert len(await keys(etcd_client, path + "/")) == 1  # only the holder's key
    with pytest.raises(LockTimeoutError):
        async with second.with_lock(timeout=0):
            raise AssertionError("the body ran without the lock")
    await first.release()
    assert await second.acquire(timeout=0)
    await second.release()
    for bad in (-1, float("nan"), True):
        with pytest.raises(InvalidArgumentError):
            await first.acquire(timeout=bad)
    await first.aclose()
    await second.aclose()


async def test_same_instance_other_task_try_once(etcd_client, etcd_prefix):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "local")
    assert await mutex.acquire(timeout=0)
    assert await asyncio.create_task(mutex.acquire(timeout=0)) is False  # this instance's turn
    await mutex.release()
    await mutex.aclose()


async def test_semaphore_and_read_write_lock_try_once(etcd_client, etcd_prefix):
    semaphore = DistributedSemaphore(etcd_client, etcd_prefix + "s", 1)
    other = DistributedSemaphore(etcd_client, etcd_prefix + "s", 1)
    assert await semaphore.acquire(timeout=0)
    assert not await other.acquire(timeout=0)
    assert len(await keys(etcd_client, etcd_prefix + "s/holders/")) == 1
    await semaphore.release()
    assert await other.acquire(timeout=0)
    await other.release()
    rw = DistributedReadWriteLock(etcd_client, etcd_prefix + "rw")
    rival = DistributedReadWriteLock(etcd_client, etcd_prefix + "rw")
    assert await rw.write_lock.acquire(timeout=0)
    assert not await rival.read_lock.acquire(timeout=0)
    await rw.write_lock.release()
    assert await rival.read_lock.acquire(timeout=0)
    await rival.read_lock.release()
    for recipe in (semaphore, other, rw, rival):
        await recipe.aclose()
