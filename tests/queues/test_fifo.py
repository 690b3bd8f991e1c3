"""DistributedQueue against a real etcd: order, batches, the anchored wait, codecs, raw key
layout, bad input and metrics."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from etcd_recipes import (
    INT32,
    JSON,
    UTF8,
    DistributedQueue,
    EmptyPathError,
    InvalidArgumentError,
    RecipeClosedError,
    ResilienceConfig,
    TooManyOperationsError,
    ValueTooLargeError,
    connect,
)
from etcd_recipes.metrics import EtcdMetrics
from tests.queues.helpers import keys


async def test_fifo_order_size_try_and_poll(etcd_client, etcd_prefix):
    async with DistributedQueue(etcd_client, etcd_prefix + "q") as queue:
        assert await queue.try_dequeue() is None
        started = time.monotonic()
        assert await queue.poll(0.3) is None
        assert time.monotonic() - started >= 0.29
        for i in range(5):
            await queue.enqueue(b"item-%d" % i)
        assert await queue.size() == 5
        assert await queue.dequeue() == b"item-0"
        assert await queue.try_dequeue() == b"item-1"
        assert await queue.poll(1) == b"item-2"
        assert [await queue.dequeue(), await queue.dequeue()] == [b"item-3", b"item-4"]
        assert await queue.size() == 0
        assert await keys(etcd_client, etcd_prefix) == []


async def test_order_is_commit_order_not_the_clock_in_the_key(etcd_client, etcd_prefix):
    """The FIFO is ordered by mod revision: an item whose key carries an *older* timestamp
    (a producer with a slow clock) still comes after items committed before it."""
    path = etcd_prefix + "q"
    queue = DistributedQueue(etcd_client, path)
    await queue.enqueue(b"first")
    await etcd_client.put(path + "/0000000000000000001-old", b"second")  # a slow clock
    await queue.enqueue(b"third")
    assert [await queue.dequeue() for _ in range(3)] == [b"first", b"second", b"third"]


async def test_batches_keep_argument_order_beyond_twelve(etcd_client, etcd_prefix):
    """etcd sorts equal revisions unstably past 12 items; the batch still comes out in argument
    order, and batches interleave with single items by commit order."""
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    await queue.enqueue(b"before")
    batch = [b"b%03d" % i for i in range(100)]
    await queue.enqueue_all(batch)
    await queue.enqueue(b"after")
    await queue.enqueue_all([b"c%03d" % i for i in range(20)])
    out = [await queue.dequeue() for _ in range(122)]
    assert out == [b"before", *batch, b"after", *(b"c%03d" % i for i in range(20))]
    assert await queue.try_dequeue() is None


async def test_enqueue_all_is_one_revision_or_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "q"
    queue = DistributedQueue(etcd_client, path)
    await queue.enqueue_all([b"a", b"b", b"c"])
    kvs = (await etcd_client.get_prefix(path + "/")).kvs
    assert len(kvs) == 3
    assert len({kv.mod_revision for kv in kvs}) == 1  # all visible at the same revision
    # A batch the server rejects -- too many operations, or too large -- writes nothing.
    with pytest.raises(TooManyOperationsError):
        await queue.enqueue_all([b"x"] * 200)
    with pytest.raises(ValueTooLargeError):
        await queue.enqueue_all([b"y", b"z" * (2 * 1024 * 1024), b"w"])
    assert len(await keys(etcd_client, path + "/")) == 3
    await queue.enqueue_all([])  # a no-op
    assert await queue.size() == 3


async def test_raw_key_layout(etcd_client, etcd_prefix):
    path = etcd_prefix + "layout/"  # a trailing slash is normalised away
    queue = DistributedQueue(etcd_client, path)
    before = time.time_ns() // 1_000_000
    await queue.enqueue(b"one")
    await queue.enqueue_all([b"two", b"three"])
    after = time.time_ns() // 1_000_000
    kvs = (await etcd_client.get_prefix(etcd_prefix)).kvs
    base = re.escape(etcd_prefix + "layout/")
    single = re.compile(base + r"(\d{19})-[A-Za-z0-9]{3}$")
    batched = re.compile(base + r"(\d{19})-(\d{5})-[A-Za-z0-9]{3}$")
    by_value = {kv.value: kv.key_text for kv in kvs}
    assert set(by_value) == {b"one", b"two", b"three"}  # raw bytes, no framing
    m = single.match(by_value[b"one"])
    assert m and before <= int(m.group(1)) <= after
    m2, m3 = batched.match(by_value[b"two"]), batched.match(by_value[b"three"])
    assert m2 and m3
    assert (m2.group(2), m3.group(2)) == ("00000", "00001")
    assert m2.group(1) == m3.group(1)  # one shared timestamp
    assert all(kv.lease == 0 for kv in kvs)


async def test_sibling_paths_do_not_mix(etcd_client, etcd_prefix):
    """Prefix reads and watches use a trailing '/': "/q" never takes "/q2"'s items (the
    reference's queue watch lacked the slash)."""
    q = DistributedQueue(etcd_client, etcd_prefix + "q")
    q2 = DistributedQueue(etcd_client, etcd_prefix + "q2")
    waiter = asyncio.create_task(q.poll(0.6))
    await asyncio.sleep(0.2)
    await q2.enqueue(b"for-q2")
    assert await waiter is None
    assert await q.size() == 0
    assert await q2.try_dequeue() == b"for-q2"


async def test_parked_consumer_is_anchored_at_the_read(etcd_client, etcd_prefix):
    """An item enqueued between the empty read and the watch going live is not missed: the
    wait is anchored at the read's revision + 1."""
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    producer = DistributedQueue(etcd_client, etcd_prefix + "q")
    real_read = queue._read_head
    injected = []

    async def read_then_enqueue(limit):
        result = await real_read(limit)
        if not result.kvs and not injected:
            injected.append(await producer.enqueue(b"sneaky"))  # lands before the watch
        return result

    queue._read_head = read_then_enqueue
    assert await asyncio.wait_for(queue.dequeue(), 5) == b"sneaky"
    assert injected


async def test_many_waiters_each_get_one(etcd_client, etcd_prefix):
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    waiters = [
        asyncio.create_task(DistributedQueue(etcd_client, queue.path).dequeue()) for _ in range(6)
    ]
    await asyncio.sleep(0.3)
    for i in range(6):
        await queue.enqueue(b"%d" % i)
    got = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert sorted(got) == [b"%d" % i for i in range(6)]
    assert await queue.size() == 0


async def test_codecs(etcd_client, etcd_prefix):
    raw = DistributedQueue(etcd_client, etcd_prefix + "raw")
    await raw.enqueue("é")  # str without a codec: UTF-8
    await raw.enqueue(bytearray(b"ba"))
    assert await raw.dequeue() == "é".encode()
    assert await raw.dequeue() == b"ba"
    with pytest.raises(InvalidArgumentError):
        await raw.enqueue(5)  # type: ignore[arg-type]

    text = DistributedQueue(etcd_client, etcd_prefix + "text", codec=UTF8)
    await text.enqueue("héllo")
    assert await text.dequeue() == "héllo"

    jobs = DistributedQueue(etcd_client, etcd_prefix + "json", codec=JSON)
    await jobs.enqueue_all([{"id": 1}, {"id": 2}])
    assert [await jobs.dequeue(), await jobs.try_dequeue()] == [{"id": 1}, {"id": 2}]
    assert (await etcd_client.get_prefix(etcd_prefix + "json/")).kvs == []

    ints = DistributedQueue(etcd_client, etcd_prefix + "ints", codec=INT32)
    await ints.enqueue(-7)
    kv = (await etcd_client.get_prefix(etcd_prefix + "ints/")).kvs[0]
    assert kv.value == b"\xff\xff\xff\xf9"  # 4-byte big-endian, the JVM layout
    assert await ints.dequeue() == -7


async def test_bad_input_writes_nothing(etcd_client, etcd_prefix):
    with pytest.raises(EmptyPathError):
        DistributedQueue(etcd_client, "")
    with pytest.raises(EmptyPathError):
        DistributedQueue(etcd_client, "/")
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    for bad in (-1, True, "1", float("nan")):  # 0 is "try once" (test_try_once.py)
        with pytest.raises(InvalidArgumentError):
            await queue.poll(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await queue.enqueue_all(b"abc")  # a single value, not an iterable of values
    with pytest.raises(ValueTooLargeError):
        await queue.enqueue(b"v" * (2 * 1024 * 1024))
    assert await keys(etcd_client, etcd_prefix) == []
    await queue.aclose()
    with pytest.raises(RecipeClosedError):
        await queue.enqueue(b"late")
    with pytest.raises(RecipeClosedError):
        await queue.try_dequeue()


async def test_dequeue_latency_metric(etcd_server, etcd_prefix):
    recorded: list[tuple[str, float]] = []

    class Recorder(EtcdMetrics):
        def record_latency(self, name: str, seconds: float) -> None:
            recorded.append((name, seconds))

    config = ResilienceConfig(metrics=Recorder())
    async with connect(**etcd_server.client_kwargs(), resilience=config) as client:
        queue = DistributedQueue(client, etcd_prefix + "q")
        waiter = asyncio.create_task(queue.dequeue())
        await asyncio.sleep(0.3)
        await queue.enqueue(b"x")
        await waiter
        await queue.enqueue(b"y")
        assert await queue.poll(1) == b"y"
        await queue.enqueue(b"z")
        assert await queue.try_dequeue() == b"z"  # not a waiting call: not measured
    names = [name for name, _ in recorded]
    assert names == ["queue.dequeue", "queue.dequeue"]
    assert recorded[0][1] >= 0.25  # call -> item in hand, waiting included


@pytest.mark.parametrize("kind", ["fifo", "priority"])
async def test_closing_ends_a_parked_dequeue(etcd_client, etcd_prefix, kind):
    from etcd_recipes import DistributedPriorityQueue

    cls = DistributedQueue if kind == "fifo" else DistributedPriorityQueue
    queue = cls(etcd_client, etcd_prefix + "q")
    parked = asyncio.create_task(queue.dequeue())
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await queue.aclose()
    with pytest.raises(RecipeClosedError):
        await asyncio.wait_for(parked, 5)
    assert time.monotonic() - started < 1
    await DistributedQueue(etcd_client, etcd_prefix + "q").enqueue(b"x")
    await asyncio.sleep(0.2)
    assert len(await keys(etcd_client, etcd_prefix)) == 1  # the closed queue took nothing
