"""DistributedWorkQueue.receive_many() / ack_many() against a real etcd: one transaction per
batch (counted on the wire), per-item partial acks, redeliveries inside a batch, waits,
cancellation (then etcd read), a consumer SIGKILLed mid-batch (nothing lost), the blocking
facade from threads, and bad input."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import threading

import pytest

from etcd_recipes import (
    JSON,
    DistributedWorkQueue,
    InvalidArgumentError,
    WorkQueueConfig,
)
from etcd_recipes import sync as blocking
from tests.queues.helpers import keys, spawn, transactions
from tests.queues.test_cancellation import _cancel, _claims, _slow_commits

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5)


async def test_a_batch_is_one_claim_and_one_ack_in_queue_order(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        ids = await queue.enqueue_all([b"job-%d" % i for i in range(40)])
        await queue.enqueue(b"warm-up")  # the first claim also takes the consumer lease
        with transactions(etcd_client) as seen:
            first = await queue.receive_many(16)
            acked = await queue.ack_many(first)
        assert [i.id for i in first] == ids[:16]
        assert [i.attempt for i in first] == [1] * 16
        assert acked == [True] * 16
        writes = [ok for _, ok in seen.writes]
        assert writes == [True, True]  # one claim transaction, one ack transaction
        rest = await queue.receive_many(100, timeout=0)
        assert [i.value for i in rest] == [b"job-%d" % i for i in range(16, 40)] + [b"warm-up"]
        assert await queue.ack_many(rest) == [True] * 25
        assert await queue.receive_many(8, timeout=0) == []
    assert await keys(etcd_client, path + "/") == []


async def test_partial_acks_say_which_item_was_late(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        await queue.enqueue_all([b"a", b"b", b"c", b"d"])
        a, b, c, d = await queue.receive_many(4)
        assert await b.requeue()  # settled already
        await etcd_client.delete(f"{path}/claims/{c.id}")  # its claim lost (an expired lease)
        assert await queue.ack_many([a, b, c, d, a]) == [True, False, False, True, False]
        assert not await a.ack()  # acked by the batch
        remaining = await keys(etcd_client, path + "/")
        # b back in the queue (attempt kept); c still in flight with no marker: an orphan
        assert f"{path}/items/{b.id}" in remaining
        assert f"{path}/claimed/{c.id}" in remaining
        assert not any(a.id in k or d.id in k for k in remaining)


async def test_a_redelivered_item_in_a_batch_keeps_its_count(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        await queue.enqueue_all([b"a", b"b", b"c"])
        a = await queue.receive()
        assert a is not None and await a.requeue()  # back at the head, attempt 1 kept
        batch = await queue.receive_many(3)
        assert sorted((i.value, i.attempt) for i in batch) == [(b"a", 2), (b"b", 1), (b"c", 1)]
        assert await queue.ack_many(batch) == [True, True, True]
    assert await keys(etcd_client, path + "/") == []


async def test_a_parked_batch_wakes_for_the_first_items(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        waiter = asyncio.create_task(queue.receive_many(8, timeout=10))
        await asyncio.sleep(0.3)
        assert not waiter.done()
        await DistributedWorkQueue(etcd_client, path).enqueue_all([b"x", b"y"])
        got = await asyncio.wait_for(waiter, 5)
        assert [i.value for i in got] == [b"x", b"y"]
        assert await queue.ack_many(got) == [True, True]
        assert await queue.receive_many(8, timeout=0.2) == []  # the time ran out


async def test_an_undecodable_payload_in_a_batch_is_dead_lettered_alone(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG, codec=JSON) as queue:
        await queue.enqueue({"n": 1})
        await etcd_client.put(f"{path}/items/0000000000000000001-bad", b"{not json")
        await queue.enqueue({"n": 2})
        got = await queue.receive_many(3)
        assert [i.value for i in got] == [{"n": 1}, {"n": 2}]
        (dead,) = await queue.dead_letters()
        assert dead.id == "0000000000000000001-bad" and dead.reason == "undecodable"
        assert await queue.ack_many(got) == [True, True]


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
async def test_a_cancelled_wait_consumes_nothing(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "wq"
    queue = DistributedWorkQueue(etcd_client, path, CONFIG)
    await _cancel(queue.receive_many(8), how)
    assert await keys(etcd_client, path + "/") == []
    assert queue.lease_id == 0  # the lease this call took is revoked again
    await DistributedWorkQueue(etcd_client, path).enqueue_all([b"a", b"b"])
    got = await queue.receive_many(8, timeout=2)
    assert [i.value for i in got] == [b"a", b"b"]
    assert await queue.ack_many(got) == [True, True]
    await queue.aclose()


async def test_a_batch_claim_cancelled_after_it_committed_is_undone(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    ids = await DistributedWorkQueue(etcd_client, path).enqueue_all([b"a", b"b", b"c"])
    consumer = DistributedWorkQueue(etcd_client, path, CONFIG)
    slowed = _slow_commits(etcd_client, lambda compare, success: _claims(success))
    try:
        await _cancel(consumer.receive_many(3), "task-cancel")
    finally:
        del etcd_client.txn
    assert slowed  # the batch had committed ...
    assert await keys(etcd_client, path + "/") == [f"{path}/items/{i}" for i in ids]  # undone
    got = await consumer.receive_many(3, timeout=2)
    assert [(i.id, i.attempt) for i in got] == [(i, 1) for i in ids]  # it did not count
    assert await consumer.ack_many(got) == [True] * 3
    await consumer.aclose()


def test_bad_input_is_refused_before_anything_is_written(etcd_server, etcd_prefix):
    async def main() -> None:
        from etcd_recipes import connect

        async with connect(**etcd_server.client_kwargs()) as client:
            path = etcd_prefix + "wq"
            async with (
                DistributedWorkQueue(client, path, CONFIG) as queue,
                DistributedWorkQueue(client, path + "-other", CONFIG) as other,
            ):
                for bad in (0, 101, -1, 1.5, "4", True):
                    with pytest.raises(InvalidArgumentError):
                        await queue.receive_many(bad)  # type: ignore[arg-type]
                with pytest.raises(InvalidArgumentError):
                    await queue.receive_many(4, timeout=-1)
                await other.enqueue(b"elsewhere")
                foreign = await other.receive_many(1)
                with pytest.raises(InvalidArgumentError):
                    await queue.ack_many(foreign)
                with pytest.raises(InvalidArgumentError):
                    await queue.ack_many([b"not an item"])  # type: ignore[list-item]
                assert queue.lease_id == 0
                assert await other.ack_many(foreign) == [True]  # the refusal settled nothing
                assert await queue.ack_many([]) == []

    asyncio.run(main())


def test_blocking_batches_from_threads_share_nothing(etcd_server, etcd_prefix):
    path = etcd_prefix + "wq"
    got: dict[int, list[bytes]] = {}
    with blocking.connect(**etcd_server.client_kwargs()) as client:
        with blocking.DistributedWorkQueue(client, path, CONFIG) as queue:
            queue.enqueue_all([b"job-%d" % i for i in range(60)])

            def consume(n: int) -> None:
                mine: list[bytes] = []
                while batch := queue.receive_many(7, timeout=0.5):
                    assert queue.ack_many(batch) == [True] * len(batch)
                    mine += [i.value for i in batch]
                got[n] = mine

            threads = [threading.Thread(target=consume, args=(n,)) for n in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        everything = [v for mine in got.values() for v in mine]
        assert sorted(everything) == sorted(b"job-%d" % i for i in range(60))  # each once
        assert client.get_prefix(path + "/").kvs == []


_BATCH_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from etcd_recipes import connect, DistributedWorkQueue, WorkQueueConfig

    async def main(endpoint, path):
        config = WorkQueueConfig(visibility_timeout=1, sweep_interval=0.3)
        async with connect(endpoint) as client:
            queue = DistributedWorkQueue(client, path, config)
            batch = await queue.receive_many(16)
            print(json.dumps([item.id for item in batch]), flush=True)
            await asyncio.sleep(3600)  # "processing" until SIGKILLed

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.slow
async def test_a_consumer_sigkilled_mid_batch_loses_nothing(etcd_client, etcd_server, etcd_prefix):
    """A consumer claims a batch of 16 and is SIGKILLed: every one of them is redelivered
    (attempt 2) to a live consumer, and the rest of the queue is delivered once."""
    path = etcd_prefix + "wq"
    ids = await DistributedWorkQueue(etcd_client, path).enqueue_all(
        [b"job-%d" % i for i in range(24)]
    )
    worker = spawn(_BATCH_WORKER, etcd_server.url, path)
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 20)
        claimed = json.loads(line)
        assert claimed == ids[:16]
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait(10)
    config = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.3)
    seen: dict[str, int] = {}
    async with DistributedWorkQueue(etcd_client, path, config) as survivor:
        while len(seen) < 24:
            batch = await survivor.receive_many(16, timeout=15)
            assert batch, f"nothing came; seen {sorted(seen)}"
            for item in batch:
                assert item.id not in seen  # delivered once to the live consumer
                seen[item.id] = item.attempt
            assert await survivor.ack_many(batch) == [True] * len(batch)
    assert sorted(seen) == sorted(ids)
    assert {seen[i] for i in ids[:16]} == {2} and {seen[i] for i in ids[16:]} == {1}
    assert await keys(etcd_client, path + "/") == []
