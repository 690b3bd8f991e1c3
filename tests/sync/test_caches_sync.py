"""The caches through the blocking facade: reads from a thread, events iterated from a
thread while another thread writes, typed values, NodeCache and PathChildrenCache."""

from __future__ import annotations

import threading
from typing import Any

from etcd_recipes.sync import (
    JSON,
    BatchKind,
    CacheEventType,
    EtcdClient,
    NodeCache,
    PathChildrenCache,
    PathChildrenCacheEventType,
    PrefixCache,
    StartMode,
)


def test_reads_and_a_for_loop_over_the_events(client: EtcdClient, etcd_prefix: str) -> None:
    p = etcd_prefix + "cfg/"
    client.put(p + "a", b'{"n": 1}')
    with PrefixCache(client, p, codec=JSON) as cache:
        assert cache.get(p + "a") == {"n": 1} and len(cache) == 1 and p + "a" in cache
        writer = threading.Thread(target=lambda: client.put(p + "b", b'{"n": 2}'))
        seen: list[Any] = []
        with cache.events() as batches:
            writer.start()
            for batch in batches:
                seen.append(batch)
                if batch.kind is BatchKind.LIVE:
                    break
        writer.join()
        assert [b.kind for b in seen] == [BatchKind.INITIAL, BatchKind.LIVE]
        (event,) = seen[1]
        assert event.type is CacheEventType.CREATED and event.value == {"n": 2}
        cache.add_index("n", lambda key, value: value["n"])
        assert cache.by_index("n", 2) == [(p + "b", {"n": 2})]
        assert cache.get_consistent(p + "b") == {"n": 2}


def test_listeners_run_off_the_loop_thread(client: EtcdClient, etcd_prefix: str) -> None:
    p = etcd_prefix + "l/"
    threads: list[str] = []
    arrived = threading.Event()

    def listener(batch: Any) -> None:
        threads.append(threading.current_thread().name)
        if batch.kind is BatchKind.LIVE:
            arrived.set()

    with PrefixCache(client, p) as cache:
        cache.add_listener(listener)
        client.put(p + "k", b"v")
        assert arrived.wait(10)
    loop_thread = client._rt.loop_thread.name
    assert threads and loop_thread not in threads


def test_node_and_path_children_caches(client: EtcdClient, etcd_prefix: str) -> None:
    key = etcd_prefix + "flag"
    client.put(key, b"off")
    with NodeCache(client, key) as node:
        assert node.current == b"off"
        events = node.events()
        client.put(key, b"on")
        assert next(events).value == b"on"
        events.close()
    path = etcd_prefix + "workers"
    client.put(path + "/a", b"idle")
    children = PathChildrenCache(client, path)
    events = children.events()
    children.start(StartMode.POST_INITIALIZED_EVENT)
    try:
        initialized = next(events)
        assert initialized.type is PathChildrenCacheEventType.INITIALIZED
        assert children.current_data_as_map == {"a": b"idle"}
    finally:
        children.close()
