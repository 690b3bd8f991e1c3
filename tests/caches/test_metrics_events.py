"""The caches' metrics SPI v2 events against a real etcd: ``cache_synced`` for the initial
load and each resync (after a compaction too), ``cache_size_changed`` for every change of the
entry count and ``-size`` at close, so the deltas always sum to the cache's size."""

from __future__ import annotations

import pytest

from etcd_recipes import NodeCache, PathChildrenCache, PrefixCache, ResilienceConfig, connect
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually
from tests.queues.metrics_sink import EventSink

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


def _cache_events(sink: EventSink) -> list[tuple[object, ...]]:
    return [c for c in sink.flush() if c[0] in ("cache_synced", "cache_size_changed")]


def _size(sink: EventSink) -> int:
    return sum(int(str(c[2])) for c in sink.of("cache_size_changed"))


async def test_initial_load_changes_rebuild_and_close(metered, etcd_prefix):
    client, sink = metered
    root = etcd_prefix + "cfg/"
    await client.put(root + "a", b"1")
    await client.put(root + "b", b"2")
    recipe = "PrefixCache"
    async with PrefixCache(client, root, metrics_name="config") as cache:
        assert _cache_events(sink) == [
            ("cache_synced", recipe, "config", "initial", 2),
            ("cache_size_changed", recipe, "config", 2),
        ]
        await client.put(root + "c", b"3")  # +1
        await client.put(root + "a", b"changed")  # same count: no event
        written = await client.delete(root + "b")  # -1
        await cache.wait_for_revision(written.revision)
        assert len(cache) == 2 and _size(sink) == 2
        await client.put(root + "d", b"4")
        revision = await cache.rebuild()  # a re-read: "resync"
        await cache.wait_for_revision(revision)
        size = len(cache)
    assert size == 3
    events = _cache_events(sink)
    assert events[2:4] == [
        ("cache_size_changed", recipe, "config", 1),
        ("cache_size_changed", recipe, "config", -1),
    ]
    # d arrived by the watch or by the re-read, whichever came first; either way once.
    tail = [e for e in events[4:] if e[0] == "cache_size_changed"]
    assert [e[3] for e in tail] == [1, -3]
    assert [e for e in events if e[0] == "cache_synced"][1:] == [
        ("cache_synced", recipe, "config", "resync", 3)
    ]
    assert events[-1] == ("cache_size_changed", recipe, "config", -3)  # close forgets it
    assert _size(sink) == 0


async def test_layered_caches_report_as_themselves(metered, etcd_prefix):
    client, sink = metered
    await client.put(etcd_prefix + "workers/a", b"idle")
    await client.put(etcd_prefix + "flag", b"on")
    async with (
        PathChildrenCache(client, etcd_prefix + "workers", metrics_name="workers"),
        NodeCache(client, etcd_prefix + "flag", metrics_name="flag"),
    ):
        pass
    assert _cache_events(sink) == [
        ("cache_synced", "PathChildrenCache", "workers", "initial", 1),
        ("cache_size_changed", "PathChildrenCache", "workers", 1),
        ("cache_synced", "NodeCache", "flag", "initial", 1),
        ("cache_size_changed", "NodeCache", "flag", 1),
        ("cache_size_changed", "NodeCache", "flag", -1),
        ("cache_size_changed", "PathChildrenCache", "workers", -1),
    ]


async def test_an_empty_cache_reports_its_load_and_no_size(metered, etcd_prefix):
    client, sink = metered
    async with PrefixCache(client, etcd_prefix + "none/"):
        pass
    assert _cache_events(sink) == [("cache_synced", "PrefixCache", "", "initial", 0)]


@pytest.mark.slow
async def test_resync_after_a_compaction(fresh_etcd_server):
    server = fresh_etcd_server
    sink = EventSink()
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, resilience=ResilienceConfig(metrics=sink), **FAST) as through,
        ):
            for key in ("keep", "drop"):
                await direct.put(f"/d/{key}", b"1")
            cache = PrefixCache(through, "/d/", metrics_name="d")
            await cache.start()
            proxy.blackhole()
            await eventually(lambda: not cache.is_synced, timeout=8, what="the cache to notice")
            await direct.delete("/d/drop")
            for key in ("new1", "new2"):
                await direct.put(f"/d/{key}", b"1")
            head = (await direct.status()).revision
            await direct.compact(head)
            proxy.restore()
            await eventually(lambda: cache.resync_count == 1, timeout=15, what="a resync")
            await cache.wait_for_revision(head, timeout=10)
            assert len(cache) == 3
            await cache.aclose()
    finally:
        proxy.stop()
    assert _cache_events(sink) == [
        ("cache_synced", "PrefixCache", "d", "initial", 2),
        ("cache_size_changed", "PrefixCache", "d", 2),
        ("cache_size_changed", "PrefixCache", "d", 1),  # -drop +new1 +new2, found by the re-read
        ("cache_synced", "PrefixCache", "d", "resync", 3),
        ("cache_size_changed", "PrefixCache", "d", -3),
    ]
