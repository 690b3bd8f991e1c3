"""SharedValue's watch recovery: a change made while the recipe was cut off from etcd (a
proxy blackholed, a server restarted) is still reported, with the recovery events; after a
compaction of the history it needs, the key is re-read and the value found reported, with a
``WatchResynced``."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    UTF8,
    ConnectionState,
    ResilienceConfig,
    SharedValue,
    Versioned,
    WatchFailed,
    WatchFailedError,
    WatchResilience,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


class _Seen:
    """Consumes a SharedValue's change and recovery streams in the background."""

    def __init__(self, shared: SharedValue[str]) -> None:
        self.values: list[Versioned[str]] = []
        self.recoveries: list[object] = []
        self._tasks = [
            asyncio.ensure_future(self._drain(shared.changes(), self.values)),
            asyncio.ensure_future(self._drain(shared.recovery_events(), self.recoveries)),
        ]

    @staticmethod
    async def _drain(stream, into: list) -> None:
        async for item in stream:
            into.append(item)

    def kinds(self) -> list[type]:
        return [type(r) for r in self.recoveries]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@pytest.mark.slow
async def test_a_restart_loses_no_change_and_reports_the_recovery(fresh_etcd_server):
    server = fresh_etcd_server
    async with (
        connect(**server.client_kwargs(), **FAST) as client,
        SharedValue(client, "/sv/mode", "blue", codec=UTF8) as shared,
    ):
        seen = _Seen(shared)
        await eventually(lambda: len(seen.values) == 1, what="the current value")
        await shared.set("green")
        server.restart()
        async with connect(**server.client_kwargs()) as other:
            written = await other.put("/sv/mode", "red")  # before the watch is back, likely
        await eventually(lambda: seen.values[-1].version == written.revision, timeout=20,
                         what="the change made across the restart")  # fmt: skip
        assert [v.value for v in seen.values] == ["blue", "green", "red"]  # each once, in order
        await eventually(lambda: WatchResubscribed in seen.kinds(), what="a resubscribe")
        assert seen.kinds().index(WatchSuspended) < seen.kinds().index(WatchResubscribed)
        assert WatchResynced not in seen.kinds()  # a restart needs no re-read
        assert shared.connection_state is ConnectionState.RECONNECTED
        assert shared.current == await shared.get()
        await seen.stop()


async def _cut_off(server, change, *, compact: bool):
    """A SharedValue behind a proxy; the proxy blackholes; ``change(direct)`` runs (and the
    history is compacted); the proxy comes back. Returns what was seen and etcd's value."""
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            shared = SharedValue(through, "/sv/v", "a", codec=UTF8)
            await shared.start()
            seen = _Seen(shared)
            await eventually(lambda: len(seen.values) == 1, what="the current value")
            proxy.blackhole()
            await eventually(lambda: WatchSuspended in seen.kinds(), timeout=10,
                             what="the watch to notice")  # fmt: skip
            await change(direct)
            head = (await direct.status()).revision
            if compact:
                await direct.compact(head)
            proxy.restore()
            final = await direct.get("/sv/v")
            await eventually(lambda: seen.values[-1].version == final.mod_revision, timeout=20,
                             what="the change made while cut off")  # fmt: skip
            await eventually(lambda: WatchResubscribed in seen.kinds() or WatchResynced in
                             seen.kinds(), what="the recovery event")  # fmt: skip
            state = shared.connection_state
            await seen.stop()
            await shared.aclose()
            return seen, final, state
    finally:
        proxy.stop()


async def _edits(direct) -> None:
    for value in ("b", "c", "d"):
        await direct.put("/sv/v", value)


@pytest.mark.slow
async def test_changes_made_while_cut_off_are_replayed_in_order(fresh_etcd_server):
    seen, final, state = await _cut_off(fresh_etcd_server, _edits, compact=False)
    assert [v.value for v in seen.values] == ["a", "b", "c", "d"]  # every one, once
    assert final.value == b"d" and WatchResynced not in seen.kinds()
    assert state is ConnectionState.RECONNECTED


@pytest.mark.slow
async def test_a_compaction_while_cut_off_re_reads_and_says_so(fresh_etcd_server):
    seen, final, state = await _cut_off(fresh_etcd_server, _edits, compact=True)
    assert seen.values[0].value == "a" and seen.values[-1].value == "d"  # the value now
    assert [v.value for v in seen.values] == ["a", "d"]  # b and c were compacted away
    assert WatchResynced in seen.kinds()  # ... and the recovery stream says so
    (resynced,) = [r for r in seen.recoveries if isinstance(r, WatchResynced)]
    assert resynced.compact_revision >= final.mod_revision
    assert state is ConnectionState.RECONNECTED


@pytest.mark.slow
async def test_a_delete_during_a_compacted_gap_reads_as_the_seed(fresh_etcd_server):
    async def delete(direct) -> None:
        await direct.put("/sv/v", "b")
        await direct.delete("/sv/v")
        await direct.put("/sv/elsewhere", "x")  # the head moves past the delete

    server = fresh_etcd_server
    tcp = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(tcp.url, **FAST) as through,
            SharedValue(through, "/sv/v", "a", codec=UTF8) as shared,
        ):
            seen = _Seen(shared)
            await eventually(lambda: len(seen.values) == 1, what="the current value")
            tcp.blackhole()
            await eventually(lambda: WatchSuspended in seen.kinds(), timeout=10,
                             what="the watch to notice")  # fmt: skip
            await delete(direct)
            await direct.compact((await direct.status()).revision)
            tcp.restore()
            await eventually(lambda: WatchResynced in seen.kinds(), timeout=20,
                             what="the resync")  # fmt: skip
            await eventually(lambda: seen.values[-1] == Versioned("a", 0), what="the seed")
            assert shared.current == await shared.get() == Versioned("a", 0)
            await seen.stop()
    finally:
        tcp.stop()


@pytest.mark.slow
async def test_a_watch_that_gives_up_ends_the_changes_with_an_error(fresh_etcd_server):
    server = fresh_etcd_server
    config = ResilienceConfig(watch=WatchResilience.disabled())
    async with (
        connect(**server.client_kwargs(), resilience=config, **FAST) as client,
        SharedValue(client, "/sv/v", "a", codec=UTF8) as shared,
    ):
        changes, recoveries = shared.changes(), shared.recovery_events()
        assert (await anext(changes)).value == "a"
        server.kill()
        with pytest.raises(WatchFailedError):
            await asyncio.wait_for(anext(changes), 20)
        kinds: list[type] = []
        while WatchFailed not in kinds:
            kinds.append(type(await asyncio.wait_for(anext(recoveries), 5)))
        assert kinds == [WatchSuspended, WatchFailed]  # it tried once, then gave up
        assert shared.connection_state is ConnectionState.LOST
        assert any(isinstance(b.exception, WatchFailedError) for b in shared.exceptions)
        server.restart()
        assert (await shared.get()).value == "a"  # reads and writes still work
        late = shared.changes()  # a new stream: the last value seen, then the error
        assert (await anext(late)).value == "a"
        with pytest.raises(WatchFailedError):
            await anext(late)
