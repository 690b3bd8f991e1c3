"""The generated blocking twins of the queues: same behaviour from plain threads, typed values,
work items that settle through the facade, lease listeners on the listener thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import etcd_recipes as async_api
from etcd_recipes import DeadLetter, WorkQueueConfig
from etcd_recipes.sync import (
    JSON,
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    EtcdClient,
    EtcdTimeoutError,
    LeaseEvent,
    LeaseExpired,
    Recipe,
    WorkItem,
    connect,
    fail_after,
)
from tools.gen_sync.rules import Usage


@pytest.fixture
def client(etcd_server: Any) -> Iterator[EtcdClient]:
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_the_twins_are_recipes() -> None:
    for twin in (DistributedQueue, DistributedPriorityQueue, DistributedWorkQueue):
        assert issubclass(twin, Recipe)
    # The facade's docstrings are the async ones through tools/gen_sync's DOC_REWRITES.
    assert DistributedQueue.__doc__ == Usage().doc(async_api.DistributedQueue.__doc__ or "")
    assert WorkItem.ack.__doc__ and "False" in WorkItem.ack.__doc__
    with pytest.raises(TypeError):
        WorkItem()  # created by receive(), never directly


def test_fifo_and_priority_from_a_thread(client: EtcdClient, etcd_prefix: str) -> None:
    with DistributedQueue(client, etcd_prefix + "q", codec=JSON) as queue:
        queue.enqueue({"n": 1})
        queue.enqueue_all([{"n": 2}, {"n": 3}])
        assert queue.size() == 3
        assert [queue.dequeue(), queue.poll(1.0), queue.try_dequeue()] == [
            {"n": 1},
            {"n": 2},
            {"n": 3},
        ]
        assert queue.try_dequeue() is None
    results: list[bytes] = []
    pq = DistributedPriorityQueue(client, etcd_prefix + "pq")
    consumer = threading.Thread(target=lambda: results.append(pq.dequeue()))
    consumer.start()
    pq.enqueue(b"only", 9)
    consumer.join(10)
    assert results == [b"only"]
    assert isinstance(pq._a, async_api.DistributedPriorityQueue)
    client.delete("__" + etcd_prefix, prefix=True)


def test_fail_after_bounds_a_blocking_dequeue(client: EtcdClient, etcd_prefix: str) -> None:
    queue = DistributedQueue(client, etcd_prefix + "q")
    with pytest.raises(EtcdTimeoutError):
        with fail_after(0.3):
            queue.dequeue()
    queue.enqueue(b"still-there")
    assert queue.size() == 1  # the cancelled dequeue took nothing
    assert queue.dequeue() == b"still-there"


def test_work_queue_twin(client: EtcdClient, etcd_prefix: str) -> None:
    config = WorkQueueConfig(visibility_timeout=1, max_deliveries=1, sweep_interval=0.2)
    events: list[tuple[LeaseEvent, str]] = []
    with DistributedWorkQueue(client, etcd_prefix + "wq", config) as queue:
        queue.add_lease_listener(lambda e: events.append((e, threading.current_thread().name)))
        ids = queue.enqueue_all([b"a", b"b"])
        item = queue.receive()
        assert isinstance(item, WorkItem)
        assert isinstance(item._a, async_api.WorkItem)
        assert (item.id, item.value, item.attempt) == (ids[0], b"a", 1)
        assert item.requeue() is True
        again = queue.receive(timeout=2)
        assert again is not None and (again.id, again.attempt) == (ids[0], 2)
        assert again.ack() is True
        assert again.is_settled
        doomed = queue.receive()
        client.lease_revoke(queue.lease_id)
        assert doomed.ack() is False  # the claim went with the lease
        assert queue.receive(timeout=1.5) is None  # orphaned on its last delivery: dead
        assert queue.dead_letters() == [
            DeadLetter(ids[1], b"b", 1, "max_deliveries: orphaned on delivery 1, the last allowed")
        ]
        assert queue.purge_dead_letter(ids[1]) is True
    assert any(isinstance(e, LeaseExpired) for e, _ in events)
    assert all(name != client._rt.loop_thread.name for _, name in events)  # off the loop
    assert client.get_prefix(etcd_prefix).kvs == []
