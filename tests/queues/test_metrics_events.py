"""The queues' metrics SPI v2 events against a real etcd: one ``queue_operation`` per call with
the right outcome, redeliveries, consumer-lease loss, spans with messaging attributes, and
the v1 latencies kept."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    RecipeClosedError,
    ValueTooLargeError,
    WorkQueueConfig,
)
from tests.helpers import eventually
from tests.queues.helpers import keys

FAST = WorkQueueConfig(visibility_timeout=1, max_deliveries=5, sweep_interval=0.3)
# No sweeper pass within a test: only a receive that notices an orphan returns it.
UNSWEPT = WorkQueueConfig(visibility_timeout=1, max_deliveries=5, sweep_interval=60)
FIFO = "DistributedQueue"
WORK = "DistributedWorkQueue"


async def test_enqueue_then_dequeue(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "q"
    async with DistributedQueue(client, path, metrics_name="orders") as queue:
        await queue.enqueue(b"a")
        await queue.enqueue_all([b"b", b"c"])
        assert await queue.dequeue() == b"a"
        assert await queue.try_dequeue() == b"b"
        assert await queue.poll(5) == b"c"
    assert sink.flush() == [
        ("queue_operation", FIFO, "orders", "enqueue", "ok"),
        ("queue_operation", FIFO, "orders", "enqueue", "ok"),
        ("record_latency", "queue.dequeue"),  # v1: a take that waited (reported first)
        ("queue_operation", FIFO, "orders", "dequeue", "ok"),
        ("queue_operation", FIFO, "orders", "dequeue", "ok"),  # the try: no v1 latency
        ("record_latency", "queue.dequeue"),
        ("queue_operation", FIFO, "orders", "dequeue", "ok"),
    ]


async def test_empty_timeout_and_cancelled_takes(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "q"
    async with DistributedQueue(client, path) as queue:
        assert await queue.try_dequeue() is None
        assert await queue.poll(0) is None  # a wait of 0 is a try
        assert await queue.poll(0.2) is None
        waiter = asyncio.create_task(queue.dequeue())
        await asyncio.sleep(0.3)  # parked on the empty queue
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await keys(client, path + "/") == []  # the cancelled take left nothing behind
        await queue.enqueue(b"after")
        assert await keys(client, path + "/") != []
        assert await queue.try_dequeue() == b"after"  # and consumed nothing
    assert sink.ops() == [
        ("dequeue", "empty"),
        ("dequeue", "empty"),
        ("dequeue", "timeout"),
        ("dequeue", "cancelled"),
        ("enqueue", "ok"),
        ("dequeue", "ok"),
    ]
    assert sink.of("record_latency") == []  # v1 reports only takes that waited and got one


async def test_closing_under_a_waiting_take_reports_cancelled(metered, etcd_prefix):
    client, sink = metered
    queue = DistributedQueue(client, etcd_prefix + "q")
    waiter = asyncio.create_task(queue.dequeue())
    await asyncio.sleep(0.3)
    await queue.aclose()
    with pytest.raises(RecipeClosedError):
        await waiter
    assert sink.ops() == [("dequeue", "cancelled")]


async def test_priority_queue(metered, etcd_prefix):
    client, sink = metered
    recipe = "DistributedPriorityQueue"
    async with DistributedPriorityQueue(client, etcd_prefix + "pq", metrics_name="jobs") as queue:
        await queue.enqueue(b"later", 9)
        await queue.enqueue(b"first", 1)
        assert await queue.dequeue() == b"first"
        assert await queue.poll(0.2) == b"later"
        assert await queue.poll(0.2) is None
    assert sink.flush() == [
        ("queue_operation", recipe, "jobs", "enqueue", "ok"),
        ("queue_operation", recipe, "jobs", "enqueue", "ok"),
        ("record_latency", "priority_queue.dequeue"),
        ("queue_operation", recipe, "jobs", "dequeue", "ok"),
        ("record_latency", "priority_queue.dequeue"),
        ("queue_operation", recipe, "jobs", "dequeue", "ok"),
        ("queue_operation", recipe, "jobs", "dequeue", "timeout"),
    ]
    priorities = [s[4].get("etcd_recipes.queue.priority") for s in sink.spans]
    assert priorities == [9, 1, None, None, None]


async def test_work_queue_receive_ack_requeue_and_stale(metered, etcd_prefix):
    client, sink = metered
    async with DistributedWorkQueue(client, etcd_prefix + "wq", FAST, metrics_name="mail") as q:
        await q.enqueue(b"job")
        item = await q.receive(timeout=5)
        assert item is not None
        assert await q.try_receive() is None
        assert await q.receive(timeout=0.2) is None
        assert await item.requeue() is True
        again = await q.receive()
        assert again.attempt == 2
        assert await again.ack() is True
        assert await again.ack() is False  # already settled
    assert sink.flush() == [
        ("queue_operation", WORK, "mail", "enqueue", "ok"),
        ("record_latency", "work_queue.receive"),
        ("queue_operation", WORK, "mail", "receive", "ok"),
        ("queue_operation", WORK, "mail", "receive", "empty"),
        ("queue_operation", WORK, "mail", "receive", "timeout"),
        ("queue_operation", WORK, "mail", "requeue", "ok"),
        ("record_latency", "work_queue.receive"),
        ("queue_operation", WORK, "mail", "receive", "ok"),
        ("queue_operation", WORK, "mail", "ack", "ok"),
        ("queue_operation", WORK, "mail", "ack", "stale"),
    ]


async def test_dead_letter_call(metered, etcd_prefix):
    client, sink = metered
    async with DistributedWorkQueue(client, etcd_prefix + "wq", FAST) as queue:
        await queue.enqueue(b"poison")
        item = await queue.receive()
        assert await item.dead_letter("cannot parse") is True
        assert [d.reason for d in await queue.dead_letters()] == ["cannot parse"]
    assert sink.ops() == [("enqueue", "ok"), ("receive", "ok"), ("dead_letter", "ok")]


async def test_a_lost_claim_is_redelivered_and_its_ack_is_stale(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "wq"
    async with (
        DistributedWorkQueue(client, path, UNSWEPT, metrics_name="a") as first,
        DistributedWorkQueue(client, path, UNSWEPT, metrics_name="b") as second,
    ):
        await first.enqueue(b"job")
        item = await first.receive()
        await client.lease_revoke(first.lease_id)  # the consumer's claim lease is lost
        await eventually(lambda: sink.of("lease_lost") != [], what="lease_lost")
        again = await second.receive(timeout=10)  # notices the orphan and returns it
        assert again is not None and (again.id, again.attempt) == (item.id, 2)
        assert await item.ack() is False  # the claim was gone: the work may run twice
        assert await again.ack() is True
    assert sink.of("lease_lost") == [(WORK, "a", "expired")]
    assert sink.of("queue_redelivered") == [(WORK, "b", 1)]
    by_name = [(c[1], c[2], c[3]) for c in sink.of("queue_operation")]
    assert by_name == [
        ("a", "enqueue", "ok"),
        ("a", "receive", "ok"),
        ("b", "receive", "ok"),
        ("a", "ack", "stale"),
        ("b", "ack", "ok"),
    ]


async def test_an_orphan_on_its_last_delivery_is_dead_lettered(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "wq"
    once = WorkQueueConfig(visibility_timeout=1, max_deliveries=1, sweep_interval=60)
    async with (
        DistributedWorkQueue(client, path, once, metrics_name="a") as first,
        DistributedWorkQueue(client, path, once, metrics_name="b") as second,
    ):
        await first.enqueue(b"job")
        item = await first.receive()
        await client.lease_revoke(first.lease_id)
        await eventually(lambda: sink.of("lease_lost") != [], what="lease_lost")
        assert await second.try_receive() is None  # the orphan went to the dead letters
        (dead,) = await second.dead_letters()
        assert dead.id == item.id and dead.reason.startswith("max_deliveries")
    assert [(c[1], c[2], c[3]) for c in sink.of("queue_operation")] == [
        ("a", "enqueue", "ok"),
        ("a", "receive", "ok"),
        ("b", "dead_letter", "ok"),  # by b's sweep: orphaned on its last allowed delivery
        ("b", "receive", "empty"),
    ]
    assert sink.of("queue_redelivered") == []


async def test_spans_carry_messaging_attributes(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(client, path, FAST, metrics_name="mail") as queue:
        await queue.enqueue_all([b"a", b"b"])
        item = await queue.receive()
        await item.ack()
        assert await queue.try_receive() is not None
        with pytest.raises(asyncio.CancelledError):
            task = asyncio.create_task(queue.receive())
            await asyncio.sleep(0.3)
            task.cancel()
            await task
    names = [(s[0], s[1], s[2], s[3]) for s in sink.spans]
    assert names == [
        (WORK, "mail", "queue.enqueue", path),
        (WORK, "mail", "queue.receive", path),
        (WORK, "mail", "queue.settle", path),
        (WORK, "mail", "queue.receive", path),
        (WORK, "mail", "queue.receive", path),
    ]
    attributes = [s[4] for s in sink.spans]
    assert attributes[0] == {
        "messaging.system": "etcd",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": path,
        "messaging.batch.message_count": 2,
    }
    assert [a["messaging.operation.type"] for a in attributes] == [
        "send",
        "receive",
        "settle",
        "receive",
        "receive",
    ]
    assert attributes[2]["messaging.operation.name"] == "ack"
    ended = [(i, outcome) for i, outcome, _ in sink.ended]
    assert ended == [(0, "ok"), (1, "ok"), (2, "ok"), (3, "ok"), (4, "cancelled")]
    assert isinstance(sink.ended[4][2], asyncio.CancelledError)
    # The path is a span attribute only: no event carries it.
    assert all(path not in map(str, call) for call in sink.flush())


async def test_a_failing_enqueue_reports_error(metered, etcd_prefix):
    client, sink = metered
    async with DistributedQueue(client, etcd_prefix + "q") as queue:
        with pytest.raises(ValueTooLargeError):
            await queue.enqueue(b"v" * (2 * 1024 * 1024))  # over the server's request limit
    assert sink.ops() == [("enqueue", "error")]
    (ended,) = sink.ended
    assert ended[1] == "error" and ended[2] is not None


async def test_the_sweeper_reports_what_it_redelivered(metered, etcd_prefix):
    client, sink = metered
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(client, path, FAST, metrics_name="a") as queue:
        await queue.enqueue_all([b"x", b"y"])
        held = [await queue.receive(), await queue.receive()]
        await client.lease_revoke(queue.lease_id)  # both claims are lost at once
        await eventually(lambda: sink.of("queue_redelivered") != [], timeout=10, what="a sweep")
        ready = await keys(client, f"{path}/items/")
        assert sorted(ready) == sorted(f"{path}/items/{item.id}" for item in held)
        # The sweep can beat the keep-alive to it: the loss is reported at its next renewal.
        await eventually(lambda: sink.of("lease_lost") != [], timeout=10, what="the loss")
    assert sink.of("lease_lost") == [(WORK, "a", "expired")]
    assert sink.of("queue_redelivered") == [(WORK, "a", 2)]  # one event per sweep
