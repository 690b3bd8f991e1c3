"""Cancelling dequeue(), poll() and receive() -- by task cancel, anyio.fail_after,
asyncio.timeout, and Ctrl-C in the sync facade -- consumes nothing and leaves no claim, lease
or watch behind. Checked by reading etcd afterwards, including for a take or claim whose
transaction had already committed when the cancellation arrived."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time

import anyio
import pytest

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    WorkQueueConfig,
)
from etcd_recipes._core.txn import PutOp, TxnOp
from etcd_recipes.queues._claims import Claimer
from tests.helpers import eventually
from tests.queues.helpers import keys, server_leases, spawn

CONFIG = WorkQueueConfig(visibility_timeout=5, sweep_interval=0.5)


def _waiting_call(client, path: str, op: str):
    if op == "dequeue":
        return DistributedQueue(client, path).dequeue()
    if op == "poll":
        return DistributedQueue(client, path).poll(60)
    if op == "priority-dequeue":
        return DistributedPriorityQueue(client, path).dequeue()
    if op == "receive":
        return DistributedWorkQueue(client, path, CONFIG).receive()
    assert op == "receive-timeout"
    return DistributedWorkQueue(client, path, CONFIG).receive(timeout=60)


async def _cancel(call, how: str) -> None:
    if how == "task-cancel":
        task = asyncio.create_task(call)
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif how == "anyio-fail-after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.3):
                await call
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await call


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
@pytest.mark.parametrize(
    "op", ["dequeue", "poll", "priority-dequeue", "receive", "receive-timeout"]
)
async def test_cancelled_wait_consumes_nothing(etcd_client, etcd_prefix, op, how):
    path = etcd_prefix + "q"
    leases_before = await server_leases(etcd_client)
    await _cancel(_waiting_call(etcd_client, path, op), how)
    # Nothing was written, no lease granted, and the wait's watch is gone.
    assert await keys(etcd_client, etcd_prefix) == []
    assert await server_leases(etcd_client) <= leases_before
    await eventually(lambda: etcd_client._watch_hub.watcher_count == 0, what="watch cleanup")
    # No ghost consumer: an item enqueued now stays until someone takes it.
    if op.startswith("receive"):
        await DistributedWorkQueue(etcd_client, path).enqueue(b"item")
        await asyncio.sleep(0.3)
        assert len(await keys(etcd_client, path + "/items/")) == 1
    else:
        producer = DistributedQueue(etcd_client, path)
        await producer.enqueue(b"item")
        await asyncio.sleep(0.3)
        assert await producer.size() == 1


async def test_cancelled_wait_of_a_working_consumer_keeps_its_items(etcd_client, etcd_prefix):
    """A consumer that holds a claim and parks again: cancelling the wait touches neither the
    claim nor the lease it belongs to; closing then returns the claim and revokes the lease."""
    path = etcd_prefix + "wq"
    leases_before = await server_leases(etcd_client)
    queue = DistributedWorkQueue(etcd_client, path, CONFIG)
    await queue.enqueue(b"held")
    held = await queue.receive()
    lease = queue.lease_id
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.3):
            await queue.receive()
    assert queue.lease_id == lease
    assert (await etcd_client.get(f"{path}/claims/{held.id}")).lease == lease
    await queue.aclose()
    assert await keys(etcd_client, path + "/") == [
        f"{path}/attempts/{held.id}",
        f"{path}/items/{held.id}",  # returned at once, under its key
    ]
    assert await server_leases(etcd_client) <= leases_before


def _slow_commits(client, match) -> list[int]:
    """Make the matching transactions slow *after* they committed: a cancellation then arrives
    while the caller still waits for the outcome. Returns the list of slowed commits."""
    real = client.txn
    slowed: list[int] = []

    async def txn(compare, success=(), failure=(), **kwargs):
        result = await real(compare, success, failure, **kwargs)
        if match(compare, success):
            slowed.append(result.revision)
            await asyncio.sleep(0.6)
        return result

    client.txn = txn
    return slowed


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after"])
@pytest.mark.parametrize("kind", ["fifo", "priority"])
async def test_take_cancelled_after_its_delete_committed_puts_the_item_back(
    etcd_client, etcd_prefix, kind, how
):
    path = etcd_prefix + "q"
    if kind == "fifo":
        queue = DistributedQueue(etcd_client, path)
        await queue.enqueue(b"precious")
    else:
        queue = DistributedPriorityQueue(etcd_client, path)
        await queue.enqueue(b"precious", 3)
    key = (await keys(etcd_client, path + "/"))[0]
    slowed = _slow_commits(etcd_client, lambda compare, success: bool(compare))
    try:
        await _cancel(queue.dequeue(), how)
    finally:
        del etcd_client.txn
    assert slowed  # the delete had committed ...
    assert await keys(etcd_client, path + "/") == [key]  # ... and was undone, same key
    assert await queue.try_dequeue() == b"precious"
    await etcd_client.delete("__" + etcd_prefix, prefix=True)


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after"])
async def test_claim_cancelled_after_it_committed_is_undone(etcd_client, etcd_prefix, how):
    """The claim transaction lands, then the receive is cancelled: the payload is back under its
    key, the attempt count is as before, no marker is left, and the consumer lease that this
    receive took is revoked again."""
    path = etcd_prefix + "wq"
    producer = DistributedWorkQueue(etcd_client, path, CONFIG)
    item_id = await producer.enqueue(b"precious")
    leases_before = await server_leases(etcd_client)
    consumer = DistributedWorkQueue(etcd_client, path, CONFIG)
    slowed = _slow_commits(etcd_client, lambda compare, success: _claims(success))
    try:
        await _cancel(consumer.receive(), how)
    finally:
        del etcd_client.txn
    assert slowed  # the claim had committed ...
    assert await keys(etcd_client, path + "/") == [f"{path}/items/{item_id}"]  # ... undone
    assert consumer.lease_id == 0
    assert await server_leases(etcd_client) <= leases_before
    item = await consumer.receive(timeout=2)
    assert item is not None
    assert (item.id, item.attempt) == (item_id, 1)  # the cancelled claim did not count
    assert await item.ack()
    await consumer.aclose()


def _claims(ops) -> bool:
    """Whether a transaction branch writes a claim marker (a put on a lease), nested or not."""
    return any(
        (isinstance(op, PutOp) and op.lease != 0)
        or (isinstance(op, TxnOp) and (_claims(op.success) or _claims(op.failure)))
        for op in ops
    )


_SIGINT = textwrap.dedent(
    """
    import sys
    from etcd_recipes.sync import (
        DistributedPriorityQueue, DistributedQueue, DistributedWorkQueue, connect
    )
    from etcd_recipes import WorkQueueConfig

    url, path, op = sys.argv[1:4]
    try:
        with connect(url) as client:
            if op == "receive":
                config = WorkQueueConfig(visibility_timeout=30)
                with DistributedWorkQueue(client, path, config) as queue:
                    queue.enqueue(b"warm-up")
                    assert queue.receive().ack()  # this consumer now holds a lease
                    print("ready", queue.lease_id, flush=True)
                    queue.receive()
            elif op == "priority-dequeue":
                print("ready 0", flush=True)
                DistributedPriorityQueue(client, path).dequeue()
            else:
                queue = DistributedQueue(client, path)
                print("ready 0", flush=True)
                queue.poll(60) if op == "poll" else queue.dequeue()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("op", ["dequeue", "poll", "priority-dequeue", "receive"])
async def test_ctrl_c_in_the_sync_facade_consumes_nothing(
    etcd_server, etcd_client, etcd_prefix, op
):
    path = etcd_prefix + "q"
    leases_before = await server_leases(etcd_client)
    proc = spawn(_SIGINT, etcd_server.url, path, op)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert line.startswith("ready"), line
        lease = int(line.split()[1])
        await asyncio.sleep(0.4)  # blocked in the facade call
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out.strip() == "interrupted"
    assert err == ""  # no traceback, no warning
    assert time.monotonic() - sent < 15
    # Read etcd afterwards: nothing consumed or claimed, the process's lease revoked.
    assert await keys(etcd_client, path + "/") == []
    leases_after = await server_leases(etcd_client)
    assert lease not in leases_after
    assert leases_after <= leases_before
    producer = DistributedQueue(etcd_client, path)
    await producer.enqueue(b"item")
    await asyncio.sleep(0.3)
    assert await producer.size() == 1  # nobody is left taking items


async def test_receive_that_lost_the_race_and_parked_gives_its_new_lease_back(
    etcd_client, etcd_prefix, monkeypatch
):
    """A receive takes the consumer lease for a claim, loses the item to another consumer,
    parks, and is cancelled: the lease it took is revoked again (nothing of it is left)."""
    path = etcd_prefix + "wq"
    leases_before = await server_leases(etcd_client)
    rival = DistributedWorkQueue(etcd_client, path, CONFIG)
    loser = DistributedWorkQueue(etcd_client, path, CONFIG)
    await rival.enqueue(b"contested")
    real_claim = Claimer.claim
    taken = []

    async def rival_first(self, window, lease_id):
        if self is loser._claimer and not taken:
            taken.append(await rival.receive())  # wins the item in between
        return await real_claim(self, window, lease_id)

    monkeypatch.setattr(Claimer, "claim", rival_first)  # a Claimer has slots: patch the class
    task = asyncio.create_task(loser.receive())
    await eventually(lambda: loser.lease_id != 0 and taken, what="the lost race")
    await asyncio.sleep(0.3)  # parked now
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loser.lease_id == 0
    assert await server_leases(etcd_client) - leases_before == {rival.lease_id}
    assert await taken[0].ack()
    await rival.aclose()
    await loser.aclose()
    assert await server_leases(etcd_client) <= leases_before
