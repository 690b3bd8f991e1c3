"""``recovery_events()`` on every cache (PrefixCache, NodeCache, PathChildrenCache,
ServiceCache): the same stream, of the same types, from each. A change made while the cache
was cut off (a restart, a blackholed connection) is delivered after the recovery, which the
stream reports (``WatchSuspended`` then ``WatchResubscribed``); after a compaction of the
history it needed, the stream reports ``WatchResynced`` and the change comes from the re-read
(as a synthetic event)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from etcd_recipes import (
    UTF8,
    ConnectionState,
    NodeCache,
    PathChildrenCache,
    PrefixCache,
    ServiceCache,
    ServiceInstance,
    ServiceRegistry,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}
_INSTANCE_ID = "abc1234"


@dataclass
class Kind:
    """How to build one kind of cache, change what it holds, and read what it shows."""

    make: Callable[[Any], Any]
    change: Callable[[Any, int], Awaitable[None]]
    shown: Callable[[Any], Any]
    synthetic: Callable[[Any], list[bool]]  # the ``synthetic`` flags of what it reported


async def _put(client: Any, n: int) -> None:
    await client.put("/c/k", str(n))


async def _put_instance(client: Any, n: int) -> None:
    instance = ServiceInstance("api", "", port=8000 + n)
    instance = ServiceInstance.from_json(
        instance.to_json().replace(instance.id.encode(), _INSTANCE_ID.encode())
    )
    await client.put(ServiceRegistry(client, "/svc").key_of(instance), instance.to_json())


def _prefix_flags(events: list[Any]) -> list[bool]:
    return [e.synthetic for batch in events for e in batch]


KINDS = {
    "PrefixCache": Kind(
        lambda c: PrefixCache(c, "/c/", codec=UTF8),
        _put,
        lambda cache: cache.get("/c/k"),
        _prefix_flags,
    ),
    "NodeCache": Kind(
        lambda c: NodeCache(c, "/c/k", codec=UTF8),
        _put,
        lambda cache: cache.current,
        lambda events: [e.synthetic for e in events],
    ),
    "PathChildrenCache": Kind(
        lambda c: PathChildrenCache(c, "/c", codec=UTF8),
        _put,
        lambda cache: cache.get_current_data("k"),
        lambda events: [e.synthetic for e in events],
    ),
    "ServiceCache": Kind(
        lambda c: ServiceCache(c, "/svc", "api"),
        _put_instance,
        lambda cache: (i := cache.get(_INSTANCE_ID)) and str(i.port - 8000),
        _prefix_flags,
    ),
}


class _Drain:
    """Collects a cache's recovery events and its own events in the background."""

    def __init__(self, cache: Any) -> None:
        self.recoveries: list[Any] = []
        self.events: list[Any] = []
        self._tasks = [
            asyncio.ensure_future(self._run(cache.recovery_events(), self.recoveries)),
            asyncio.ensure_future(self._run(cache.events(), self.events)),
        ]

    @staticmethod
    async def _run(stream: Any, into: list[Any]) -> None:
        async for item in stream:
            into.append(item)

    def kinds(self) -> list[type]:
        return [type(r) for r in self.recoveries]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KINDS))
async def test_a_restart_is_reported_and_loses_no_change(fresh_etcd_server, name):
    kind, server = KINDS[name], fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        await kind.change(client, 1)
        async with kind.make(client) as cache:
            drain = _Drain(cache)
            assert kind.shown(cache) == "1"
            server.restart()
            await kind.change(client, 2)  # while the cache's watch is still down, likely
            await eventually(lambda: kind.shown(cache) == "2", timeout=20, what="the change")
            await eventually(lambda: WatchResubscribed in drain.kinds(), what="a resubscribe")
            kinds = drain.kinds()
            assert kinds.index(WatchSuspended) < kinds.index(WatchResubscribed)
            assert WatchResynced not in kinds  # a restart needs no re-read
            assert cache.connection_state is ConnectionState.RECONNECTED
            assert not any(kind.synthetic(drain.events))  # replayed, not re-read
            await drain.stop()


@pytest.mark.slow
@pytest.mark.parametrize("compact", [False, True], ids=["replayed", "compacted"])
@pytest.mark.parametrize("name", sorted(KINDS))
async def test_a_change_made_while_cut_off_is_delivered_with_the_recovery(
    fresh_etcd_server, name, compact
):
    kind, server = KINDS[name], fresh_etcd_server
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            await kind.change(direct, 1)
            async with kind.make(through) as cache:
                drain = _Drain(cache)
                proxy.blackhole()
                await eventually(lambda: WatchSuspended in drain.kinds(), timeout=10,
                                 what="the watch to notice")  # fmt: skip
                await kind.change(direct, 2)
                if compact:
                    await direct.compact((await direct.status()).revision)
                proxy.restore()
                await eventually(lambda: kind.shown(cache) == "2", timeout=20, what="the change")
                want = WatchResynced if compact else WatchResubscribed
                await eventually(lambda: want in drain.kinds(), what=want.__name__)
                flags = kind.synthetic(drain.events)
                assert any(flags) is compact  # from the re-read only after a compaction
                await drain.stop()
    finally:
        proxy.stop()


@pytest.mark.slow
def test_the_blocking_twins_iterate_the_recoveries_in_a_thread(fresh_etcd_server):
    from etcd_recipes.sync import NodeCache as SyncNodeCache
    from etcd_recipes.sync import connect as sync_connect

    server = fresh_etcd_server
    with sync_connect(**server.client_kwargs(), **FAST) as client:
        client.put("/c/k", "1")
        with SyncNodeCache(client, "/c/k", codec=UTF8) as cache:
            recoveries = cache.recovery_events()
            got: list[type] = []

            def reader() -> None:
                for event in recoveries:
                    got.append(type(event))
                    if isinstance(event, WatchResubscribed):
                        return

            thread = threading.Thread(target=reader)
            thread.start()
            server.restart()
            client.put("/c/k", "2")
            thread.join(30)
            assert not thread.is_alive()
            assert got[0] is WatchSuspended and got[-1] is WatchResubscribed
            cache.wait_for_revision(client.get("/c/k").mod_revision)
            assert cache.current == "2"  # the change made across the restart
