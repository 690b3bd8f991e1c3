"""queues.inspection against real etcd: a queue's kind is told from the family's own key layout,
every sub-prefix of the work queue included; in_flight() names the claimed items."""

from __future__ import annotations

import pytest

from etcd_recipes import DistributedWorkQueue, InvalidArgumentError
from etcd_recipes.queues.inspection import detect_queue_kind, in_flight, queue_stats


async def test_every_work_queue_part_is_a_work_queue(etcd_client, etcd_prefix):
    # A trace context left alone (a JVM consumer acknowledged the item and knows nothing of
    # trace/) still reads as a work queue, not as "not a queue".
    path = etcd_prefix + "jobs"
    await etcd_client.put(f"{path}/trace/0000001796286834404-N2V", b"{}")
    assert await detect_queue_kind(etcd_client, path) == "work"
    stats = await queue_stats(etcd_client, path)
    assert stats is not None and (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)
    await etcd_client.put(f"{etcd_prefix}other/config", b"x")
    with pytest.raises(InvalidArgumentError):
        await detect_queue_kind(etcd_client, etcd_prefix + "other")


async def test_in_flight_names_the_claimed_items(etcd_client, etcd_prefix):
    path = etcd_prefix + "jobs"
    async with DistributedWorkQueue(etcd_client, path) as queue:
        first, second = await queue.enqueue_all([b"a", b"b"])
        assert await in_flight(etcd_client, path, [first, second]) == set()
        item = await queue.receive(timeout=5)
        assert item is not None and item.id == first
        assert await in_flight(etcd_client, path, [first, second, "nope"]) == {first}
        await item.ack()
        assert await in_flight(etcd_client, path, [first]) == set()
    assert await in_flight(etcd_client, path, []) == set()
    for bad in ("", "a/b", 7):
        with pytest.raises(InvalidArgumentError):
            await in_flight(etcd_client, path, [bad])  # type: ignore[list-item]
