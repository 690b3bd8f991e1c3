"""Parked consumers through faults: a server restart, and a compaction of the history they were
anchored in while their connection was cut off. They stay parked, report the recovery in their
connection state, and still get the next item -- exactly once."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    ResilienceConfig,
    WorkQueueConfig,
    connect,
)
from etcd_recipes.metrics import EtcdMetrics
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}
CONFIG = WorkQueueConfig(visibility_timeout=10, sweep_interval=30)


class _Batching(DistributedWorkQueue):
    """A work queue whose consumer takes with ``receive_many`` (one item comes here)."""


def _consumer(client, path: str, kind: str):
    if kind == "work-batch":
        return _Batching(client, path, CONFIG)
    if kind == "fifo":
        return DistributedQueue(client, path)
    if kind == "priority":
        return DistributedPriorityQueue(client, path)
    return DistributedWorkQueue(client, path, CONFIG)


async def _take(queue) -> bytes:
    if isinstance(queue, _Batching):
        (item,) = await queue.receive_many(16)
        assert await queue.ack_many([item]) == [True]
        return item.value
    if isinstance(queue, DistributedWorkQueue):
        item = await queue.receive()
        assert await item.ack()
        return item.value
    return await queue.dequeue()


async def _put(client, path: str, kind: str, value: bytes) -> None:
    if kind == "fifo":
        await DistributedQueue(client, path).enqueue(value)
    elif kind == "priority":
        await DistributedPriorityQueue(client, path).enqueue(value, 5)
    else:
        await DistributedWorkQueue(client, path).enqueue(value)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "priority", "work", "work-batch"])
async def test_parked_consumer_survives_a_server_restart(fresh_etcd_server, etcd_prefix, kind):
    path = etcd_prefix + "q"
    async with connect(**fresh_etcd_server.client_kwargs(), **FAST) as client:
        queue = _consumer(client, path, kind)
        states: list[ConnectionState] = []
        queue.add_connection_state_listener(lambda new, old: states.append(new))
        task = asyncio.create_task(_take(queue))
        await asyncio.sleep(0.3)
        fresh_etcd_server.kill()
        await asyncio.sleep(0.5)
        fresh_etcd_server.restart()
        await eventually(lambda: ConnectionState.RECONNECTED in states, timeout=10, what="resume")
        assert not task.done()
        await _put(client, path, kind, b"after-restart")
        assert await asyncio.wait_for(task, 10) == b"after-restart"
        assert states[0] is ConnectionState.SUSPENDED
        await queue.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "priority", "work", "work-batch"])
async def test_parked_consumer_survives_compaction_while_cut_off(
    fresh_etcd_server, etcd_prefix, kind
):
    """While the consumer's connection is blackholed, the history its wait was anchored in is
    compacted: the watch cannot resume there, resyncs (re-reads the queue, still empty) and
    keeps waiting, re-anchored; the next item is taken. An item that arrives during an outage
    is found by the re-read after the watch resumes."""
    path = etcd_prefix + "q"
    recoveries: list[str] = []

    class Recorder(EtcdMetrics):
        def increment_watch_recovery(self, kind: str, key: bytes) -> None:
            recoveries.append(kind)

    config = ResilienceConfig(metrics=Recorder())
    proxy = TcpProxy.for_endpoint(fresh_etcd_server.endpoint).start()
    try:
        async with (
            connect(**fresh_etcd_server.client_kwargs()) as direct,
            connect(proxy.url, resilience=config, **FAST) as cut_off,
        ):
            queue = _consumer(cut_off, path, kind)
            states: list[ConnectionState] = []
            queue.add_connection_state_listener(lambda new, old: states.append(new))
            task = asyncio.create_task(_take(queue))
            await asyncio.sleep(0.3)
            proxy.blackhole()
            await eventually(lambda: ConnectionState.SUSPENDED in states, timeout=8, what="suspend")
            for i in range(5):
                await direct.put(etcd_prefix + f"noise/{i}", b"x")
            revision = (await direct.put(etcd_prefix + "noise/last", b"x")).revision
            await direct.compact(revision)
            proxy.restore()
            await eventually(lambda: "resynced" in recoveries, timeout=15, what="the resync")
            await asyncio.sleep(0.2)
            assert not task.done()  # still parked, re-anchored after the re-read
            assert states[-1] is ConnectionState.RECONNECTED
            await _put(direct, path, kind, b"after-compaction")
            assert await asyncio.wait_for(task, 10) == b"after-compaction"
            # An item enqueued while cut off is found when the watch comes back.
            second = asyncio.create_task(_take(queue))
            await asyncio.sleep(0.3)
            proxy.blackhole()
            await eventually(lambda: states.count(ConnectionState.SUSPENDED) == 2, timeout=8)
            await _put(direct, path, kind, b"while-cut-off")
            proxy.restore()
            assert await asyncio.wait_for(second, 15) == b"while-cut-off"
            third = asyncio.create_task(_take(queue))
            await asyncio.sleep(0.3)
            await _put(direct, path, kind, b"next")
            assert await asyncio.wait_for(third, 10) == b"next"
            assert (await direct.get_prefix(path + "/")).kvs == []  # each taken exactly once
            await queue.aclose()
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_a_producer_waiting_for_room_survives_a_restart(fresh_etcd_server, etcd_prefix):
    """A bounded queue's producer parked on a full queue (its watch of deletes) through a
    server restart: it still sees the room a claim makes afterwards, and writes once."""
    path = etcd_prefix + "q"
    config = WorkQueueConfig(visibility_timeout=10, sweep_interval=30, max_items=1)
    async with connect(**fresh_etcd_server.client_kwargs(), **FAST) as client:
        async with DistributedWorkQueue(client, path, config) as queue:
            await queue.enqueue(b"first")
            waiting = asyncio.create_task(queue.enqueue(b"second"))
            await asyncio.sleep(0.3)
            fresh_etcd_server.kill()
            await asyncio.sleep(0.5)
            fresh_etcd_server.restart()
            await asyncio.sleep(1.0)
            assert not waiting.done()  # still full
            item = await queue.receive(timeout=10)
            assert item is not None and item.value == b"first"
            second_id = await asyncio.wait_for(waiting, 10)
            assert await item.ack()
            again = await queue.receive(timeout=10)
            assert again is not None and (again.id, again.value) == (second_id, b"second")
            assert await again.ack()
            assert await queue.try_receive() is None  # written once
