"""DistributedWorkQueue against a real etcd: claims, acks, requeues, the lazy consumer lease,
claim loss, orphan sweeping to the original position, dead letters, delayed delivery,
closing, SIGKILLed consumers, codecs and bad input."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import textwrap
import time

import pytest

from etcd_recipes import (
    INT32,
    JSON,
    ConnectionState,
    DeadLetter,
    DistributedWorkQueue,
    EmptyPathError,
    InvalidArgumentError,
    LeaseExpired,
    LeaseRestored,
    RecipeClosedError,
    ResilienceConfig,
    ValueTooLargeError,
    WorkQueueConfig,
    connect,
)
from etcd_recipes.metrics import EtcdMetrics
from tests.helpers import eventually, first_item_then_break, take
from tests.queues.helpers import keys, server_leases, spawn

FAST = WorkQueueConfig(visibility_timeout=1, max_deliveries=5, sweep_interval=0.3)


async def test_receive_ack_and_raw_layout(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, FAST) as queue:
        item_id = await queue.enqueue(b"job-1")
        assert re.fullmatch(r"\d{19}-[A-Za-z0-9]{3}", item_id)
        assert await keys(etcd_client, path + "/") == [f"{path}/items/{item_id}"]
        item = await queue.receive()
        assert (item.id, item.value, item.attempt) == (item_id, b"job-1", 1)
        raw = {kv.key_text: kv for kv in await etcd_client.get_prefix(path + "/")}
        assert set(raw) == {
            f"{path}/{space}/{item_id}" for space in ("claimed", "claims", "attempts")
        }
        assert raw[f"{path}/claimed/{item_id}"].value == b"job-1"
        assert raw[f"{path}/claimed/{item_id}"].lease == 0  # the payload survives a crash
        claim = raw[f"{path}/claims/{item_id}"]
        assert claim.value == queue.client_id.encode()
        assert claim.lease == queue.lease_id != 0  # only the marker is leased
        assert raw[f"{path}/attempts/{item_id}"].value == INT32.encode(1) == b"\x00\x00\x00\x01"
        assert await item.ack() is True
        assert await item.ack() is False  # settled already
        assert item.is_settled
        assert await keys(etcd_client, path + "/") == []


async def test_requeue_keeps_place_and_attempts(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, FAST) as queue:
        ids = await queue.enqueue_all([b"a", b"b", b"c"])
        assert [i.split("-")[1] for i in ids] == ["00000", "00001", "00002"]
        first = await queue.receive()
        assert first.value == b"a"
        assert await first.requeue() is True
        assert await keys(etcd_client, path + "/items/") == [f"{path}/items/{i}" for i in ids]
        again = await queue.receive()
        assert (again.id, again.value, again.attempt) == (first.id, b"a", 2)
        assert await again.requeue()
        # requeue() never dead-letters (as in the reference): attempt 3 > max_deliveries is fine
        strict = DistributedWorkQueue(etcd_client, path, WorkQueueConfig(max_deliveries=1))
        third = await strict.receive()
        assert (third.value, third.attempt) == (b"a", 3)
        assert await third.ack()
        await strict.aclose()
        assert [(await queue.receive()).value for _ in range(2)] == [b"b", b"c"]


async def test_a_producer_takes_no_lease_and_runs_no_sweeper(etcd_client, etcd_prefix):
    leases_before = await server_leases(etcd_client)
    producer = DistributedWorkQueue(etcd_client, etcd_prefix + "wq", FAST)
    await producer.enqueue(b"x")
    await producer.enqueue_all([b"y", b"z"])
    await producer.enqueue(b"later", delay=30)
    assert await producer.size() == 3
    assert await producer.try_receive() is not None  # the first receive takes the lease ...
    consumer_lease = producer.lease_id
    assert consumer_lease != 0
    fresh = DistributedWorkQueue(etcd_client, etcd_prefix + "wq", FAST)
    await fresh.enqueue(b"w")
    assert fresh.lease_id == 0  # ... a producer never does
    assert fresh._consumer.sweeper is None
    assert fresh._tasks == set()
    assert await server_leases(etcd_client) - leases_before == {consumer_lease}
    await producer.aclose()
    await fresh.aclose()
    assert await server_leases(etcd_client) - leases_before == set()  # closing revoked it


async def test_ack_after_claim_loss_is_false_and_the_item_comes_back(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=2, sweep_interval=0.2)
    consumer = DistributedWorkQueue(etcd_client, path, config)
    events: list[object] = []
    states: list[ConnectionState] = []
    consumer.add_lease_listener(events.append)
    consumer.add_connection_state_listener(lambda new, old: states.append(new))
    await consumer.enqueue(b"job")
    item = await consumer.receive()
    lost_lease = consumer.lease_id
    await etcd_client.lease_revoke(lost_lease)  # as a long partition would: the marker is gone
    assert await item.ack() is False  # the work may be redone elsewhere: not a success
    # The orphan is returned to the queue and delivered again, with attempt + 1.
    other = DistributedWorkQueue(etcd_client, path, config)
    again = await asyncio.wait_for(other.receive(), 5)
    assert (again.id, again.value, again.attempt) == (item.id, b"job", 2)
    assert await again.ack()
    # The consumer's lease healed forward, for future claims only; listeners saw it.
    await eventually(lambda: any(isinstance(e, LeaseRestored) for e in events), what="heal")
    expired = [e for e in events if isinstance(e, LeaseExpired)]
    assert expired and expired[0].lease_id == lost_lease
    assert consumer.lease_id not in (0, lost_lease)
    assert states[-2:] == [ConnectionState.LOST, ConnectionState.RECONNECTED]
    assert consumer.has_exceptions
    await consumer.enqueue(b"next")
    fresh = await consumer.receive()
    assert (await etcd_client.get(f"{path}/claims/{fresh.id}")).lease == consumer.lease_id
    assert await fresh.ack()
    await consumer.aclose()
    await other.aclose()


async def test_orphan_returns_to_its_original_position(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    crashed = DistributedWorkQueue(etcd_client, path, FAST)
    ids = await crashed.enqueue_all([b"a", b"b", b"c"])
    held = await crashed.receive()
    assert held.value == b"a"
    await etcd_client.lease_revoke(crashed.lease_id)  # the consumer "dies"
    survivor = DistributedWorkQueue(etcd_client, path, FAST)
    got = [await asyncio.wait_for(survivor.receive(), 5) for _ in range(3)]
    assert [(i.value, i.attempt) for i in got] == [(b"a", 2), (b"b", 1), (b"c", 1)]
    assert [i.id for i in got] == ids  # same keys: the orphan kept its place at the head
    for item in got:
        assert await item.ack()
    await crashed.aclose()
    await survivor.aclose()
    assert await keys(etcd_client, path + "/") == []


async def test_the_sweeper_returns_orphans_while_consumers_are_busy(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=1, sweep_interval=0.2)
    crashed = DistributedWorkQueue(etcd_client, path, config)
    busy = DistributedWorkQueue(etcd_client, path, config)
    await crashed.enqueue_all([b"lost", b"busy-with"])
    lost = await crashed.receive()
    working = await busy.receive()  # busy holds an item and does not call receive again
    assert (lost.value, working.value) == (b"lost", b"busy-with")
    await etcd_client.lease_revoke(crashed.lease_id)

    async def back_in_queue() -> bool:
        return await keys(etcd_client, path + "/items/") == [f"{path}/items/{lost.id}"]

    await eventually(back_in_queue, timeout=3, what="the busy consumer's sweeper to reclaim")
    assert await working.ack()
    await crashed.aclose()
    await busy.aclose()


async def test_dead_letters_after_max_deliveries(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=1, max_deliveries=2, sweep_interval=0.2)
    queue = DistributedWorkQueue(etcd_client, path, config)
    poison = await queue.enqueue(b"poison")
    for attempt in (1, 2):
        item = await asyncio.wait_for(queue.receive(), 5)
        assert (item.id, item.attempt) == (poison, attempt)
        await etcd_client.lease_revoke(queue.lease_id)  # the consumer "crashes" on it
    # Orphaned after its last allowed delivery: dead-lettered, not redelivered.
    assert await queue.receive(timeout=1.5) is None
    assert await queue.dead_letters() == [
        DeadLetter(poison, b"poison", 2, "max_deliveries: orphaned on delivery 2, the last allowed")
    ]
    assert await keys(etcd_client, path + "/") == [
        f"{path}/attempts/{poison}",
        f"{path}/dlq/{poison}",
        f"{path}/reasons/{poison}",
    ]
    # The operator surface: replay with a fresh count, or purge.
    assert await queue.requeue_dead_letter("0000000000000000000-nop") is False
    assert await queue.requeue_dead_letter(poison) is True
    again = await queue.receive()
    assert (again.id, again.attempt) == (poison, 1)
    assert await again.requeue()
    last = await queue.receive()
    assert (last.id, last.attempt) == (poison, 2)
    await queue.aclose()  # closing on the last allowed attempt dead-letters it ...
    checker = DistributedWorkQueue(etcd_client, path, config)
    assert [d.id for d in await checker.dead_letters()] == [poison]  # ... like a crash would
    assert await checker.purge_dead_letter(poison) is True
    assert await checker.purge_dead_letter(poison) is False
    assert await keys(etcd_client, path + "/") == []
    with pytest.raises(InvalidArgumentError):
        await checker.purge_dead_letter("../items/x")
    with pytest.raises(InvalidArgumentError):
        await checker.requeue_dead_letter("")


async def test_delayed_items_are_invisible_until_ready_then_in_time_order(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, FAST) as queue:
        later_id = await queue.enqueue(b"later", delay=1.7)  # enqueued first, ready second
        before = time.time_ns() // 1_000_000
        delayed_id = await queue.enqueue(b"delayed", delay=1.5)
        ready = int(delayed_id.split("-")[0])
        assert before + 1500 <= ready <= time.time_ns() // 1_000_000 + 1500
        assert await keys(etcd_client, path + "/") == [
            f"{path}/delayed/{delayed_id}",
            f"{path}/delayed/{later_id}",
        ]
        await queue.enqueue(b"early")
        await queue.enqueue(b"negative", delay=-5)  # <= 0: at once
        assert (await queue.receive()).value == b"early"
        assert (await queue.receive()).value == b"negative"
        assert await queue.try_receive() is None  # not ready yet
        later_ready = int(later_id.split("-")[0])
        await asyncio.sleep(max(0.0, later_ready / 1000 - time.time()) + 0.2)
        await queue.enqueue(b"late")  # enqueued after both delayed ones became ready
        got = await queue.receive()
        assert (got.id, got.value) == (delayed_id, b"delayed")  # promoted under its ready time
        assert (await queue.receive()).value == b"later"  # ready-time order
        assert (await queue.receive()).value == b"late"
        # A parked consumer wakes up for a delayed item by itself.
        await queue.enqueue(b"wake-me", delay=0.4)
        started = time.monotonic()
        woke = await queue.receive(timeout=5)
        assert woke is not None and woke.value == b"wake-me"
        assert 0.3 <= time.monotonic() - started < 2


async def test_close_returns_unacked_work_at_once(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    slow = WorkQueueConfig(visibility_timeout=30, sweep_interval=30)
    leaving = DistributedWorkQueue(etcd_client, path, slow)
    staying = DistributedWorkQueue(etcd_client, path, slow)
    await leaving.enqueue(b"unfinished")
    item = await leaving.receive()
    lease = leaving.lease_id
    waiter = asyncio.create_task(staying.receive())
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await leaving.aclose()
    again = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - started < 2  # not after the 30 s visibility timeout
    assert (again.id, again.attempt) == (item.id, 2)
    assert lease not in await server_leases(etcd_client)  # revoked
    assert await item.ack() is False
    assert await again.ack()
    await staying.aclose()


async def test_typed_work_queue(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=1, max_deliveries=1, sweep_interval=0.2)
    async with DistributedWorkQueue(etcd_client, path, config, codec=JSON) as queue:
        await queue.enqueue({"order": 1})
        await queue.enqueue_all([{"order": 2}, {"order": 3}])
        item = await queue.receive()
        assert item.value == {"order": 1}
        assert (await etcd_client.get(f"{path}/claimed/{item.id}")).value == b'{"order":1}'
        assert await item.ack()
        second = await queue.receive()
        await etcd_client.lease_revoke(queue.lease_id)
        third = await asyncio.wait_for(queue.receive(), 5)
        assert third.value == {"order": 3}
        assert await queue.dead_letters() == [
            DeadLetter(
                second.id,
                {"order": 2},
                1,
                "max_deliveries: orphaned on delivery 1, the last allowed",
            )
        ]


async def test_receive_latency_metric(etcd_server, etcd_prefix):
    recorded: list[str] = []

    class Recorder(EtcdMetrics):
        def record_latency(self, name: str, seconds: float) -> None:
            recorded.append(name)

    config = ResilienceConfig(metrics=Recorder())
    async with connect(**etcd_server.client_kwargs(), resilience=config) as client:
        async with DistributedWorkQueue(client, etcd_prefix + "wq", FAST) as queue:
            await queue.enqueue(b"x")
            await (await queue.receive()).ack()
    assert recorded == ["work_queue.receive"]


async def test_bad_input(etcd_client, etcd_prefix):
    with pytest.raises(EmptyPathError):
        DistributedWorkQueue(etcd_client, "")
    for bad in (
        {"visibility_timeout": 0},
        {"visibility_timeout": 0.5},
        {"max_deliveries": 0},
        {"max_deliveries": 1.5},
        {"sweep_interval": 0},
        {"sweep_interval": -1},
        {"sweep_interval": float("inf")},
    ):
        with pytest.raises(InvalidArgumentError):
            WorkQueueConfig(**bad)
    with pytest.raises(InvalidArgumentError):
        DistributedWorkQueue(etcd_client, etcd_prefix + "wq", {"visibility_timeout": 5})  # type: ignore[arg-type]
    queue = DistributedWorkQueue(etcd_client, etcd_prefix + "wq", FAST)
    for timeout in (-1, True, float("nan")):  # 0 is "try once" (test_try_once.py)
        with pytest.raises(InvalidArgumentError):
            await queue.receive(timeout=timeout)  # type: ignore[call-overload]
    for delay in (float("nan"), float("inf"), "1"):
        with pytest.raises(InvalidArgumentError):
            await queue.enqueue(b"x", delay=delay)  # type: ignore[arg-type]
    with pytest.raises(ValueTooLargeError):
        await queue.enqueue(b"v" * (2 * 1024 * 1024))
    with pytest.raises(InvalidArgumentError):
        await queue.enqueue_all("abc")
    assert await keys(etcd_client, etcd_prefix) == []
    assert queue.lease_id == 0
    await queue.aclose()
    with pytest.raises(RecipeClosedError):
        await queue.receive(timeout=1)


_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from etcd_recipes import connect
    from etcd_recipes import DistributedWorkQueue, WorkQueueConfig

    async def main(endpoint, path):
        config = WorkQueueConfig(visibility_timeout=1, max_deliveries=2, sweep_interval=0.3)
        async with connect(endpoint) as client:
            queue = DistributedWorkQueue(client, path, config)
            print("ready", flush=True)
            item = await queue.receive()
            print(json.dumps({"id": item.id, "attempt": item.attempt}), flush=True)
            await asyncio.sleep(3600)  # "processing" until SIGKILLed

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.slow
async def test_sigkilled_consumers_redelivery_then_dead_letter(
    etcd_client, etcd_server, etcd_prefix
):
    """A consumer SIGKILLed mid-item: the item is redelivered with attempt + 1 within about
    visibility timeout + sweep interval; killed again on its last allowed delivery, it lands in
    the dead letters. Nothing is lost or delivered to two live consumers at once."""
    path = etcd_prefix + "wq"
    workers = [spawn(_WORKER, etcd_server.url, path) for _ in range(2)]
    lines: asyncio.Queue[tuple[int, str]] = asyncio.Queue()

    async def pump(i: int) -> None:  # one reader thread per worker's stdout
        stream = workers[i].stdout
        assert stream is not None
        while line := await asyncio.to_thread(stream.readline):
            lines.put_nowait((i, line.strip()))

    pumps = [asyncio.create_task(pump(i)) for i in range(2)]
    try:
        ready = {await asyncio.wait_for(lines.get(), 15) for _ in range(2)}
        assert ready == {(0, "ready"), (1, "ready")}
        await asyncio.sleep(0.3)  # both parked on the empty queue
        item_id = await DistributedWorkQueue(etcd_client, path).enqueue(b"crashy")
        who, line = await asyncio.wait_for(lines.get(), 10)
        assert json.loads(line) == {"id": item_id, "attempt": 1}
        os.kill(workers[who].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        survivor = workers[1 - who]
        again, line = await asyncio.wait_for(lines.get(), 10)
        assert again == 1 - who
        assert json.loads(line) == {"id": item_id, "attempt": 2}
        lease_ttl, sweep = 1, 0.3
        assert time.monotonic() - killed_at < lease_ttl + sweep + 1.5  # + detection slack
        os.kill(survivor.pid, signal.SIGKILL)
        # No live consumer is left to sweep; any consumer's receive returns the orphan -- on
        # its last allowed delivery, to the dead letters.
        janitor = DistributedWorkQueue(etcd_client, path, WorkQueueConfig(max_deliveries=2))

        async def dead_lettered() -> bool:
            assert await janitor.try_receive() is None  # never delivered a third time
            return [d.id for d in await janitor.dead_letters()] == [item_id]

        await eventually(dead_lettered, timeout=5, interval=0.2, what="the dead letter")
        dead = (await janitor.dead_letters())[0]
        assert (dead.value, dead.attempts) == (b"crashy", 2)
        assert await keys(etcd_client, path + "/claims/") == []
        assert await keys(etcd_client, path + "/claimed/") == []
        await janitor.aclose()
    finally:
        for task in pumps:
            task.cancel()
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
            if proc.stderr:
                proc.stderr.close()


async def test_closing_ends_a_parked_receive(etcd_client, etcd_prefix):
    queue = DistributedWorkQueue(
        etcd_client, etcd_prefix + "wq", WorkQueueConfig(sweep_interval=30)
    )
    parked = asyncio.create_task(queue.receive())
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await queue.aclose()
    with pytest.raises(RecipeClosedError):
        await asyncio.wait_for(parked, 5)
    assert time.monotonic() - started < 1  # not at the next 30 s sweep wake-up
    assert await keys(etcd_client, etcd_prefix) == []


@pytest.mark.slow
async def test_random_crashes_lose_nothing(etcd_client, etcd_prefix):
    """Producers and consumers, with consumers 'crashing' at random mid-item (their lease is
    revoked, as a SIGKILL would let it expire): every item ends up acknowledged exactly once or
    dead-lettered, and no claim marker or in-flight copy is left behind."""
    import random

    rng = random.Random(27)
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=1, max_deliveries=3, sweep_interval=0.2)
    values = [b"job-%03d" % i for i in range(60)]
    acked: list[bytes] = []
    crashes = 0

    async def consumer() -> None:
        nonlocal crashes
        queue = DistributedWorkQueue(etcd_client, path, config)
        while (item := await queue.receive(timeout=3)) is not None:
            if rng.random() < 0.15:  # crash mid-item: the lease dies with the process
                crashes += 1
                await etcd_client.lease_revoke(queue.lease_id)
                await queue.aclose()  # nothing left to return: the claim went with the lease
                queue = DistributedWorkQueue(etcd_client, path, config)
                continue
            if await item.ack():
                acked.append(item.value)
        await queue.aclose()

    producers = [DistributedWorkQueue(etcd_client, path, config) for _ in range(3)]
    consumers = [asyncio.create_task(consumer()) for _ in range(4)]
    await asyncio.gather(
        *(producers[i % 3].enqueue(v) for i, v in enumerate(values[:40])),
        producers[0].enqueue_all(values[40:]),
    )
    await asyncio.wait_for(asyncio.gather(*consumers), 60)
    dead = [d.value for d in await producers[0].dead_letters()]
    assert crashes > 0
    assert len(acked) == len(set(acked))  # acknowledged at most once each
    assert sorted(acked + dead) == values  # and nothing lost
    assert await keys(etcd_client, path + "/claims/") == []
    assert await keys(etcd_client, path + "/claimed/") == []
    assert await keys(etcd_client, path + "/items/") == []


async def test_lease_events_report_claim_loss_and_end_on_close(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    config = WorkQueueConfig(visibility_timeout=2, sweep_interval=0.2)
    consumer = DistributedWorkQueue(etcd_client, path, config)
    events = consumer.lease_events()
    await consumer.enqueue(b"job")
    item = await consumer.receive()
    lost_lease = consumer.lease_id
    await etcd_client.lease_revoke(lost_lease)
    expired, restored = await take(events, 2)
    assert isinstance(expired, LeaseExpired) and expired.lease_id == lost_lease
    assert isinstance(restored, LeaseRestored) and restored.old_lease_id == lost_lease
    assert await item.ack() is False
    # Breaking out unregisters.
    consumer_task = asyncio.create_task(first_item_then_break(consumer.lease_events()))
    await eventually(lambda: consumer._lease_events.stream_count == 2, what="registered")
    consumer_task.cancel()
    await asyncio.wait({consumer_task})
    del consumer_task
    gc.collect()
    assert consumer._lease_events.stream_count == 1
    await consumer.aclose()
    assert [e async for e in events] == []  # closing ends the iteration
    assert consumer._lease_events.stream_count == 0
    assert await etcd_client.count(path + "/claims/") == 0
