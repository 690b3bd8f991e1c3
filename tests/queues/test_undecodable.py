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
        raw, typed = DistributedQueue(etcd_client, path), DistributedQueue(
            etcd_client, path, codec=JSON
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
    raw, typed = DistributedQueue(etcd_client, path), DistributedQueue(etcd_client, path, codec=JSON)
    await typed.enqueue_all([1, 2])
    await raw.enqueue(b"\xff")
    await typed.enqueue(3)
    assert [await typed.dequeue(), await typed.dequeue()] == [1, 2]
    with pytest.raises(CodecError):
        await typed.try_dequeue()
    assert await raw.try_dequeue() == b"\xff"
    assert await typed.try_dequeue() == 3
