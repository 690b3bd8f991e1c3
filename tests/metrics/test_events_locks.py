"""The locks report the metrics SPI v2 events: one ``lock_wait_finished`` per acquisition
(reentrant ones excepted), one ``lock_hold_finished`` per hold, ``lease_lost`` on a loss and a
``lock.acquire`` span; the blocking facade reports the same. Against a real etcd."""

from __future__ import annotations

import asyncio
import threading

import pytest

from etcd_recipes import (
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    InvalidArgumentError,
    LockLostError,
    ResilienceConfig,
    connect,
)
from etcd_recipes import sync as blocking

from ..helpers import eventually
from .recording import RecordingMetrics


def lock_events(sink: RecordingMetrics) -> list[tuple[str, tuple[object, ...]]]:
    """The queued lock events recorded, in order (durations checked, then dropped: they vary),
    after a flush. Spans are reported inline, so they are checked apart (:func:`spans`)."""
    return sink.events(("lock_wait_finished", "lock_hold_finished"))


async def test_acquire_and_release(client, sink, etcd_prefix):
    path = etcd_prefix + "m"
    async with DistributedMutex(client, path, metrics_name="orders") as mutex:
        async with mutex:
            pass
    assert lock_events(sink) == [
        ("lock_wait_finished", ("DistributedMutex", "orders", "acquired")),
        ("lock_hold_finished", ("DistributedMutex", "orders", "released")),
    ]
    assert sink.spans() == [
        ("DistributedMutex", "orders", "lock.acquire", path),
        ("lock.acquire", "acquired"),
    ]


async def test_acquire_timeout(client, sink, etcd_prefix):
    path = etcd_prefix + "m"
    holder = DistributedMutex(client, path)
    waiter = DistributedMutex(client, path)
    assert await holder.acquire()
    sink.flush()
    sink.clear()
    assert not await waiter.acquire(timeout=0.3)
    assert not await waiter.acquire(timeout=0)  # try once: a timeout too
    assert lock_events(sink) == [("lock_wait_finished", ("DistributedMutex", "", "timeout"))] * 2
    assert (
        sink.spans()
        == [
            ("DistributedMutex", "", "lock.acquire", path),
            ("lock.acquire", "timeout"),
        ]
        * 2
    )
    await holder.release()
    await holder.aclose()
    await waiter.aclose()


async def test_cancelled_acquire_reports_cancelled_and_leaves_no_key(client, sink, etcd_prefix):
    path = etcd_prefix + "m"
    holder = DistributedMutex(client, path)
    waiter = DistributedMutex(client, path)
    assert await holder.acquire()
    task = asyncio.ensure_future(waiter.acquire())

    # Parked on the local line (one client): waiting for its turn to queue a key.
    await eventually(lambda: "acquiring" in repr(waiter), what="the waiter to wait")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (left,) = (await client.range(path + "/", prefix=True)).kvs  # only the holder's key
    assert left.key == holder.hold.key
    waits = [args[3] for args in (sink.flush(), sink.of("lock_wait_finished"))[1]]
    assert waits == ["acquired", "cancelled"]
    ends = [args[1] for args in sink.of("span_end")]
    assert ends == ["acquired", "cancelled"]
    (_, _, error) = sink.of("span_end")[1]
    assert isinstance(error, asyncio.CancelledError)
    await holder.release()
    await holder.aclose()
    await waiter.aclose()


async def test_lost_hold_reports_lost_and_lease_revoked(client, sink, etcd_prefix, etcd_server):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(client, path, metrics_name="jobs")
    assert await mutex.acquire()
    lease_id = mutex.hold.lease_id
    async with connect(**etcd_server.client_kwargs()) as other:
        await other.lease_revoke(lease_id)
    await eventually(lambda: not mutex.is_held, what="the loss to be noticed")
    assert await mutex.release() is False
    await mutex.aclose()
    assert lock_events(sink)[-2:] == [
        ("lock_hold_finished", ("DistributedMutex", "jobs", "lost")),
        ("lease_lost", ("DistributedMutex", "jobs", "revoked")),
    ]
    assert [a[3] for a in sink.of("lock_hold_finished")] == ["lost"]  # once, not at release


async def test_lost_hold_under_a_with_block(client, sink, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(client, path)
    with pytest.raises(LockLostError):
        async with mutex:
            await client.delete(mutex.hold.key)  # out of band: the key is gone
            await asyncio.sleep(30)  # cancelled by the loss
    await mutex.aclose()
    sink.flush()
    assert [a[3] for a in sink.of("lock_hold_finished")] == ["lost"]
    assert sink.of("lease_lost") == [("DistributedMutex", "", "revoked")]


async def test_reentrant_acquisitions_are_not_reported(client, sink, etcd_prefix):
    async with DistributedMutex(client, etcd_prefix + "m") as mutex:  # the first hold
        for _ in range(3):
            assert await mutex.acquire()
        assert mutex.hold_count == 4
        for _ in range(3):
            await mutex.release()
    sink.flush()
    assert [a[3] for a in sink.of("lock_wait_finished")] == ["acquired"]
    assert [a[3] for a in sink.of("lock_hold_finished")] == ["released"]
    assert len(sink.of("start_span")) == 1


async def test_semaphore_permits(client, sink, etcd_prefix):
    path = etcd_prefix + "s"
    semaphore = DistributedSemaphore(client, path, 1, metrics_name="pool")
    await semaphore.start()  # not `async with`: that would take the permit itself
    try:
        async with semaphore.with_permit():
            assert not await semaphore.acquire(timeout=0.2)
        assert await semaphore.acquire()
        assert await semaphore.release()
    finally:
        await semaphore.aclose()
    recipe = "DistributedSemaphore"
    assert lock_events(sink) == [
        ("lock_wait_finished", (recipe, "pool", "acquired")),
        ("lock_wait_finished", (recipe, "pool", "timeout")),
        ("lock_hold_finished", (recipe, "pool", "released")),
        ("lock_wait_finished", (recipe, "pool", "acquired")),
        ("lock_hold_finished", (recipe, "pool", "released")),
    ]
    started = (recipe, "pool", "lock.acquire", path)
    assert sink.spans() == [
        started,
        ("lock.acquire", "acquired"),
        started,
        ("lock.acquire", "timeout"),
        started,
        ("lock.acquire", "acquired"),
    ]


async def test_semaphore_lost_permit(client, sink, etcd_prefix):
    semaphore = DistributedSemaphore(client, etcd_prefix + "s", 2)
    await semaphore.start()
    assert await semaphore.acquire()
    await client.lease_revoke(semaphore.hold.lease_id)
    await eventually(lambda: semaphore.held_permits == 0, what="the permit's loss")
    assert await semaphore.release() is False
    await semaphore.aclose()
    sink.flush()
    assert [a[3] for a in sink.of("lock_hold_finished")] == ["lost"]
    assert [a[2] for a in sink.of("lease_lost")] == ["revoked"]


async def test_rwlock_read_and_write(client, sink, etcd_prefix):
    path = etcd_prefix + "rw"
    async with DistributedReadWriteLock(client, path, metrics_name="catalog") as rw:
        async with rw.write_lock:
            async with rw.read_lock:  # shares the write hold (a downgrade): not reported
                pass
        async with rw.read_lock:
            pass
    recipe = "DistributedReadWriteLock"
    assert lock_events(sink) == [
        ("lock_wait_finished", (recipe, "catalog", "acquired")),
        ("lock_hold_finished", (recipe, "catalog", "released")),
        ("lock_wait_finished", (recipe, "catalog", "acquired")),
        ("lock_hold_finished", (recipe, "catalog", "released")),
    ]


async def test_bad_metrics_name(client, etcd_prefix):
    for make in (
        lambda: DistributedMutex(client, etcd_prefix + "m", metrics_name="no spaces"),
        lambda: DistributedSemaphore(client, etcd_prefix + "s", 1, metrics_name="x" * 65),
        lambda: DistributedReadWriteLock(client, etcd_prefix + "rw", metrics_name=7),
    ):
        with pytest.raises(InvalidArgumentError):
            make()


def test_sync_facade_from_a_thread_reports_the_same(etcd_server, etcd_prefix):
    sink = RecordingMetrics()
    path = etcd_prefix + "m"
    before = set(threading.enumerate())  # threads, not names: an earlier sink's has this name
    config = ResilienceConfig(metrics=sink)
    with blocking.connect(**etcd_server.client_kwargs(), resilience=config) as client:
        mutex = blocking.DistributedMutex(client, path, metrics_name="sync")

        def worker() -> None:
            for _ in range(3):
                with mutex:
                    pass
            assert not mutex.acquire(timeout=0) or mutex.release()

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        mutex.close()
    events = lock_events(sink)
    assert (
        events
        == [
            ("lock_wait_finished", ("DistributedMutex", "sync", "acquired")),
            ("lock_hold_finished", ("DistributedMutex", "sync", "released")),
        ]
        * 4
    )
    assert (
        sink.spans()
        == [
            ("DistributedMutex", "sync", "lock.acquire", path),
            ("lock.acquire", "acquired"),
        ]
        * 4
    )
    metric_threads = {t.name for t in set(threading.enumerate()) - before}
    assert {n for n in metric_threads if n.startswith("etcd-recipes-metrics")} == {
        "etcd-recipes-metrics[RecordingMetrics]"
    }  # one thread for the sink, not one per metric or per call
