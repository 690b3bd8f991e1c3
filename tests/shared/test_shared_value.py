"""SharedValue and SharedCount against a real etcd: versions and compare-and-set, the change
stream and listeners, cancellation, bad input, metrics, and DistributedAtomicLong's
compare_and_set."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    INT64,
    JSON,
    UTF8,
    CodecError,
    DistributedAtomicLong,
    InvalidArgumentError,
    NotStartedError,
    RecipeClosedError,
    ResilienceConfig,
    SharedCount,
    SharedValue,
    Versioned,
    connect,
)
from tests.helpers import eventually
from tests.metrics.recording import RecordingMetrics


async def test_start_creates_the_seed_and_versions_are_mod_revisions(etcd_client, etcd_prefix):
    path = etcd_prefix + "cfg"
    shared = SharedValue(etcd_client, path, {"replicas": 1}, codec=JSON)
    assert await etcd_client.get(path) is None  # the constructor did no I/O
    assert await shared.get() == Versioned({"replicas": 1}, 0)  # missing: the seed, version 0
    await shared.start()
    kv = await etcd_client.get(path)
    assert kv is not None and kv.lease == 0  # durable: no lease
    seen = await shared.get()
    assert seen == Versioned({"replicas": 1}, kv.mod_revision) and seen.exists
    assert shared.current == seen
    other = SharedValue(etcd_client, path, {"replicas": 99}, codec=JSON)  # the first seed wins
    await other.start()
    assert (await other.get()).value == {"replicas": 1}
    assert await shared.try_set({"replicas": 3}, seen.version)
    assert not await other.try_set({"replicas": 5}, seen.version)  # stale: nothing written
    now = await other.get()
    assert now.value == {"replicas": 3} and now.version > seen.version
    written = await other.set({"replicas": 4})
    assert written == await shared.get()
    await shared.aclose()
    await other.aclose()
    assert (await etcd_client.get(path)).value == b'{"replicas":4}'  # closing deletes nothing
    with pytest.raises(RecipeClosedError):
        await shared.get()


async def test_a_deleted_key_reads_as_the_seed_and_try_set_zero_recreates_it(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "v"
    async with SharedValue(etcd_client, path, "seed", codec=UTF8) as shared:
        changes = shared.changes()
        assert (await anext(changes)).value == "seed"
        await etcd_client.delete(path)
        assert await anext(changes) == Versioned("seed", 0)
        assert await shared.try_set("again", 0)  # only while missing
        back = await anext(changes)
        assert back.value == "again" and back.version > 0
        assert not await shared.try_set("twice", 0)
        assert (await shared.get()).value == "again"


async def test_the_stream_and_listeners_see_every_change_in_order(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    heard: list[int] = []
    async with SharedCount(etcd_client, path) as count, SharedCount(etcd_client, path) as peer:
        count.add_listener(lambda v: heard.append(v.value))
        changes = count.changes()
        assert (await anext(changes)).value == 0
        versions = [(await peer.set(i)).version for i in range(1, 6)]
        got = [await anext(changes) for _ in range(5)]
        assert [(v.value, v.version) for v in got] == list(zip(range(1, 6), versions))
        await eventually(lambda: heard == [1, 2, 3, 4, 5], what="the listener")
        assert count.current == got[-1] and count.revision >= versions[-1]
        assert "SharedCount" in repr(count) and f"version={versions[-1]}" in repr(count)


async def test_concurrent_try_set_loops_lose_no_update(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    counts = [SharedCount(etcd_client, path) for _ in range(10)]
    for c in counts:
        await c.start()

    async def bump(count: SharedCount) -> int:
        conflicts = 0
        for _ in range(5):
            while True:
                seen = await count.get()
                if await count.try_set(seen.value + 1, seen.version):
                    break
                conflicts += 1
        return conflicts

    await asyncio.gather(*(bump(c) for c in counts))
    assert (await counts[0].get()).value == 50
    for c in counts:
        await c.aclose()


async def test_shared_count_and_the_atomic_counter_share_one_key(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    async with (
        SharedCount(etcd_client, path, seed=7) as count,
        DistributedAtomicLong(etcd_client, path) as counter,
    ):
        assert await counter.get() == 7
        changes = count.changes()
        await anext(changes)
        assert await counter.increment() == 8
        assert (await anext(changes)).value == 8
        assert (await etcd_client.get(path)).value == INT64.encode(8)


async def test_compare_and_set_on_the_atomic_counter(etcd_client, etcd_prefix):
    path = etcd_prefix + "slots"
    counter = DistributedAtomicLong(etcd_client, path, default=5)
    assert not await counter.compare_and_set(4, 1)  # creates the key with 5: not 4
    assert await counter.get() == 5
    assert await counter.compare_and_set(5, 4)
    assert not await counter.compare_and_set(5, 3)
    assert await counter.get() == 4
    await DistributedAtomicLong.delete(etcd_client, path)
    assert await counter.compare_and_set(5, 9)  # missing: created with the default 5, then set
    assert await counter.get() == 9
    results = await asyncio.gather(*(counter.compare_and_set(9, 10 + i) for i in range(8)))
    assert results.count(True) == 1  # exactly one of the racing swaps wins
    with pytest.raises(InvalidArgumentError):
        await counter.compare_and_set(2**63, 0)
    assert await counter.get() in range(10, 18)
    await counter.aclose()


async def test_bad_input_raises_typed_errors_and_writes_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "v"
    with pytest.raises(InvalidArgumentError):
        SharedCount(etcd_client, path, seed=2**63)
    with pytest.raises(CodecError):
        SharedValue(etcd_client, path, "text", codec=INT64)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SharedValue(etcd_client, "relative", b"x")
    shared = SharedCount(etcd_client, path, seed=1)
    with pytest.raises(NotStartedError):
        shared.current  # noqa: B018
    with pytest.raises(NotStartedError):
        shared.changes()
    assert await etcd_client.get(path) is None
    await shared.start()
    before = await shared.get()
    with pytest.raises(InvalidArgumentError):
        await shared.try_set(2, -1)
    with pytest.raises(InvalidArgumentError):
        await shared.set(2**64)
    with pytest.raises(InvalidArgumentError):
        await shared.try_set("2", before.version)  # type: ignore[arg-type]
    assert await shared.get() == before
    await shared.aclose()


async def test_an_undecodable_value_is_recorded_and_skipped(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    async with SharedCount(etcd_client, path, seed=1) as count:
        changes = count.changes()
        await anext(changes)
        await etcd_client.put(path, b"not a count")
        with pytest.raises(CodecError):
            await count.get()
        await eventually(lambda: count.has_exceptions, what="the decode failure recorded")
        assert count.current.value == 1  # the last good value stays
        written = await count.set(2)
        assert await anext(changes) == written  # and the stream goes on


async def test_cancelling_a_wait_for_a_change_leaves_the_value_and_the_recipe_working(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "v"
    async with SharedValue(etcd_client, path, b"a") as shared:
        waiting = shared.changes()
        await anext(waiting)
        task = asyncio.ensure_future(anext(waiting))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        other = shared.changes()
        await anext(other)
        written = await shared.set(b"b")
        assert await anext(other) == written  # the watch still delivers
    read = await etcd_client.range(etcd_prefix, prefix=True)
    assert [(kv.key, kv.value, kv.lease) for kv in read.kvs] == [(path.encode(), b"b", 0)]


async def test_cancelling_start_anywhere_leaves_no_watch_task_or_lease(etcd_client, etcd_prefix):
    path = etcd_prefix + "v"
    hub = etcd_client._watch_hub
    watches = hub.watcher_count
    cancelled = 0
    for steps in range(0, 40, 2):  # cancel after more and more loop iterations
        shared = SharedValue(etcd_client, path, b"seed")
        task = asyncio.ensure_future(shared.start())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
            assert not shared.is_started and not shared._tasks
        await shared.aclose()
    assert cancelled > 0
    await eventually(lambda: hub.watcher_count == watches, what="every watch closed")
    read = await etcd_client.range(etcd_prefix, prefix=True)
    assert [(kv.value, kv.lease) for kv in read.kvs] == [(b"seed", 0)]  # the seed, no lease
    async with SharedValue(etcd_client, path, b"other") as shared:  # and it starts afterwards
        assert shared.current.value == b"seed"


async def test_writes_are_metered(etcd_server, etcd_prefix):
    sink = RecordingMetrics()
    config = ResilienceConfig(metrics=sink)
    async with connect(**etcd_server.client_kwargs(), resilience=config) as client:
        async with (
            SharedValue(client, etcd_prefix + "v", b"a", metrics_name="cfg") as shared,
            SharedCount(client, etcd_prefix + "n", metrics_name="workers") as count,
        ):
            seen = await shared.get()
            await shared.set(b"b")
            assert not await shared.try_set(b"c", seen.version)
            assert await count.try_set(1, (await count.get()).version)
        sink.flush()
    assert sink.of("shared_value_written") == [
        ("SharedValue", "cfg", "set", "ok"),
        ("SharedValue", "cfg", "try_set", "conflict"),
        ("SharedCount", "workers", "try_set", "ok"),
    ]
