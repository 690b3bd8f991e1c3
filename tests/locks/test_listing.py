"""Who holds and who waits: ``contenders()`` / ``holders()`` on the mutex, the read-write lock
and the semaphore (kazoo's), and a ``repr`` that tells the instance's state truthfully -- for
the async recipes and for their blocking twins (issue 16 item 4)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    LockParticipant,
    sync,
)
from tests.helpers import eventually

from .helpers import queued


async def test_mutex_contenders_in_line_order(etcd_client, etcd_prefix, rivals):
    path = etcd_prefix + "m"
    # Three clients, three keys (one client's mutexes wait locally behind its one key).
    holder, second, third = (DistributedMutex(c, path) for c in (etcd_client, *await rivals(2)))
    assert await holder.contenders() == [] and await holder.holders() == []
    await holder.acquire()
    waiting = []
    for n, m in enumerate((second, third), start=2):  # one at a time: their order is the test's
        waiting.append(asyncio.create_task(m.acquire()))
        await queued(etcd_client, path + "/", n)
    found = await third.contenders()
    assert [p.is_holder for p in found] == [True, False, False]
    first = found[0]
    assert isinstance(first, LockParticipant)
    assert first.key == holder.hold.key and first.lease_id == holder.hold.lease_id
    assert first.create_revision == holder.fencing_token and first.value == b""
    assert [p.create_revision for p in found] == sorted(p.create_revision for p in found)
    assert await second.holders() == [first]
    await holder.release()
    await waiting[0]
    assert [p.key for p in await holder.holders()] == [second.hold.key]
    await second.release()
    await asyncio.gather(*waiting)
    await third.release()
    for m in (holder, second, third):
        await m.aclose()


async def test_read_write_lock_holders_are_the_readers_before_a_writer(etcd_client, etcd_prefix):
    path = etcd_prefix + "rw"
    reader, writer, late = (DistributedReadWriteLock(etcd_client, path) for _ in range(3))
    await reader.read_lock.acquire()
    also_reading = DistributedReadWriteLock(etcd_client, path)
    await also_reading.read_lock.acquire()
    writing = asyncio.create_task(writer.write_lock.acquire())
    await queued(etcd_client, path + "/", 3)
    reading_late = asyncio.create_task(late.read_lock.acquire())  # behind the writer
    await queued(etcd_client, path + "/", 4)
    found = await late.contenders()
    assert [(b"/write-" in p.key, p.is_holder) for p in found] == [
        (False, True),
        (False, True),
        (True, False),
        (False, False),
    ]
    assert found[0].value == reader.client_id.encode()
    assert [p.key for p in await late.holders()] == [reader.read_lock.hold.key, found[1].key]
    await reader.read_lock.release()
    await also_reading.read_lock.release()
    await writing
    assert [p.key for p in await late.holders()] == [writer.write_lock.hold.key]
    await writer.write_lock.release()
    await reading_late
    await late.read_lock.release()
    for rw in (reader, writer, late, also_reading):
        await rw.aclose()


async def test_semaphore_holders_are_the_first_permits(etcd_client, etcd_prefix):
    path = etcd_prefix + "sem"
    a, b, c = (DistributedSemaphore(etcd_client, path, 2) for _ in range(3))
    await a.acquire()
    await b.acquire()
    waiting = asyncio.create_task(c.acquire())
    await queued(etcd_client, path + "/holders/", 3)
    found = await c.contenders()
    assert [p.is_holder for p in found] == [True, True, False]
    assert [p.value for p in found] == [s.client_id.encode() for s in (a, b, c)]
    assert [p.key for p in await c.holders()] == [a.hold.key, b.hold.key]
    await a.release()
    await waiting
    assert [p.key for p in await a.holders()] == [b.hold.key, c.hold.key]
    for s in (a, b, c):
        await s.aclose()


async def test_repr_tells_the_state(etcd_client, etcd_prefix):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m")
    assert "not held" in repr(mutex)
    await mutex.acquire()
    text = repr(mutex)
    assert f"held (token {mutex.fencing_token}, lease {mutex.hold.lease_id:x})" in text, text
    assert "new" not in text
    await etcd_client.lease_revoke(mutex.hold.lease_id)
    await eventually(lambda: "lost" in repr(mutex), what="the loss in the repr")
    await mutex.release()
    assert "not held" in repr(mutex)
    other = DistributedMutex(etcd_client, etcd_prefix + "m")
    await other.acquire()
    acquiring = asyncio.create_task(mutex.acquire())
    await eventually(lambda: "acquiring" in repr(mutex), what="acquiring in the repr")
    acquiring.cancel()
    with pytest.raises(asyncio.CancelledError):
        await acquiring
    await mutex.aclose()
    assert "closed" in repr(mutex)
    await other.aclose()

    rw = DistributedReadWriteLock(etcd_client, etcd_prefix + "rw")
    await rw.read_lock.acquire()
    assert "read: held" in repr(rw) and "write: not held" in repr(rw)
    assert "held" in repr(rw.read_lock)
    await rw.aclose()

    sem = DistributedSemaphore(etcd_client, etcd_prefix + "sem", 3)
    await sem.acquire()
    assert "1 of 3 permits held" in repr(sem)
    await sem.aclose()
    assert "closed" in repr(sem)


def test_sync_repr_tells_the_state(etcd_server, etcd_prefix):
    """The blocking twin's repr: a held mutex printed ``new`` before."""
    with sync.connect(**etcd_server.client_kwargs()) as client:
        mutex = sync.DistributedMutex(client, etcd_prefix + "m")
        with mutex:
            text = repr(mutex)
            assert "held (token" in text and " new " not in text, text
            (me,) = mutex.holders()
            assert me.key == mutex.hold.key and me.is_holder
        assert "not held" in repr(mutex)
        sem = sync.DistributedSemaphore(client, etcd_prefix + "s", 2)
        with sem:
            assert "1 of 2 permits held" in repr(sem)
            assert len(sem.contenders()) == 1
        rw = sync.DistributedReadWriteLock(client, etcd_prefix + "rw")
        with rw.write_lock:
            assert "write: held" in repr(rw)
            assert [p.is_holder for p in rw.holders()] == [True]
        mutex.close()
        assert "closed" in repr(mutex)
        sem.close()
        rw.close()
