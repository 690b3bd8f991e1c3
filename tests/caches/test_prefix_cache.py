"""PrefixCache: the snapshot, live batches, reads without I/O, shape controls, typed values,
decode failures, listeners and streams, consistent reads, and nothing left after close."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import (
    JSON,
    UTF8,
    BatchKind,
    CacheEventType,
    CodecError,
    EtcdTimeoutError,
    InvalidArgumentError,
    NotStartedError,
    Op,
    PrefixCache,
    RecipeClosedError,
    UsageError,
)
from tests.helpers import eventually

from .helpers import Collector, cache_state, check_order, replay, server_state


async def test_snapshot_pages_all_at_one_revision(etcd_client, etcd_prefix):
    p = etcd_prefix + "cfg/"
    for i in range(25):
        await etcd_client.put(f"{p}{i:02d}", f"v{i}")
    await etcd_client.put(etcd_prefix + "cfg0", b"outside")  # shares the prefix text, not the /
    cache = PrefixCache(etcd_client, p, page_size=4, codec=UTF8)
    collector = Collector(cache)
    await cache.start()
    try:
        assert cache.is_synced and len(cache) == 25
        expected = {k: v.decode() for k, v in (await server_state(etcd_client, p)).items()}
        assert cache_state(cache) == expected
        await eventually(lambda: len(collector.batches) == 1, what="the INITIAL batch")
        (initial,) = collector.batches
        assert initial.kind is BatchKind.INITIAL and len(initial) == 25
        assert all(e.initial and e.type is CacheEventType.CREATED for e in initial)
        assert initial.revision == cache.revision
        assert f"{p}07" in cache and etcd_prefix + "cfg0" not in cache
        assert cache.keys() == sorted(expected)
        assert "synced" in repr(cache) and "keys=25" in repr(cache)
    finally:
        await collector.stop()
        await cache.aclose()


async def test_an_empty_range_still_reports_its_initial_batch(etcd_client, etcd_prefix):
    cache = PrefixCache(etcd_client, etcd_prefix + "nothing/")
    collector = Collector(cache)
    async with cache:
        await eventually(lambda: collector.kinds() == [BatchKind.INITIAL], what="INITIAL")
        assert len(collector.batches[0]) == 0 and len(cache) == 0
    await collector.stop()


async def test_live_batches_one_per_revision_with_previous_values(etcd_client, etcd_prefix):
    p = etcd_prefix + "live/"
    await etcd_client.put(p + "a", b"1")
    async with PrefixCache(etcd_client, p) as cache:
        collector = Collector(cache)
        txn = await etcd_client.txn([], [Op.put(p + "a", b"2"), Op.put(p + "b", b"x")])
        deleted = await etcd_client.delete(p + "a")
        await eventually(lambda: len(collector.batches) == 3, what="three batches")
        initial, both, gone = collector.batches
        assert initial.kind is BatchKind.INITIAL
        assert both.kind is BatchKind.LIVE and both.revision == txn.revision
        by_key = {e.key: e for e in both}
        assert by_key[p + "a"].type is CacheEventType.UPDATED
        assert by_key[p + "a"].prev_value == b"1" and by_key[p + "a"].value == b"2"
        assert by_key[p + "b"].type is CacheEventType.CREATED and by_key[p + "b"].prev_value is None
        (event,) = gone
        assert event.type is CacheEventType.DELETED and event.prev_value == b"2"
        assert event.value is None and gone.revision == deleted.revision
        assert cache.revision == deleted.revision
        assert cache_state(cache) == {p + "b": b"x"}
        check_order(collector.batches)
        assert replay(collector.batches) == cache_state(cache)
        await collector.stop()


async def test_typed_values_shape_controls_and_indexes(etcd_client, etcd_prefix):
    p = etcd_prefix + "svc/"
    await etcd_client.put(p + "a", b'{"zone": "eu", "port": 80, "blob": "xxxxxxxx"}')
    await etcd_client.put(p + "b", b'{"zone": "us", "port": 81, "blob": "yyyyyyyy"}')
    await etcd_client.put(p + "filtered-out", b'{"zone": "eu"}')

    def slim(node: dict) -> dict:
        return {"zone": node["zone"], "port": node["port"]}

    cache = PrefixCache(
        etcd_client,
        p,
        codec=JSON,
        transform=slim,
        key_filter=lambda key: not key.endswith("filtered-out"),
    )
    async with cache:
        assert cache.get(p + "a") == {"zone": "eu", "port": 80}
        assert p + "filtered-out" not in cache and len(cache) == 2
        cache.add_index("zone", lambda key, node: node["zone"])
        assert [k for k, _ in cache.by_index("zone", "eu")] == [p + "a"]
        written = await etcd_client.put(p + "b", b'{"zone": "eu", "port": 82}')
        await cache.wait_for_revision(written.revision)
        assert [k for k, _ in cache.by_index("zone", "eu")] == [p + "a", p + "b"]
        assert cache.by_index("zone", "us") == []
        with pytest.raises(InvalidArgumentError):
            cache.by_index("nope", 1)
        cache.remove_index("zone")
        with pytest.raises(InvalidArgumentError):
            cache.by_index("zone", "eu")

    async with PrefixCache(etcd_client, p, values=False) as keys_only:
        entry = keys_only.entry(p + "a")
        assert entry is not None and entry.value is None and entry.version == 1
        assert len(keys_only) == 3
        with pytest.raises(UsageError):
            keys_only.get(p + "a")
        with pytest.raises(UsageError):
            keys_only.add_index("zone", lambda key, node: node)


async def test_a_value_that_fails_to_decode_is_an_entry_with_its_error(etcd_client, etcd_prefix):
    p = etcd_prefix + "json/"
    await etcd_client.put(p + "good", b'{"ok": true}')
    await etcd_client.put(p + "bad", b"{not json")
    async with PrefixCache(etcd_client, p, codec=JSON) as cache:
        assert cache.get(p + "good") == {"ok": True}
        with pytest.raises(CodecError):
            cache.get(p + "bad")
        assert set(cache.decode_errors()) == {p + "bad"}
        assert cache.items() == [(p + "good", {"ok": True})]
        assert [e.key for e in cache.entries()] == [p + "bad", p + "good"]
        assert any("decode" in b.context for b in cache.exceptions)
        # It goes on: a later good value replaces the broken one.
        fixed = await etcd_client.put(p + "bad", b'{"ok": false}')
        await cache.wait_for_revision(fixed.revision)
        assert cache.get(p + "bad") == {"ok": False} and cache.decode_errors() == {}


async def test_single_key_mode(etcd_client, etcd_prefix):
    key = etcd_prefix + "one"
    await etcd_client.put(key, b"1")
    await etcd_client.put(key + "/child", b"not me")
    async with PrefixCache(etcd_client, key, single_key=True) as cache:
        assert cache.keys() == [key]
        changed = await etcd_client.put(key, b"2")
        await etcd_client.put(key + "2", b"neither")
        await cache.wait_for_revision(changed.revision)
        assert cache.get(key) == b"2" and len(cache) == 1


async def test_late_streams_and_listeners_start_with_the_current_content(etcd_client, etcd_prefix):
    p = etcd_prefix + "late/"
    await etcd_client.put(p + "a", b"1")
    async with PrefixCache(etcd_client, p) as cache:
        seen: list = []
        cache.add_listener(seen.append)
        late = Collector(cache)
        written = await etcd_client.put(p + "b", b"2")
        await eventually(lambda: len(late.batches) == 2 and len(seen) == 2, what="two batches")
        assert late.kinds() == [BatchKind.INITIAL, BatchKind.LIVE]
        assert [e.key for e in late.batches[0]] == [p + "a"]
        assert late.batches[1].revision == written.revision
        assert [b.kind for b in seen] == [BatchKind.INITIAL, BatchKind.LIVE]
        assert replay(late.batches) == cache_state(cache)
        await late.stop()


async def test_a_slow_listener_stalls_only_itself(etcd_client, etcd_prefix):
    p = etcd_prefix + "slow/"
    gate = asyncio.Event()
    slow_seen: list[int] = []
    fast_seen: list[int] = []

    async def slow(batch) -> None:
        await gate.wait()
        slow_seen.append(batch.revision)

    def failing(batch) -> None:
        raise RuntimeError("listener bug")

    async with PrefixCache(etcd_client, p) as cache:
        cache.add_listener(slow)
        cache.add_listener(failing)
        cache.add_listener(lambda batch: fast_seen.append(batch.revision))
        revisions = [(await etcd_client.put(p + str(i), b"x")).revision for i in range(3)]
        await eventually(lambda: fast_seen[1:] == revisions, what="the fast listener")
        assert slow_seen == []
        gate.set()
        await eventually(lambda: slow_seen[1:] == revisions, what="the slow listener, in order")
        assert sum("listener bug" in str(b.exception) for b in cache.exceptions) == 4
        cache.clear_listeners()


async def test_consistent_reads(etcd_client, etcd_prefix):
    p = etcd_prefix + "cons/"
    async with PrefixCache(etcd_client, p) as cache:
        elsewhere = await etcd_client.put(etcd_prefix + "other", b"x")  # not in the range
        assert await cache.wait_for_revision(elsewhere.revision, timeout=5) >= elsewhere.revision
        await etcd_client.put(p + "k", b"fresh")
        assert await cache.get_consistent(p + "k") == b"fresh"
        with pytest.raises(EtcdTimeoutError):
            await cache.wait_for_revision(cache.revision + 1000, timeout=0.5)
        with pytest.raises(InvalidArgumentError):
            await cache.wait_for_revision(-1)


async def test_cancelled_wait_for_revision_leaves_the_cache_working(etcd_client, etcd_prefix):
    p = etcd_prefix + "cw/"
    async with PrefixCache(etcd_client, p) as cache:
        watches = etcd_client._watch_hub.watcher_count
        waiting = asyncio.create_task(cache.wait_for_revision(cache.revision + 10_000, timeout=30))
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Nothing was left: no extra watch, and (a cache writes nothing) no key in its range.
        assert etcd_client._watch_hub.watcher_count == watches
        assert await server_state(etcd_client, p) == {}
        written = await etcd_client.put(p + "k", b"v")
        assert await cache.wait_for_revision(written.revision, timeout=5) >= written.revision


async def test_lifecycle_misuse_is_a_typed_error(etcd_client, etcd_prefix):
    cache = PrefixCache(etcd_client, etcd_prefix + "m/")
    with pytest.raises(NotStartedError):
        await cache.wait_for_revision(1)
    with pytest.raises(InvalidArgumentError):
        PrefixCache(etcd_client, etcd_prefix + "m/", page_size=0)
    with pytest.raises(InvalidArgumentError):
        PrefixCache(etcd_client, etcd_prefix + "m/", start_timeout=0)
    with pytest.raises(InvalidArgumentError):
        PrefixCache(etcd_client, etcd_prefix + "m/", key_filter="x")  # type: ignore[arg-type]
    await cache.aclose()
    with pytest.raises(RecipeClosedError):
        await cache.start()


async def test_close_leaves_no_watch_task_stream_or_listener(etcd_client, etcd_prefix):
    p = etcd_prefix + "leak/"
    await etcd_client.put(p + "a", b"1")
    baseline_watches = etcd_client._watch_hub.watcher_count
    baseline_tasks = len(asyncio.all_tasks())
    cache = PrefixCache(etcd_client, p)
    stream = cache.events()
    cache.add_listener(lambda batch: None)
    await cache.start()
    assert etcd_client._watch_hub.watcher_count == baseline_watches + 1
    await cache.aclose()
    assert [b.kind async for b in stream] == [BatchKind.INITIAL]  # then the stream ends
    await eventually(
        lambda: etcd_client._watch_hub.watcher_count == baseline_watches, what="watch gone"
    )
    await eventually(lambda: len(asyncio.all_tasks()) <= baseline_tasks, what="tasks gone")
    assert len(cache) == 0
    ref = cache._batches
    del cache, stream
    gc.collect()
    assert ref.stream_count == 0 and ref.listener_count == 0


async def test_breaking_out_of_the_event_loop_unregisters(etcd_client, etcd_prefix):
    async with PrefixCache(etcd_client, etcd_prefix + "br/") as cache:
        async for batch in cache.events():
            assert batch.kind is BatchKind.INITIAL
            break
        gc.collect()
        assert cache._batches.stream_count == 0


@pytest.fixture
def leg_client(etcd_leg):
    return etcd_leg


async def test_live_and_consistent_on_both_legs(leg_client, etcd_prefix, request):
    """The same cache behaviour directly and through ``etcd grpc-proxy`` -- where progress
    requests go unanswered, so consistent reads fall back to the count proof."""
    p = etcd_prefix + "legs/"
    await leg_client.put(p + "a", b"1")
    cache = PrefixCache(leg_client, p)
    collector = Collector(cache)
    async with cache:
        txn = await leg_client.txn([], [Op.put(p + "b", b"2"), Op.delete(p + "a")])
        assert await cache.get_consistent(p + "b", timeout=10) == b"2"
        assert cache.revision >= txn.revision and p + "a" not in cache
        elsewhere = await leg_client.put(etcd_prefix + "not-cached", b"x")
        assert await cache.wait_for_revision(elsewhere.revision, timeout=10) >= elsewhere.revision
        await eventually(lambda: len(collector.batches) == 2, what="INITIAL and one LIVE batch")
        assert [len(b) for b in collector.batches] == [1, 2]
        assert replay(collector.batches) == cache_state(cache)
    await collector.stop()
    assert request.node.callspec.params["etcd_leg"] in ("direct", "grpc-proxy")


async def test_the_unchanged_proof_sees_every_kind_of_change(etcd_client, etcd_prefix):
    """The fallback of consistent reads (no progress answers, as through grpc-proxy): no key
    modified after the cache's revision and as many keys as it counts."""
    from etcd_recipes._core.keys import prefix_range_end
    from etcd_recipes.caches._reads import unchanged_since

    key = (etcd_prefix + "proof/").encode()
    end = prefix_range_end(key)
    await etcd_client.put(key + b"a", b"1")
    seen = (await etcd_client.put(key + b"b", b"1")).revision
    head = (await etcd_client.put(etcd_prefix + "outside", b"x")).revision
    assert await unchanged_since(etcd_client, key, end, seen, 2) == head
    assert await unchanged_since(etcd_client, key, end, seen, 3) is None  # count differs
    changed = (await etcd_client.put(key + b"a", b"2")).revision  # same count, a newer key
    assert await unchanged_since(etcd_client, key, end, seen, 2) is None
    gone = (await etcd_client.delete(key + b"b")).revision  # only a delete: the count shows it
    assert await unchanged_since(etcd_client, key, end, changed, 2) is None
    assert await unchanged_since(etcd_client, key, end, gone, 1) is not None


async def test_a_failing_index_function_is_recorded_and_the_cache_goes_on(etcd_client, etcd_prefix):
    p = etcd_prefix + "ix/"
    await etcd_client.put(p + "a", b"1")
    async with PrefixCache(etcd_client, p) as cache:
        cache.add_index("broken", lambda key, value: {"unhashable": value}[key])
        written = await etcd_client.put(p + "b", b"2")
        await cache.wait_for_revision(written.revision)
        assert cache.get(p + "b") == b"2" and cache.is_synced
        assert cache.by_index("broken", "anything") == []
        assert sum("index" in b.context for b in cache.exceptions) == 2
