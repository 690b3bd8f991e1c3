"""DistributedReadWriteLock: readers share, writers exclude, FIFO (a queued writer blocks later
readers), downgrade works, upgrade raises, loss cancels the body, the prefix quirk is fixed."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import DistributedReadWriteLock, LockLostError, LockUpgradeError, Op
from tests.helpers import eventually, first_item_then_break, take

from .helpers import keys, queued


@pytest.fixture
async def rws(etcd_client, etcd_prefix):
    made: list[DistributedReadWriteLock] = []

    def make() -> DistributedReadWriteLock:
        made.append(DistributedReadWriteLock(etcd_client, etcd_prefix + "rw"))
        return made[-1]

    yield make
    for rw in made:
        await rw.aclose()


async def test_readers_share_writers_exclude(etcd_client, etcd_prefix, rws):
    a, b, c = rws(), rws(), rws()
    async with a.read_lock:
        assert await b.read_lock.acquire(timeout=2)  # shared
        assert not await c.write_lock.acquire(timeout=0.3)
        await b.read_lock.release()
    async with a.write_lock:
        assert not await b.read_lock.acquire(timeout=0.3)
        assert not await c.write_lock.acquire(timeout=0.3)
    assert await c.write_lock.acquire(timeout=2)
    await c.write_lock.release()
    found = await keys(etcd_client, etcd_prefix + "rw/")
    assert found == []
    # Layout: <path>/read-<client id>:<7 chars>, value = client id.
    await a.read_lock.acquire()
    (key,) = await keys(etcd_client, etcd_prefix + "rw/")
    assert key.startswith(f"{etcd_prefix}rw/read-{a.client_id}:".encode())
    assert (await etcd_client.get(key)).value == a.client_id.encode()
    await a.read_lock.release()


async def test_fifo_a_queued_writer_blocks_later_readers(etcd_client, etcd_prefix, rws):
    reader1, writer, reader2 = rws(), rws(), rws()
    events: list[str] = []
    await reader1.read_lock.acquire()

    async def write() -> None:
        async with writer.write_lock:
            events.append("writer in")
            await asyncio.sleep(0.2)
            events.append("writer out")

    w = asyncio.create_task(write())
    await queued(etcd_client, etcd_prefix + "rw/", 2)
    assert not await reader2.read_lock.acquire(timeout=0.3)  # would overtake the writer

    async def read() -> None:
        async with reader2.read_lock:
            events.append("reader2 in")

    r = asyncio.create_task(read())
    await queued(etcd_client, etcd_prefix + "rw/", 3)
    await reader1.read_lock.release()
    await asyncio.wait_for(asyncio.gather(w, r), 5)
    assert events == ["writer in", "writer out", "reader2 in"]


async def test_downgrade_is_allowed_and_keeps_writers_out(etcd_client, etcd_prefix, rws):
    rw, other = rws(), rws()
    await rw.write_lock.acquire()
    token = rw.write_lock.fencing_token
    assert await rw.read_lock.acquire(timeout=1)  # downgrade: no waiting
    assert rw.read_lock.fencing_token == token
    assert await rw.write_lock.release() is True
    assert rw.read_lock.is_held and not rw.write_lock.is_held
    assert not await other.write_lock.acquire(timeout=0.3)  # still no writer in between
    assert (await rw.read_lock.guarded_txn([Op.put(etcd_prefix + "d", b"1")])).succeeded
    assert await rw.read_lock.release() is True
    assert await other.write_lock.acquire(timeout=2)
    await other.write_lock.release()


async def test_upgrade_raises(etcd_client, etcd_prefix, rws):
    rw = rws()
    async with rw.read_lock:
        with pytest.raises(LockUpgradeError):
            await rw.write_lock.acquire()
        with pytest.raises(RuntimeError):  # LockUpgradeError is a RuntimeError too
            async with rw.write_lock:
                pass
    async with rw.write_lock:  # fine once the read lock is released
        async with rw.write_lock:  # reentrant
            assert rw.write_lock.hold_count == 2


async def test_loss_cancels_the_body(etcd_client, etcd_prefix, rws):
    rw, other = rws(), rws()
    causes: list[object] = []
    rw.read_lock.add_lock_lost_listener(causes.append)
    finished = False
    with pytest.raises(LockLostError):
        async with rw.read_lock.with_lock() as hold:
            await etcd_client.lease_revoke(hold.lease_id)
            await asyncio.sleep(10)
            finished = True
    assert not finished
    await eventually(lambda: len(causes) == 1, what="one lock-lost notification")
    assert await other.write_lock.acquire(timeout=2)
    assert not (await hold.guarded_txn([Op.put(etcd_prefix + "d", b"x")])).succeeded
    await other.write_lock.release()
    assert rw.connection_state.value == "LOST"


async def test_sibling_prefix_does_not_conflict(etcd_client, etcd_prefix):
    """The reference read ``<path>`` without the slash, so /a also saw /ab's keys."""
    a = DistributedReadWriteLock(etcd_client, etcd_prefix + "a")
    ab = DistributedReadWriteLock(etcd_client, etcd_prefix + "ab")
    async with ab.write_lock:
        assert await a.write_lock.acquire(timeout=1)
        await a.write_lock.release()
    await a.aclose()
    await ab.aclose()


async def test_each_side_streams_its_own_losses(etcd_client, etcd_prefix, rws):
    rw = rws()
    read_losses = rw.read_lock.lock_lost_events()
    write_losses = rw.write_lock.lock_lost_events()
    causes: list[object] = []
    rw.write_lock.add_lock_lost_listener(causes.append)
    assert await rw.write_lock.acquire()
    await etcd_client.lease_revoke(rw.write_lock.hold.lease_id)
    [cause] = await take(write_losses, 1)
    await eventually(lambda: causes == [cause], what="the listener")
    assert read_losses.buffered == 0  # the read side lost nothing
    assert await rw.write_lock.release() is False
    broke = asyncio.create_task(first_item_then_break(rw.read_lock.lock_lost_events()))
    await eventually(lambda: rw.read_lock._lost_events.stream_count == 2, what="registered")
    assert await rw.read_lock.acquire(timeout=5)
    await etcd_client.lease_revoke(rw.read_lock.hold.lease_id)
    assert isinstance(await asyncio.wait_for(broke, 10), BaseException)
    del broke
    gc.collect()
    assert rw.read_lock._lost_events.stream_count == 1
    assert await rw.read_lock.release() is False
    await rw.aclose()  # ends both sides' streams
    assert len([c async for c in read_losses]) == 1
    assert [c async for c in write_losses] == []
    assert await keys(etcd_client, etcd_prefix + "rw/") == []
