"""Work-item control (issue 34 item 7) against a real etcd: ``status(id)`` through an item's
life, ``cancel(id)`` of ready, delayed and requeued-with-delay items (and not of in-flight or
dead ones, never racing a claim), and the bounded queue (``max_items``): ``try_enqueue`` full,
``enqueue`` waiting for room, and the bound holding under concurrent producers -- proved by
replaying every write to ``items/`` and ``delayed/`` from etcd's history."""

from __future__ import annotations

import asyncio
import threading

import pytest

from etcd_recipes import (
    DistributedWorkQueue,
    InvalidArgumentError,
    WatchEvent,
    WorkQueueConfig,
)
from etcd_recipes import sync as blocking
from tests.queues.helpers import keys
from tests.queues.test_cancellation import _cancel

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5)


async def test_status_follows_an_item_through_its_life(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        item_id = await queue.enqueue(b"job")
        assert await queue.status(item_id) == "ready"
        item = await queue.receive()
        assert item is not None
        assert await queue.status(item_id) == "in_flight"
        assert await item.requeue(delay=60)  # under delayed/<ready>-<id>: found by its id
        assert await queue.status(item_id) == "delayed"
        later = await queue.enqueue(b"later", delay=60)
        assert await queue.status(later) == "delayed"
        assert await queue.cancel(later)
        poison = await queue.enqueue(b"poison")
        got = await queue.receive()
        assert got is not None and got.id == poison
        assert await got.dead_letter("bad")
        assert await queue.status(poison) == "dead"
        assert await queue.status("0000000000000000001-zzz") is None
        for bad in ("", "a/b", 5):
            with pytest.raises(InvalidArgumentError):
                await queue.status(bad)  # type: ignore[arg-type]


async def test_cancel_removes_waiting_items_and_nothing_else(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        ready = await queue.enqueue(b"ready")
        delayed = await queue.enqueue(b"delayed", delay=3600)
        assert await queue.cancel(ready) is True
        assert await queue.cancel(delayed) is True
        assert await queue.cancel(ready) is False  # gone already
        assert await keys(etcd_client, path + "/") == []
        # Requeued with a delay: its attempt count goes with it.
        item_id = await queue.enqueue(b"retry-later")
        item = await queue.receive()
        assert item is not None and await item.requeue(delay=3600)
        assert f"{path}/attempts/{item_id}" in await keys(etcd_client, path + "/")
        assert await queue.cancel(item_id) is True
        assert await keys(etcd_client, path + "/") == []
        # In flight and dead letters are not cancelled.
        busy = await queue.enqueue(b"busy")
        claimed = await queue.receive()
        assert claimed is not None and claimed.id == busy
        assert await queue.cancel(busy) is False
        assert await claimed.ack()  # the claim was untouched
        dead = await queue.enqueue(b"dead")
        got = await queue.receive()
        assert got is not None and await got.dead_letter("x")
        assert await queue.cancel(dead) is False
        assert [d.id for d in await queue.dead_letters()] == [dead]


async def test_cancel_never_races_a_claim(etcd_client, etcd_prefix):
    """Cancels and receives of the same items at once: each item is cancelled or received,
    never both, and none is left behind."""
    path = etcd_prefix + "wq"
    async with (
        DistributedWorkQueue(etcd_client, path, CONFIG) as producer,
        DistributedWorkQueue(etcd_client, path, CONFIG) as consumer,
    ):
        ids = await producer.enqueue_all([b"job-%d" % i for i in range(40)])
        received: list[str] = []

        async def consume() -> None:
            while item := await consumer.receive(timeout=0.5):
                received.append(item.id)
                assert await item.ack()

        cancelled = await asyncio.gather(*(producer.cancel(i) for i in ids), consume())
        gone = [i for i, ok in zip(ids, cancelled[:-1]) if ok]
        assert not set(gone) & set(received)
        assert sorted(gone + received) == sorted(ids)
    assert await keys(etcd_client, path + "/") == []


async def test_a_full_queue_refuses_try_enqueue_and_parks_enqueue(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5, max_items=3)
    async with DistributedWorkQueue(etcd_client, path, config) as queue:
        await queue.enqueue_all([b"a", b"b"])
        assert await queue.try_enqueue(b"c", delay=60) is not None  # delayed items count
        before = await keys(etcd_client, path + "/")
        assert await queue.try_enqueue(b"d") is None
        assert await keys(etcd_client, path + "/") == before  # nothing written
        with pytest.raises(InvalidArgumentError):
            await queue.enqueue_all([b"1", b"2", b"3", b"4"])  # can never fit
        waiting = asyncio.create_task(queue.enqueue(b"d"))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # full: the enqueue waits
        item = await queue.receive()  # a claim makes room
        assert item is not None
        assert await asyncio.wait_for(waiting, 5)
        assert await queue.size() == 2  # b and d wait; c is delayed
        await item.ack()


async def test_a_cancelled_wait_for_room_writes_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5, max_items=1)
    async with DistributedWorkQueue(etcd_client, path, config) as queue:
        await queue.enqueue(b"first")
        before = await keys(etcd_client, path + "/")
        await _cancel(queue.enqueue(b"second"), "task-cancel")
        assert await keys(etcd_client, path + "/") == before


async def test_the_bound_holds_under_concurrent_producers(etcd_client, etcd_prefix):
    """8 producers push 10 items each through a bound of 5 while a consumer drains: replaying
    every write to items/ and delayed/ from etcd's history, no revision ever saw more than 5
    items waiting (nothing is requeued here, so the bound is exact)."""
    path = etcd_prefix + "wq"
    limit = 5
    config = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5, max_items=limit)
    start = (await etcd_client.status()).revision
    producers = [DistributedWorkQueue(etcd_client, path, config) for _ in range(8)]
    consumer = DistributedWorkQueue(etcd_client, path, config)
    done: list[bytes] = []

    async def produce(n: int, queue: DistributedWorkQueue[bytes]) -> None:
        for i in range(10):
            await queue.enqueue(b"p%d-%d" % (n, i), delay=0.2 if i % 3 == 0 else None)

    async def consume() -> None:
        while len(done) < 80:
            item = await consumer.receive(timeout=10)
            assert item is not None, f"stalled after {len(done)}"
            await asyncio.sleep(0.005)
            done.append(item.value)
            assert await item.ack()

    try:
        await asyncio.gather(*(produce(n, q) for n, q in enumerate(producers)), consume())
    finally:
        for queue in [*producers, consumer]:
            await queue.aclose()
    assert sorted(done) == sorted(b"p%d-%d" % (n, i) for n in range(8) for i in range(10))
    end = (await etcd_client.status()).revision
    waiting: set[bytes] = set()
    most = 0
    parts = (f"{path}/items/".encode(), f"{path}/delayed/".encode())
    async with etcd_client.watch(path + "/", prefix=True, start_revision=start + 1) as watch:
        async for event in watch.items():
            assert isinstance(event, WatchEvent)
            if event.kv.key.startswith(parts):
                if event.type.name == "PUT":
                    waiting.add(event.kv.key)
                else:
                    waiting.discard(event.kv.key)
                most = max(most, len(waiting))
            if event.kv.mod_revision >= end:
                break
    assert 0 < most <= limit


def test_item_control_from_a_thread(etcd_server, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5, max_items=1)
    with blocking.connect(**etcd_server.client_kwargs()) as client:
        with blocking.DistributedWorkQueue(client, path, config) as queue:
            out: dict[str, object] = {}

            def worker() -> None:
                first = queue.try_enqueue(b"a")
                out["second"] = queue.try_enqueue(b"b")
                assert first is not None
                out["status"] = queue.status(first)
                out["cancel"] = queue.cancel(first)

            thread = threading.Thread(target=worker)
            thread.start()
            thread.join(30)
            assert out == {"second": None, "status": "ready", "cancel": True}
            assert client.get_prefix(path + "/").kvs[0].key_text == f"{path}/admission"


def test_max_items_is_checked_when_the_config_is_made():
    for bad in (0, -1, 1.5, "3", True):
        with pytest.raises(InvalidArgumentError):
            WorkQueueConfig(max_items=bad)  # type: ignore[arg-type]
