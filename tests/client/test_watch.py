"""Watch basics against a real etcd: order and prev_kv, filters, replay from a start revision,
prefix watches, one shared stream, and compaction (raw watch raises, resync hook continues)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import CompactedError, EventType, WatchEvent, WatchResynced, connect


async def _next(watch, timeout: float = 5.0):
    return await asyncio.wait_for(watch.__anext__(), timeout)


async def _collect_events(watch, n: int, timeout: float = 5.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    while len(out) < n:
        item = await _next(watch, timeout)
        assert isinstance(item, WatchEvent), f"unexpected item {item!r}"
        out.append(item)
    return out


async def test_events_in_order_with_prev_kv(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    async with etcd_client.watch(key, prev_kv=True) as watch:
        assert watch.key == key.encode()
        r1 = await etcd_client.put(key, b"1")
        r2 = await etcd_client.put(key, b"2")
        r3 = await etcd_client.delete(key)
        await etcd_client.put(etcd_prefix + "other", b"x")  # not watched
        r4 = await etcd_client.put(key, b"3")
        events = await _collect_events(watch, 4)
    assert [e.type for e in events] == [
        EventType.PUT,
        EventType.PUT,
        EventType.DELETE,
        EventType.PUT,
    ]
    assert [e.revision for e in events] == [r1.revision, r2.revision, r3.revision, r4.revision]
    assert [e.kv.value for e in events] == [b"1", b"2", b"", b"3"]
    assert events[0].prev_kv is None  # created by this put
    assert events[1].prev_kv is not None
    assert events[1].prev_kv.value == b"1"
    assert events[2].prev_kv is not None
    assert events[2].prev_kv.value == b"2"
    assert events[3].prev_kv is None
    assert all(e.kv.key == key.encode() for e in events)
    assert events[1].kv.version == 2
    assert events[3].kv.version == 1
    assert watch.is_closed


async def test_without_prev_kv_none_is_reported(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    async with etcd_client.watch(key) as watch:
        await etcd_client.put(key, b"1")
        await etcd_client.put(key, b"2")
        events = await _collect_events(watch, 2)
    assert [e.prev_kv for e in events] == [None, None]


async def test_filters_no_put_and_no_delete(etcd_client, etcd_prefix):
    p = etcd_prefix
    async with (
        etcd_client.watch(p, prefix=True, no_put=True) as deletes,
        etcd_client.watch(p, prefix=True, no_delete=True) as puts,
    ):
        a = await etcd_client.put(p + "a", b"1")
        b = await etcd_client.put(p + "b", b"2")
        d1 = await etcd_client.delete(p + "a")
        c = await etcd_client.put(p + "c", b"3")
        d2 = await etcd_client.delete(p + "b")
        seen_puts = await _collect_events(puts, 3)
        seen_deletes = await _collect_events(deletes, 2)
        # Nothing else is pending on either watch.
        await etcd_client.put(p + "marker", b"m")
        assert (await _next(puts)).kv.key == (p + "marker").encode()
        d3 = await etcd_client.delete(p + "marker")
        assert (await _next(deletes)).revision == d3.revision
    assert [e.revision for e in seen_puts] == [a.revision, b.revision, c.revision]
    assert all(e.type is EventType.PUT for e in seen_puts)
    assert [e.revision for e in seen_deletes] == [d1.revision, d2.revision]
    assert all(e.type is EventType.DELETE for e in seen_deletes)


async def test_start_revision_replays_history(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    revs = [(await etcd_client.put(key, str(i))).revision for i in range(5)]
    await etcd_client.delete(key)
    # From the third write on: replays 2, 3, 4 and the delete, then goes live.
    async with etcd_client.watch(key, start_revision=revs[2]) as watch:
        replayed = await _collect_events(watch, 4)
        live = await etcd_client.put(key, b"live")
        (after,) = await _collect_events(watch, 1)
    assert [e.revision for e in replayed[:3]] == revs[2:]
    assert [e.kv.value for e in replayed[:3]] == [b"2", b"3", b"4"]
    assert replayed[3].type is EventType.DELETE
    assert after.revision == live.revision
    assert after.kv.value == b"live"
    assert watch.resume_revision == live.revision + 1


async def test_anchor_at_read_revision_plus_one_misses_nothing(etcd_client, etcd_prefix):
    p = etcd_prefix + "jobs/"
    await etcd_client.put(p + "1", b"a")
    snapshot = await etcd_client.range(p, prefix=True)
    # Written between the read and the watch: must be replayed.
    between = await etcd_client.put(p + "2", b"b")
    async with etcd_client.watch(p, prefix=True, start_revision=snapshot.revision + 1) as watch:
        (ev,) = await _collect_events(watch, 1)
    assert ev.revision == between.revision
    assert ev.kv.key == (p + "2").encode()


async def test_prefix_watch_sees_only_the_prefix(etcd_client, etcd_prefix):
    p = etcd_prefix + "dir/"
    async with etcd_client.watch(p, prefix=True) as watch:
        await etcd_client.put(etcd_prefix + "dir", b"no")  # the prefix without the slash
        await etcd_client.put(etcd_prefix + "dir0", b"no")  # just past the range
        await etcd_client.put(p + "a", b"1")
        await etcd_client.put(p + "sub/b", b"2")
        await etcd_client.delete(p, prefix=True)
        events = await _collect_events(watch, 4)
    assert [(e.type, e.kv.key) for e in events] == [
        (EventType.PUT, (p + "a").encode()),
        (EventType.PUT, (p + "sub/b").encode()),
        (EventType.DELETE, (p + "a").encode()),
        (EventType.DELETE, (p + "sub/b").encode()),
    ]
    # The two deletes of one DeleteRange share a revision.
    assert events[2].revision == events[3].revision


async def test_range_watch(etcd_client, etcd_prefix):
    p = etcd_prefix
    async with etcd_client.watch(p + "b", range_end=p + "d") as watch:
        for name in ("a", "b", "c", "d", "bb"):
            await etcd_client.put(p + name, name)
        events = await _collect_events(watch, 3)
    assert [e.kv.key for e in events] == [(p + n).encode() for n in ("b", "c", "bb")]


async def test_many_watches_share_one_stream(etcd_client, etcd_prefix):
    hub = etcd_client._watch_hub
    assert hub.streams_opened == 0
    watches = [etcd_client.watch(etcd_prefix + f"k{i}") for i in range(20)]
    for w in watches:
        await w.start()
    assert hub.watcher_count == 20
    for i in range(20):
        await etcd_client.put(etcd_prefix + f"k{i}", str(i))
    for i, w in enumerate(watches):
        (ev,) = await _collect_events(w, 1)
        assert ev.kv.key == (etcd_prefix + f"k{i}").encode()
        assert ev.kv.value == str(i).encode()
    assert hub.streams_opened == 1
    # Closing some does not disturb the others.
    for w in watches[:10]:
        await w.aclose()
    assert hub.watcher_count == 10
    await etcd_client.put(etcd_prefix + "k15", b"again")
    (ev,) = await _collect_events(watches[15], 1)
    assert ev.kv.value == b"again"
    for w in watches[10:]:
        await w.aclose()
    assert hub.watcher_count == 0
    assert hub.streams_opened == 1


async def test_closed_watch_stops_iteration(etcd_client, etcd_prefix):
    watch = etcd_client.watch(etcd_prefix + "k")
    await watch.start()
    await etcd_client.put(etcd_prefix + "k", b"1")
    assert (await _next(watch)).kv.value == b"1"
    await watch.aclose()
    with pytest.raises(StopAsyncIteration):
        await _next(watch)


# --------------------------------------------------------------------------- compaction


async def _history(client, key: str, n: int) -> list[int]:
    return [(await client.put(key, f"v{i}")).revision for i in range(n)]


async def test_raw_watch_below_compaction_raises(fresh_etcd_server):
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        revs = await _history(client, "/w/k", 6)
        await client.compact(revs[4])
        watch = client.watch("/w/k", start_revision=revs[1])
        async with watch:
            with pytest.raises(CompactedError) as info:
                await _next(watch, timeout=5)
        assert info.value.compact_revision == revs[4]
        assert watch.is_closed
        # The shared stream is unaffected: another watch on it still works.
        async with client.watch("/w/k") as other:
            r = await client.put("/w/k", b"after")
            assert (await _next(other)).revision == r.revision
        assert client._watch_hub.streams_opened == 1
        # A watch from exactly the compaction revision replays from there.
        async with client.watch("/w/k", start_revision=revs[4]) as exact:
            replay = await _collect_events(exact, 3)
        assert [e.revision for e in replay] == [revs[4], revs[5], r.revision]


async def test_watch_below_compaction_with_resync_hook(fresh_etcd_server):
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        revs = await _history(client, "/w/k", 6)
        await client.compact(revs[4])
        calls: list[int] = []

        async def resync() -> int:
            snapshot = await client.get("/w/k")
            assert snapshot is not None
            calls.append(snapshot.mod_revision)
            status = await client.status()
            return status.revision + 1

        async with client.watch("/w/k", start_revision=revs[1], resync=resync) as watch:
            items = watch.items()
            item = await _next(items)
            assert isinstance(item, WatchResynced)
            assert item.key == b"/w/k"
            assert item.compact_revision == revs[4]
            anchor = revs[5] + 1
            assert item.anchor_revision == anchor
            assert calls == [revs[5]]
            live = await client.put("/w/k", b"live")
            ev = await _next(items)
            assert isinstance(ev, WatchEvent)
            assert ev.revision == live.revision
            assert ev.kv.value == b"live"
            assert watch.resume_revision == live.revision + 1
        assert calls == [revs[5]]  # the hook ran exactly once
