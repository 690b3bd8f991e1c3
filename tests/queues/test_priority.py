"""DistributedPriorityQueue against a real etcd: priority order, the guard key and its CAS,
bounded retries, pacing, range checks and the true-head re-read after waking."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcd_recipes import (
    JSON,
    MAX_PRIORITY,
    DistributedPriorityQueue,
    InvalidArgumentError,
    InvalidPriorityError,
    RetriesExhaustedError,
    ValueTooLargeError,
)
from tests.queues.helpers import keys


async def test_lower_number_first_fifo_within_a_priority(etcd_client, etcd_prefix):
    queue = DistributedPriorityQueue(etcd_client, etcd_prefix + "pq")
    plan = [(b"report", 200), (b"page-1", 1), (b"low", MAX_PRIORITY), (b"page-2", 1),
            (b"urgent", 0), (b"mid", 7)]  # fmt: skip
    for value, priority in plan:
        await queue.enqueue(value, priority)
    assert await queue.size() == 6
    out = [await queue.dequeue() for _ in range(6)]
    assert out == [b"urgent", b"page-1", b"page-2", b"mid", b"report", b"low"]
    assert await queue.try_dequeue() is None


async def test_raw_key_layout_and_guard(etcd_client, etcd_prefix):
    path = etcd_prefix + "pq"
    queue = DistributedPriorityQueue(etcd_client, path + "/")  # trailing slash normalised
    await queue.enqueue(b"a", 7)
    await queue.enqueue(b"b", 7)
    await queue.enqueue(b"c", 65535)
    items = {kv.key_text: kv.value for kv in await etcd_client.get_prefix(path + "/")}
    assert items == {
        f"{path}/00007/0000000000000000": b"a",
        f"{path}/00007/0000000000000001": b"b",
        f"{path}/65535/0000000000000000": b"c",
    }
    guards = {kv.key_text: kv.value for kv in await etcd_client.get_prefix("__" + path + "/")}
    # Outside <p>/; the value is the last sequence number written (the Kotlin library writes
    # "" and compares only the guard's revision, so either reads the other's guard).
    assert guards == {f"__{path}/00007": b"1", f"__{path}/65535": b"0"}
    assert await queue.dequeue() == b"a"
    assert await queue.size() == 2  # the guards are not items
    # The sequence continues from the last written, whatever was taken since.
    await queue.enqueue(b"d", 7)
    assert f"{path}/00007/0000000000000002" in await keys(etcd_client, path + "/")
    await etcd_client.delete("__" + path + "/", prefix=True)


async def test_a_guard_without_a_sequence_number_reads_the_bucket(etcd_client, etcd_prefix):
    """A Kotlin writer's guard (value ``""``), and a key taken by a writer that leaves the
    guard's number behind: the enqueue reads the bucket's last key and never overwrites."""
    path = etcd_prefix + "pq"
    queue = DistributedPriorityQueue(etcd_client, path)
    await etcd_client.put(f"{path}/00003/0000000000000041", b"jvm")  # as the JVM library does
    await etcd_client.put(f"__{path}/00003", b"")
    await queue.enqueue(b"ours", 3)
    assert (await etcd_client.get(f"{path}/00003/0000000000000042")).value == b"ours"
    # A writer that keeps no number in the guard takes the next key without touching it...
    await etcd_client.put(f"{path}/00003/0000000000000043", b"foreign")
    await queue.enqueue(b"after", 3)  # ...the create-only compare fails: the bucket is read
    assert (await etcd_client.get(f"{path}/00003/0000000000000043")).value == b"foreign"
    assert (await etcd_client.get(f"{path}/00003/0000000000000044")).value == b"after"
    assert [await queue.dequeue() for _ in range(4)] == [b"jvm", b"ours", b"foreign", b"after"]
    await etcd_client.delete("__" + path + "/", prefix=True)


@pytest.mark.parametrize("bad", [70000, -1, 65536, 1.5, "1", True, None])
async def test_out_of_range_priority_is_an_error_not_a_wrap(etcd_client, etcd_prefix, bad):
    queue = DistributedPriorityQueue(etcd_client, etcd_prefix + "pq")
    with pytest.raises(InvalidPriorityError) as err:
        await queue.enqueue(b"x", bad)  # type: ignore[arg-type]
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value, InvalidArgumentError)
    assert await keys(etcd_client, etcd_prefix) == []
    assert await keys(etcd_client, "__" + etcd_prefix) == []  # 70000 % 65536 = 4464: not filed


async def test_a_value_over_the_server_limit_writes_nothing(etcd_client, etcd_prefix):
    queue = DistributedPriorityQueue(etcd_client, etcd_prefix + "pq")
    with pytest.raises(ValueTooLargeError):
        await queue.enqueue(b"v" * (2 * 1024 * 1024), 1)
    assert await keys(etcd_client, etcd_prefix) == []
    assert await keys(etcd_client, "__" + etcd_prefix) == []  # not even the guard


async def test_concurrent_producers_of_one_priority_never_collide(etcd_client, etcd_prefix):
    path = etcd_prefix + "pq"
    producers = [DistributedPriorityQueue(etcd_client, path) for _ in range(6)]
    await asyncio.gather(*(p.enqueue(b"%d-%d" % (i, j), 3) for i, p in enumerate(producers)
                           for j in range(5)))  # fmt: skip
    kvs = (await etcd_client.get_prefix(path + "/")).kvs
    assert len(kvs) == 30
    assert [kv.key_text.rsplit("/", 1)[1] for kv in kvs] == [f"{n:016d}" for n in range(30)]
    # Per producer, FIFO within the priority holds.
    for i in range(6):
        mine = [kv.value for kv in kvs if kv.value.startswith(b"%d-" % i)]
        assert mine == [b"%d-%d" % (i, j) for j in range(5)]
    await etcd_client.delete("__" + path + "/", prefix=True)


async def test_cas_retries_are_bounded(etcd_client, etcd_prefix):
    """A competitor that wins every round: after 50 attempts, RetriesExhaustedError, nothing
    written by us."""
    path = etcd_prefix + "pq"
    queue = DistributedPriorityQueue(etcd_client, path)
    real_txn = etcd_client.txn
    attempts = 0

    async def losing_txn(compare, success=(), failure=(), **kwargs):
        nonlocal attempts
        if compare:  # the guarded enqueue: someone else touches the guard first
            attempts += 1
            await etcd_client.put(f"__{path}/00004", b"")
        return await real_txn(compare, success, failure, **kwargs)

    etcd_client.txn = losing_txn
    try:
        with pytest.raises(RetriesExhaustedError) as err:
            await queue.enqueue(b"never", 4)
    finally:
        del etcd_client.txn
    assert attempts == 50
    assert err.value.attempts == 50
    assert "after 50 attempts" in str(err.value)
    assert await keys(etcd_client, path + "/") == []
    await etcd_client.delete("__" + path + "/", prefix=True)


async def test_minimum_wait_time_paces_one_instance(etcd_client, etcd_prefix):
    with pytest.raises(InvalidArgumentError):
        DistributedPriorityQueue(etcd_client, etcd_prefix + "pq", minimum_wait_time=-1)
    paced = DistributedPriorityQueue(etcd_client, etcd_prefix + "pq", minimum_wait_time=0.15)
    assert paced.minimum_wait_time == 0.15
    started = time.monotonic()
    await asyncio.gather(*(paced.enqueue(b"%d" % i, 1) for i in range(4)))
    assert time.monotonic() - started >= 0.45  # three gaps of at least 0.15 s
    assert [await paced.dequeue() for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    await etcd_client.delete("__" + etcd_prefix, prefix=True)


async def test_waking_consumer_takes_the_true_head(etcd_client, etcd_prefix):
    """The wake-up put is not necessarily the head: after waking, the head is re-read. Here a
    priority-1 item lands after the watch fired on a priority-200 put."""
    path = etcd_prefix + "pq"
    consumer = DistributedPriorityQueue(etcd_client, path)
    producer = DistributedPriorityQueue(etcd_client, path, codec=None)
    real_wait = consumer._wait_for_item

    async def wake_then_race(revision, timeout):
        woke = await real_wait(revision, timeout)
        await producer.enqueue(b"urgent", 1)  # arrives between the wake-up and the re-read
        return woke

    consumer._wait_for_item = wake_then_race
    task = asyncio.create_task(consumer.dequeue())
    await asyncio.sleep(0.3)
    await producer.enqueue(b"routine", 200)
    assert await asyncio.wait_for(task, 5) == b"urgent"
    assert await consumer.dequeue() == b"routine"
    await etcd_client.delete("__" + etcd_prefix, prefix=True)


async def test_typed_priority_queue(etcd_client, etcd_prefix):
    jobs = DistributedPriorityQueue(etcd_client, etcd_prefix + "pq", codec=JSON)
    await jobs.enqueue({"job": "nightly"}, 100)
    await jobs.enqueue({"job": "page"}, 2)
    assert await jobs.poll(1) == {"job": "page"}
    assert await jobs.dequeue() == {"job": "nightly"}
    await etcd_client.delete("__" + etcd_prefix, prefix=True)
