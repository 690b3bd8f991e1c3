"""PrefixCache under faults: the server down at start (CURATOR-328), restarts, a compaction
while disconnected (the resync reports the difference; CURATOR-391 delete+recreate), a
restore onto another server, and cancellation of a start that cannot finish."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    BatchKind,
    CacheEventType,
    ConnectionState,
    EtcdTimeoutError,
    PrefixCache,
    connect,
)
from etcd_recipes.testing import EtcdServer, TcpProxy
from tests.helpers import eventually

from .helpers import Collector, cache_state, check_order, replay, server_state

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


@pytest.mark.slow
async def test_server_down_at_start_raises_after_the_deadline_then_a_retry_works(
    fresh_etcd_server,
):
    """CURATOR-328: a cache must never "start" empty because the server was down."""
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        await client.put("/cfg/a", b"1")
        server.kill()
        cache = PrefixCache(client, "/cfg/", start_timeout=1.5)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(EtcdTimeoutError) as info:
            await cache.start()
        assert 1.0 <= loop.time() - t0 < 10
        assert "could not load" in str(info.value) and info.value.__cause__ is not None
        assert not cache.is_started and len(cache) == 0
        server.restart()
        await cache.start()  # the same instance starts once the server is back
        assert cache.get("/cfg/a") == b"1" and cache.is_synced
        await cache.aclose()


@pytest.mark.slow
async def test_restart_resumes_without_gaps_or_duplicates(fresh_etcd_server):
    server = fresh_etcd_server
    async with (
        connect(**server.client_kwargs(), **FAST) as client,
        PrefixCache(client, "/r/") as cache,
    ):
        collector = Collector(cache)
        states: list[ConnectionState] = []
        cache.add_connection_state_listener(lambda new, old: states.append(new))
        for i in range(5):
            await client.put(f"/r/{i}", str(i))
        server.restart()
        for i in range(5, 10):
            await client.put(f"/r/{i}", str(i))
        await client.delete("/r/0")
        head = await client.put("/r/last", b"x")
        await cache.wait_for_revision(head.revision, timeout=20)
        assert cache_state(cache) == await server_state(client, "/r/")
        check_order(collector.batches)
        assert replay(collector.batches) == cache_state(cache)
        assert BatchKind.RESYNCING not in collector.kinds()  # a restart needs no re-read
        await eventually(lambda: ConnectionState.RECONNECTED in states, what="RECONNECTED")
        assert cache.is_synced
        await collector.stop()


async def _disconnected_changes(server, change):
    """A cache behind a proxy; the proxy blackholes; ``change(direct)`` runs and history is
    compacted; the proxy comes back. Returns (collector batches, cache state, server state)."""
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            for key, value in (("keep", "1"), ("edit", "1"), ("drop", "1"), ("again", "1")):
                await direct.put(f"/d/{key}", value)
            cache = PrefixCache(through, "/d/")
            collector = Collector(cache)
            await cache.start()
            proxy.blackhole()
            await eventually(lambda: not cache.is_synced, timeout=8, what="the cache to notice")
            await change(direct)
            head = (await direct.status()).revision
            await direct.compact(head)
            proxy.restore()
            await eventually(lambda: cache.resync_count == 1, timeout=15, what="a resync")
            await cache.wait_for_revision(head, timeout=10)
            result = (
                list(collector.batches),
                cache_state(cache),
                await server_state(direct, "/d/"),
            )
            await collector.stop()
            await cache.aclose()
            return result
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_compaction_while_disconnected_reports_the_difference(fresh_etcd_server):
    async def change(direct) -> None:
        await direct.put("/d/edit", "2")
        await direct.delete("/d/drop")
        await direct.put("/d/new", "1")
        await direct.delete("/d/again")  # CURATOR-391: deleted and created again ...
        await direct.put("/d/again", "1")  # ... with the same value and version 1

    batches, cached, on_server = await _disconnected_changes(fresh_etcd_server, change)
    assert cached == on_server
    kinds = [b.kind for b in batches]
    start = kinds.index(BatchKind.RESYNCING)
    assert kinds[start : start + 3] == [BatchKind.RESYNCING, BatchKind.RESYNC, BatchKind.RESYNCED]
    diff = batches[start + 1]
    assert all(e.synthetic for e in diff)
    changes = sorted((e.key, e.type.value) for e in diff)
    assert changes == sorted(
        (key, kind.value)
        for key, kind in [
            ("/d/edit", CacheEventType.UPDATED),
            ("/d/drop", CacheEventType.DELETED),
            ("/d/new", CacheEventType.CREATED),
            ("/d/again", CacheEventType.DELETED),
            ("/d/again", CacheEventType.CREATED),
        ]
    )
    again = [e.type for e in diff if e.key == "/d/again"]
    assert again == [CacheEventType.DELETED, CacheEventType.CREATED]  # in that order
    assert all(key != "/d/keep" for key, _ in changes)  # unchanged: no event
    assert replay(batches) == cached
    check_order(batches)


@pytest.mark.slow
async def test_a_resync_with_nothing_changed_reports_no_events(fresh_etcd_server):
    async def change(direct) -> None:
        for _ in range(2):  # history moves on past the cache's revision; the range does not
            await direct.put("/elsewhere", "x")

    batches, cached, on_server = await _disconnected_changes(fresh_etcd_server, change)
    assert cached == on_server
    kinds = [b.kind for b in batches]
    assert BatchKind.RESYNC not in kinds  # no difference, no batch
    assert kinds.count(BatchKind.RESYNCING) == kinds.count(BatchKind.RESYNCED) == 1


@pytest.mark.slow
async def test_a_restore_onto_another_server_is_detected_and_resynced(fresh_etcd_server):
    """The server behind the address changes (a restore from a backup makes a new cluster id
    and usually an older revision): the cache re-reads instead of waiting for revisions the
    new server may never reach."""
    old = fresh_etcd_server
    with EtcdServer() as new:
        async with connect(**new.client_kwargs()) as restored_client:
            await restored_client.put("/x/only-in-backup", b"b")
        proxy = TcpProxy.for_endpoint(old.endpoint).start()
        try:
            async with (
                connect(**old.client_kwargs()) as direct,
                connect(proxy.url, **FAST) as through,
            ):
                for i in range(20):  # the old server is ahead of the new one
                    await direct.put(f"/x/{i}", b"old")
                async with PrefixCache(through, "/x/") as cache:
                    assert len(cache) == 20
                    collector = Collector(cache)
                    proxy.retarget(new.endpoint)
                    await eventually(lambda: cache.resync_count == 1, timeout=15, what="resync")
                    await eventually(lambda: cache.is_synced, timeout=5, what="synced")
                    assert cache_state(cache) == {"/x/only-in-backup": b"b"}
                    later = await through.put("/x/later", b"new")
                    await cache.wait_for_revision(later.revision, timeout=10)
                    assert cache.get("/x/later") == b"new"
                    await eventually(
                        lambda: replay(collector.batches) == cache_state(cache),
                        what="the collector to catch up",
                    )
                    await collector.stop()
        finally:
            proxy.stop()


@pytest.mark.slow
async def test_cancelled_start_leaves_no_watch_or_task(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), keepalive_time=60, keepalive_timeout=20) as c:
        await c.put("/s/a", b"1")
        watches = c._watch_hub.watcher_count
        cache = PrefixCache(c, "/s/")
        server.pause()
        try:
            starting = asyncio.create_task(cache.start())
            await asyncio.sleep(0.5)
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(starting, 5)
        finally:
            server.resume()
        assert not cache.is_started and c._watch_hub.watcher_count == watches
        assert not cache._tasks
        await cache.start()  # and it can start afterwards
        assert cache.get("/s/a") == b"1"
        await cache.aclose()
        await eventually(lambda: c._watch_hub.watcher_count == watches, what="watch gone")
