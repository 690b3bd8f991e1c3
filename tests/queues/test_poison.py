"""Poison items in the work queue: a live worker dead-letters an item with a reason, or requeues
it with a delay (a retry backoff keeping its id and attempt count); the reason sits beside the
dead letter (``<p>/reasons/<id>``, the payload bytes untouched) and ``dead_letters()`` shows it;
``async for`` consumes forever and a cancelled loop consumes nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcd_recipes import (
    DeadLetter,
    DistributedQueue,
    DistributedWorkQueue,
    InvalidArgumentError,
    TooManyOperationsError,
    WorkQueueConfig,
)
from etcd_recipes import sync as blocking
from tests.queues.helpers import keys

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.2)


async def test_a_worker_dead_letters_an_item_with_its_reason(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        poison = await queue.enqueue(b"not-an-image")
        good = await queue.enqueue(b"image")
        item = await queue.receive()
        assert item.id == poison
        assert await item.dead_letter("unsupported format") is True
        assert await item.dead_letter("again") is False  # settled once
        # The payload bytes are stored as the JVM library stores them; the reason beside them.
        assert (await etcd_client.get(f"{path}/dlq/{poison}")).value == b"not-an-image"
        assert (await etcd_client.get(f"{path}/reasons/{poison}")).value == b"unsupported format"
        assert await keys(etcd_client, f"{path}/claims/") == []
        assert await queue.dead_letters() == [
            DeadLetter(poison, b"not-an-image", 1, "unsupported format")
        ]
        nxt = await queue.receive(timeout=5)  # the queue moved on
        assert nxt.id == good
        await nxt.ack()
        # Requeue and purge delete the reason with the dead letter.
        assert await queue.requeue_dead_letter(poison) is True
        assert await keys(etcd_client, f"{path}/reasons/") == []
        again = await queue.receive(timeout=5)
        assert (again.id, again.attempt) == (poison, 1)
        assert await again.dead_letter("still broken")
        assert await queue.purge_dead_letter(poison) is True
        assert await keys(etcd_client, path + "/") == []
        with pytest.raises(InvalidArgumentError):
            await again.dead_letter(42)  # type: ignore[arg-type]


async def test_a_stale_reason_is_not_shown_for_a_later_dead_letter(etcd_client, etcd_prefix):
    # A client that knows nothing of reasons/ (the JVM library) purged a dead letter and left
    # its reason behind; a later dead letter of the same id was written without one.
    path = etcd_prefix + "wq"
    await etcd_client.put(f"{path}/reasons/0001-abc", b"old reason")
    await etcd_client.put(f"{path}/dlq/0001-abc", b"payload")
    async with DistributedWorkQueue(etcd_client, path) as queue:
        (dead,) = await queue.dead_letters()
        assert (dead.id, dead.reason, dead.value) == ("0001-abc", None, b"payload")


async def test_requeue_with_a_delay_keeps_id_and_attempts_and_hides_it(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        first = await queue.enqueue(b"flaky")
        item = await queue.receive()
        started = time.monotonic()
        assert await item.requeue(delay=1.0) is True
        assert await queue.try_receive() is None  # out of sight while it waits
        (delayed,) = await keys(etcd_client, f"{path}/delayed/")
        assert delayed.endswith("-" + first)
        again = await queue.receive(timeout=10)
        waited = time.monotonic() - started
        assert (again.id, again.attempt, again.value) == (first, 2, b"flaky")
        assert 0.9 <= waited < 5, waited
        assert await again.ack()
        assert await keys(etcd_client, path + "/") == []
        with pytest.raises(InvalidArgumentError):
            await again.requeue(delay=float("nan"))


async def test_async_for_consumes_forever_and_a_cancelled_loop_consumes_nothing(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "wq"
    queue = DistributedWorkQueue(etcd_client, path, CONFIG)
    await queue.enqueue_all([b"a", b"b"])
    seen = []
    async for item in queue:
        seen.append(item.value)
        await item.ack()
        if len(seen) == 2:
            break
    assert seen == [b"a", b"b"]

    async def consume() -> None:
        async for item in queue:  # parks: the queue is empty
            raise AssertionError(f"got {item!r}")

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await queue.enqueue(b"c")
    assert await keys(etcd_client, f"{path}/claims/") == []  # nothing was claimed
    assert await queue.size() == 1
    assert await (await queue.receive()).ack()
    # Closing ends a parked loop.
    ended = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    await queue.aclose()
    await asyncio.wait_for(ended, 5)


def test_blocking_for_loop(etcd_server, etcd_prefix):
    path = etcd_prefix + "wq"
    with blocking.connect(**etcd_server.client_kwargs()) as client:
        with blocking.DistributedWorkQueue(client, path, CONFIG) as queue:
            queue.enqueue_all([b"x", b"y"])
            got = []
            for item in queue:
                got.append(item.value)
                item.dead_letter("checked") if item.value == b"y" else item.ack()
                if len(got) == 2:
                    break
            assert got == [b"x", b"y"]
            assert [d.reason for d in queue.dead_letters()] == ["checked"]


@pytest.mark.parametrize("kind", ["fifo", "work"])
async def test_a_batch_beyond_the_servers_limit_says_how_to_fix_it(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "q"
    queue = (
        DistributedQueue(etcd_client, path)
        if kind == "fifo"
        else DistributedWorkQueue(etcd_client, path)
    )
    with pytest.raises(TooManyOperationsError) as caught:
        await queue.enqueue_all([b"x"] * 200)
    # The limit is the server's (etcd's default --max-txn-ops is 128), found out, not assumed.
    assert "an atomic batch is limited to 128 values by the server; split it" in str(caught.value)
    assert await keys(etcd_client, path + "/") == []
    await queue.enqueue_all([b"x"] * 128)  # exactly the limit is fine
    await queue.aclose()
