"""The generated recipe twins: inherited ``Recipe`` members, constructors, statics, generics."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pytest

import etcd_recipes
import etcd_recipes.sync
from etcd_recipes.sync import (
    JSON,
    ConnectionState,
    DistributedAtomicLong,
    DistributedBarrier,
    EtcdClient,
    EtcdTimeoutError,
    LeaseEvent,
    Recipe,
    RecipeClosedError,
    TransientKeyValue,
    fail_after,
)
from etcd_recipes.sync._runtime.twin import SyncTwin


def test_sync_package_exports_everything_the_async_package_does() -> None:
    missing = set(etcd_recipes.__all__) - set(etcd_recipes.sync.__all__)
    assert not missing, f"run python -m tools.gen_sync: {sorted(missing)}"
    for name in etcd_recipes.__all__:
        ours, theirs = getattr(etcd_recipes.sync, name), getattr(etcd_recipes, name)
        if isinstance(ours, type) and issubclass(ours, SyncTwin):  # a twin
            assert ours is not theirs
            assert ours.__name__ == theirs.__name__
            assert (ours.__doc__ is None) == (theirs.__doc__ is None)
        elif inspect.isfunction(theirs) and (
            inspect.iscoroutinefunction(theirs) or inspect.isasyncgenfunction(theirs)
        ):
            # A twinned function: a blocking one of the same name, generated.
            assert ours is not theirs, f"{name} is async but not twinned"
            assert not inspect.iscoroutinefunction(ours)
            assert not inspect.isasyncgenfunction(ours)
            assert ours.__name__ == theirs.__name__
        elif inspect.isfunction(theirs) and ours is not theirs:
            # A plain function that returns an async object (naming_registration's context
            # manager): the generator twins it too, in the sync package.
            assert ours.__name__ == theirs.__name__
            assert "/etcd_recipes/sync/" in (inspect.getsourcefile(ours) or ""), name
        elif name != "connect":
            assert ours is theirs, name  # shared, not copied


def test_barrier_through_the_facade(client: EtcdClient, etcd_prefix: str) -> None:
    path = etcd_prefix + "gate"
    states: list[tuple[ConnectionState, ConnectionState]] = []
    with DistributedBarrier(client, path) as setter:
        assert isinstance(setter, Recipe)
        assert setter.start() is setter  # self-typed: the same twin comes back
        setter.add_connection_state_listener(lambda new, old: states.append((new, old)))
        assert setter.set_barrier() is True
        assert setter.set_barrier() is False
        assert setter.is_barrier_set()
        waiter = DistributedBarrier(client, path)
        assert waiter.wait_on_barrier(timeout=0.2) is False
        released: list[bool] = []
        thread = threading.Thread(target=lambda: released.append(waiter.wait_on_barrier()))
        thread.start()
        time.sleep(0.2)
        assert released == []
        assert setter.remove_barrier() is True
        thread.join(10)
        assert released == [True]
        assert setter.is_healthy()
        assert setter.ping() is True
        assert setter.connection_state is ConnectionState.CONNECTED
        assert not setter.has_exceptions
        assert setter.exceptions == []
        assert setter.path == path
        assert setter.client_id.startswith("DistributedBarrier:")
        assert setter.exception_context == f"DistributedBarrier[{path}]"
        assert DistributedBarrier.one_shot is False
        assert setter.lease_ttl == 2
        waiter.close()
    assert setter.is_closed
    with pytest.raises(RecipeClosedError):
        setter.set_barrier()
    assert states == []


def test_cancelled_barrier_wait_leaves_no_watch(client: EtcdClient, etcd_prefix: str) -> None:
    with DistributedBarrier(client, etcd_prefix + "gate") as setter:
        setter.set_barrier()
        waiter = DistributedBarrier(client, etcd_prefix + "gate")

        def watchers() -> int:
            return client._rt.call_sync(lambda: client._a._watch_hub.watcher_count)

        before = watchers()
        with pytest.raises(EtcdTimeoutError), fail_after(0.3):
            waiter.wait_on_barrier()
        assert watchers() == before  # cleaned up before the error reached us


def test_counter_from_many_threads(client: EtcdClient, etcd_prefix: str) -> None:
    path = etcd_prefix + "n"
    results: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        counter = DistributedAtomicLong(client, path)
        for _ in range(10):
            value = counter.increment()
            with lock:
                results.append(value)
        counter.close()

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(1, 51))
    with DistributedAtomicLong(client, path, default=7) as counter:
        assert counter.get() == 50
        assert counter.add(5) == 55
        assert counter.subtract(10) == 45
        assert counter.decrement() == 44
        assert counter.default == 7
    assert DistributedAtomicLong.delete(client, path) is True  # a static method, twinned
    assert DistributedAtomicLong.delete(client, path) is False


def test_transient_key_value_with_codec(client: EtcdClient, etcd_prefix: str) -> None:
    key = etcd_prefix + "svc"
    events: list[LeaseEvent] = []
    presence: TransientKeyValue[dict[str, Any]] = TransientKeyValue(
        client, key, {"port": 8080}, codec=JSON, lease_ttl=2
    )
    presence.add_lease_listener(events.append)
    with presence:
        assert presence.key == key
        assert presence.value == {"port": 8080}
        assert presence.lease_id != 0
        kv = client.get(key)
        assert kv is not None
        assert JSON.decode(kv.value) == {"port": 8080}
        client.lease_revoke(presence.lease_id)  # out of band: it heals
        deadline = time.monotonic() + 10
        while client.get(key) is None or not events:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert client.get(key) is None
    assert events
