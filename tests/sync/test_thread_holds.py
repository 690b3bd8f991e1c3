"""Through the blocking facade, holds belong to the calling thread -- as they belong to the
calling task in async code: reentrancy, is_held, hold_count and downgrades mean "this thread"."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from etcd_recipes.sync import (
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    EtcdClient,
    LockNotHeldError,
)


def _in_thread(fn: Any) -> Any:
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the other thread hung"
    if errors:
        raise errors[0]
    return result[0]


def test_nested_with_on_one_mutex_is_reentrant_per_thread(
    client: EtcdClient, etcd_prefix: str
) -> None:
    mutex = DistributedMutex(client, etcd_prefix + "m")
    with mutex:
        with mutex:  # deadlocked before: each blocking call was a task of its own
            assert mutex.is_held and mutex.hold_count == 2
        assert mutex.hold_count == 1
        # Another thread does not hold it, and cannot take it meanwhile.
        assert _in_thread(lambda: mutex.is_held) is False
        assert _in_thread(lambda: mutex.acquire(timeout=0.5)) is False
    assert not mutex.is_held
    assert mutex.acquire(timeout=2) and mutex.acquire(timeout=2)  # True at once, twice
    assert mutex.hold_count == 2
    with pytest.raises(LockNotHeldError):
        _in_thread(mutex.release)  # not that thread's hold (and this thread is alive)
    assert mutex.release() and mutex.release()
    assert not mutex.is_held
    mutex.close()


def test_a_finished_threads_hold_can_be_released_by_another(
    client: EtcdClient, etcd_prefix: str
) -> None:
    mutex = DistributedMutex(client, etcd_prefix + "orphan")
    assert _in_thread(lambda: mutex.acquire(timeout=5)) is True
    assert mutex.release()  # the taking thread has ended: its hold is anyone's to release
    mutex.close()


def test_read_write_lock_downgrade_per_thread(client: EtcdClient, etcd_prefix: str) -> None:
    rw = DistributedReadWriteLock(client, etcd_prefix + "rw")
    with rw.write_lock:
        with rw.read_lock:  # a downgrade: the same thread holds the write lock
            assert rw.read_lock.is_held and rw.write_lock.is_held
        assert _in_thread(lambda: rw.read_lock.acquire(timeout=0.5)) is False
    rw.close()


def test_semaphore_with_blocks_nest_per_thread(client: EtcdClient, etcd_prefix: str) -> None:
    semaphore = DistributedSemaphore(client, etcd_prefix + "s", 2)
    with semaphore:
        with semaphore:  # two permits, both this thread's blocks
            assert semaphore.held_permits == 2
        assert semaphore.held_permits == 1
    assert semaphore.held_permits == 0
    semaphore.close()
