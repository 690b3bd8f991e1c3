"""Values that do not decode through a queue's codec are never lost: a typed FIFO or priority
take decodes before it commits (the item stays in place, the error names its key), and a typed
work queue dead-letters them at once with reason ``"undecodable"``, listed with their raw bytes
and the decode error."""

from __future__ import annotations

import pytest

from etcd_recipes import (
    JSON,
    CodecError,
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
)
from tests.queues.helpers import keys


@pytest.mark.parametrize("kind", ["fifo", "priority"])
async def test_a_typed_take_leaves_an_undecodable_head_in_place(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "q"
    if kind == "fifo":
        raw, typed = (
            DistributedQueue(etcd_client, path),
            DistributedQueue(etcd_client, path, codec=JSON),
        )
        await raw.enqueue(b"{not json")
        await typed.enqueue({"n": 1})
    else:
        raw = DistributedPriorityQueue(etcd_client, path)
        typed = DistributedPriorityQueue(etcd_client, path, codec=JSON)
        await raw.enqueue(b"{not json", 1)
        await typed.enqueue({"n": 1}, 2)
    before = await keys(etcd_client, path + "/")
    for take in (typed.dequeue, typed.try_dequeue, lambda: typed.poll(1)):
        with pytest.raises(CodecError) as caught:
            await take()
        assert before[0] in str(caught.value) and "left in place" in str(caught.value)
        assert await keys(etcd_client, path + "/") == before  # nothing was taken
    # The raw bytes stay retrievable: a queue on the same path without a codec takes them.
    assert await raw.try_dequeue() == b"{not json"
    assert await typed.try_dequeue() == {"n": 1}


async def test_a_typed_fifo_chain_stops_before_an_undecodable_candidate(etcd_client, etcd_prefix):
    # Two good items, then a bad one, then a good one: the bad one is not taken by a chain
    # that passes over it; it comes up as the head and raises, taking nothing.
    path = etcd_prefix + "q"
    raw, typed = (
        DistributedQueue(etcd_client, path),
        DistributedQueue(etcd_client, path, codec=JSON),
    )
    await typed.enqueue_all([1, 2])
    await raw.enqueue(b"\xff")
    await typed.enqueue(3)
    assert [await typed.dequeue(), await typed.dequeue()] == [1, 2]
    with pytest.raises(CodecError):
        await typed.try_dequeue()
    assert await raw.try_dequeue() == b"\xff"
    assert await typed.try_dequeue() == 3


async def test_a_typed_work_queue_dead_letters_an_undecodable_item_at_once(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "wq"
    raw = DistributedWorkQueue(etcd_client, path)
    bad = await raw.enqueue(b"{not json")
    async with DistributedWorkQueue(etcd_client, path, codec=JSON) as typed:
        good = await typed.enqueue({"n": 1})
        item = await typed.receive(timeout=5)  # the bad head does not wedge the queue
        assert (item.id, item.value) == (good, {"n": 1})
        assert await item.ack()
        assert await keys(etcd_client, f"{path}/claimed/") == []  # nothing left in flight
        assert (await etcd_client.get(f"{path}/dlq/{bad}")).value == b"{not json"
        (dead,) = await typed.dead_letters()  # listed, not raised
        assert (dead.id, dead.reason, dead.raw, dead.attempts) == (
            bad,
            "undecodable",
            b"{not json",
            1,
        )
        assert isinstance(dead.error, CodecError)
        with pytest.raises(CodecError):
            dead.value  # noqa: B018
        assert "undecodable" in repr(dead)
        # An operator may fix the codec or read the bytes with a raw queue.
        (same,) = await raw.dead_letters()
        assert (same.value, same.error) == (b"{not json", None)
    await raw.aclose()
