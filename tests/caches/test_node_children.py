"""NodeCache and PathChildrenCache: the reference's names and events over PrefixCache."""

from __future__ import annotations

import pytest

from etcd_recipes import (
    JSON,
    NodeCache,
    NodeCacheEventType,
    PathChildrenCache,
    PathChildrenCacheEventType,
    StartMode,
)
from tests.helpers import eventually


async def _take(stream, n: int) -> list:
    return [await anext(stream) for _ in range(n)]


async def test_node_cache_events_are_relative_to_the_cache(etcd_client, etcd_prefix):
    key = etcd_prefix + "flag"
    await etcd_client.put(key, b"off")
    cache = NodeCache(etcd_client, key)
    events = cache.events()
    async with cache:
        assert cache.current == b"off" and cache.current_entry.version == 1
        await etcd_client.put(key, b"on")  # existed at start: UPDATED, not CREATED
        await etcd_client.delete(key)
        await etcd_client.put(key, b"back")
        await etcd_client.put(key + "/child", b"not watched")
        updated, deleted, created = await _take(events, 3)
        assert (updated.type, updated.value) == (NodeCacheEventType.UPDATED, b"on")
        assert (deleted.type, deleted.value) == (NodeCacheEventType.DELETED, None)
        assert (created.type, created.value) == (NodeCacheEventType.CREATED, b"back")
        assert updated.revision < deleted.revision < created.revision
        assert not any(e.synthetic for e in (updated, deleted, created))
        assert cache.current == b"back" and "mod_revision" in repr(cache)
    assert cache.is_closed


async def test_node_cache_of_a_missing_key_typed(etcd_client, etcd_prefix):
    key = etcd_prefix + "cfg.json"
    cache = NodeCache(etcd_client, key, codec=JSON)
    async with cache:
        assert cache.current is None and cache.current_entry is None
        seen: list = []
        cache.add_listener(seen.append)
        written = await etcd_client.put(key, b'{"retries": 3}')
        await cache.wait_for_revision(written.revision)
        assert cache.current == {"retries": 3}
        await eventually(lambda: len(seen) == 1, what="the listener")
        assert seen[0].type is NodeCacheEventType.CREATED and seen[0].value == {"retries": 3}


@pytest.mark.parametrize("path_suffix", ["", "/"])
async def test_children_are_named_relative_to_one_trailing_slash(
    etcd_client, etcd_prefix, path_suffix
):
    path = etcd_prefix + "svc"
    await etcd_client.put(path + "/a", b"1")
    await etcd_client.put(path + "/b/nested", b"2")
    await etcd_client.put(path + "x/not-a-child", b"3")
    cache = PathChildrenCache(etcd_client, path + path_suffix)
    async with cache:
        assert cache.trailing_path == path + "/"
        assert [c.name for c in cache.current_data] == ["a", "b/nested"]
        assert cache.current_data_as_map == {"a": b"1", "b/nested": b"2"}
        assert cache.get_current_data("b/nested") == b"2"
        assert cache.get_current_data("missing") is None
        assert "children=2" in repr(cache)


async def test_children_events_and_initialized_with_initial_data(etcd_client, etcd_prefix):
    path = etcd_prefix + "workers"
    await etcd_client.put(path + "/a", b"idle")
    cache = PathChildrenCache(etcd_client, path, codec=None)
    events = cache.events()
    await cache.start(StartMode.POST_INITIALIZED_EVENT)
    try:
        (initialized,) = await _take(events, 1)
        assert initialized.type is PathChildrenCacheEventType.INITIALIZED
        assert [(c.name, c.key, c.value) for c in initialized.initial_data] == [
            ("a", path + "/a", b"idle")
        ]
        await etcd_client.put(path + "/b", b"busy")
        await etcd_client.put(path + "/a", b"busy")
        await etcd_client.delete(path + "/b")
        added, updated, removed = await _take(events, 3)
        assert (added.type, added.child_name, added.data) == (
            PathChildrenCacheEventType.CHILD_ADDED,
            "b",
            b"busy",
        )
        assert (updated.type, updated.child_name) == (
            PathChildrenCacheEventType.CHILD_UPDATED,
            "a",
        )
        # CHILD_REMOVED carries the value the cache held.
        assert (removed.type, removed.child_name, removed.data) == (
            PathChildrenCacheEventType.CHILD_REMOVED,
            "b",
            b"busy",
        )
        assert cache.mode is StartMode.POST_INITIALIZED_EVENT
    finally:
        await cache.aclose()


async def test_initialized_is_sent_for_an_empty_path_too(etcd_client, etcd_prefix):
    """CURATOR-4: INITIALIZED must fire whatever happened during the load."""
    second = PathChildrenCache(etcd_client, etcd_prefix + "empty")
    events = second.events()
    await second.start(StartMode.POST_INITIALIZED_EVENT)
    (initialized,) = await _take(events, 1)
    assert initialized.type is PathChildrenCacheEventType.INITIALIZED
    assert initialized.initial_data == ()
    await second.aclose()


async def test_normal_mode_sends_no_events_for_existing_children(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    await etcd_client.put(path + "/old", b"1")
    cache = PathChildrenCache(etcd_client, path)
    events = cache.events()
    async with cache:  # NORMAL
        assert cache.current_data_as_map == {"old": b"1"}  # visible (the reference hid it)
        await etcd_client.put(path + "/old", b"2")
        (event,) = await _take(events, 1)
        assert event.type is PathChildrenCacheEventType.CHILD_UPDATED  # not ADDED
    with pytest.raises(TypeError):
        await PathChildrenCache(etcd_client, path).start("NORMAL")  # type: ignore[arg-type]


async def test_rebuild_reports_nothing_when_nothing_changed(etcd_client, etcd_prefix):
    path = etcd_prefix + "rb"
    await etcd_client.put(path + "/a", b"1")
    cache = PathChildrenCache(etcd_client, path)
    events = cache.events()
    async with cache:
        await cache.rebuild()
        await etcd_client.put(path + "/a", b"2")
        (event,) = await _take(events, 1)
        assert event.type is PathChildrenCacheEventType.CHILD_UPDATED and not event.synthetic
