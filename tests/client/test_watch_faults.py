"""Watches through real faults: server kill + restart, a TCP reset (proxy cut), a blackholed
connection (keepalive detection), and a compaction that happens while the watcher is cut off.

The watcher must see exactly the writes that were made -- none lost, none duplicated -- with
the recovery events in-band: ``WatchSuspended`` then ``WatchResubscribed`` (or
``WatchResynced`` when the history it needed was compacted)."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from etcd_recipes import (
    CompactedError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdTimeoutError,
    EventType,
    ResilienceConfig,
    RetriesExhaustedError,
    RetryPolicy,
    RpcResilience,
    WatchEvent,
    WatchProgress,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


class Recorder:
    """Consumes a watch in a background task and records every item."""

    def __init__(self, watch) -> None:
        self.watch = watch
        self.items: list = []
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for item in self.watch.items():
                self.items.append(item)
        except Exception as exc:  # recorded for the test to inspect
            self.error = exc

    @property
    def events(self) -> list[WatchEvent]:
        return [i for i in self.items if isinstance(i, WatchEvent)]

    def kinds(self) -> list[type]:
        return [type(i) for i in self.items if not isinstance(i, WatchEvent)]

    def index(self, kind: type) -> int:
        return next(i for i, item in enumerate(self.items) if isinstance(item, kind))

    async def stop(self) -> None:
        await self.watch.aclose()
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


def _assert_exact(recorder: Recorder, revisions: list[int]) -> None:
    seen = [e.revision for e in recorder.events]
    assert seen == revisions, f"watch saw {seen}, writes were {revisions}"


@pytest.mark.slow
async def test_watch_survives_server_kill_and_restart(fresh_etcd_server):
    server = fresh_etcd_server
    async with (
        connect(**server.client_kwargs(), **FAST) as watcher,
        connect(**server.client_kwargs(), **FAST) as writer,
    ):
        base = await writer.put("/r/seed", b"0")
        watch = watcher.watch("/r/", prefix=True, start_revision=base.revision + 1)
        await watch.start()
        rec = Recorder(watch)
        written = [(await writer.put(f"/r/{i}", b"before")).revision for i in range(3)]
        await eventually(lambda: len(rec.events) == 3, what="events before the kill")

        server.kill()
        await eventually(lambda: WatchSuspended in rec.kinds(), timeout=5, what="WatchSuspended")
        server.restart()
        # Write as soon as the server is back (the watcher is still resubscribing).
        for i in range(3, 8):
            while True:
                try:
                    written.append((await writer.put(f"/r/{i}", b"after", timeout=1)).revision)
                    break
                except (EtcdConnectionError, EtcdTimeoutError, RetriesExhaustedError):
                    await asyncio.sleep(0.05)
        written.append((await writer.delete("/r/0")).revision)
        await eventually(lambda: len(rec.events) >= len(written), what="events after restart")
        await asyncio.sleep(0.3)  # let any duplicate arrive
        _assert_exact(rec, written)
        suspended, resubscribed = rec.index(WatchSuspended), rec.index(WatchResubscribed)
        assert 3 <= suspended < resubscribed
        resub = rec.items[resubscribed]
        assert resub.resume_revision == written[2] + 1
        assert rec.error is None
        await rec.stop()


async def test_watch_survives_proxy_cut(etcd_server, etcd_proxy, etcd_client, etcd_prefix):
    p = etcd_prefix
    async with connect(etcd_proxy.url, **FAST) as watcher:
        anchor = await etcd_client.put(p + "seed", b"0")
        watch = watcher.watch(p, prefix=True, start_revision=anchor.revision + 1)
        await watch.start()
        rec = Recorder(watch)
        written = [(await etcd_client.put(p + f"{i}", b"x")).revision for i in range(3)]
        await eventually(lambda: len(rec.events) == 3, what="events before the cut")

        etcd_proxy.cut()
        # Written through the direct client while the watcher reconnects.
        for i in range(3, 10):
            written.append((await etcd_client.put(p + f"{i}", b"y")).revision)
        written.append((await etcd_client.delete(p + "0")).revision)
        await eventually(lambda: len(rec.events) >= len(written), what="events after the cut")
        await asyncio.sleep(0.3)
        _assert_exact(rec, written)
        assert rec.kinds()[:2] == [WatchSuspended, WatchResubscribed]
        suspended, resubscribed = rec.index(WatchSuspended), rec.index(WatchResubscribed)
        assert suspended == 3
        assert resubscribed > suspended
        # Nothing the watcher had already seen is replayed; it resumes right after it.
        assert rec.items[resubscribed].resume_revision == written[2] + 1
        assert watcher._watch_hub.streams_opened >= 2
        await rec.stop()


@pytest.mark.slow
async def test_watch_survives_outage_through_proxy(etcd_proxy, etcd_client, etcd_prefix):
    """A longer outage: connections are reset and new ones get nowhere until restore."""
    p = etcd_prefix
    async with connect(etcd_proxy.url, **FAST) as watcher:
        watch = watcher.watch(p, prefix=True, prev_kv=True)
        await watch.start()
        rec = Recorder(watch)
        written = [(await etcd_client.put(p + "a", b"1")).revision]
        await eventually(lambda: len(rec.events) == 1, what="first event")

        etcd_proxy.blackhole()
        etcd_proxy.cut()
        await eventually(lambda: WatchSuspended in rec.kinds(), timeout=5, what="WatchSuspended")
        for i in range(5):
            written.append((await etcd_client.put(p + "a", str(i + 2))).revision)
        await asyncio.sleep(1.0)
        assert len(rec.events) == 1  # nothing gets through the outage
        etcd_proxy.restore()
        await eventually(
            lambda: len(rec.events) >= len(written), timeout=15, what="events after restore"
        )
        await asyncio.sleep(0.3)
        _assert_exact(rec, written)
        # prev_kv chains correctly across the gap.
        values = [e.kv.value for e in rec.events]
        prevs = [e.prev_kv.value if e.prev_kv else None for e in rec.events]
        assert prevs == [None, *values[:-1]]
        assert rec.index(WatchSuspended) < rec.index(WatchResubscribed)
        await rec.stop()


def _assert_clear_failure(err: BaseException) -> None:
    """A unary failure during a blackhole: a timeout/connection error, or retries exhausted
    with one of those chained."""
    assert isinstance(err, EtcdTimeoutError | EtcdConnectionError | RetriesExhaustedError), err
    if isinstance(err, RetriesExhaustedError):
        assert err.attempts == 2  # bounded(1): the first attempt and one retry
        assert isinstance(err.__cause__, EtcdTimeoutError | EtcdConnectionError), err.__cause__
    assert "get" in str(err)


@pytest.mark.slow
async def test_blackhole_detected_by_keepalive(etcd_proxy, etcd_client, etcd_prefix):
    p = etcd_prefix
    config = ResilienceConfig(rpc=RpcResilience(RetryPolicy.bounded(1, 0.1), 0.5))
    async with connect(etcd_proxy.url, resilience=config, **FAST) as watcher:
        watch = watcher.watch(p + "k")
        await watch.start()
        rec = Recorder(watch)
        first = await etcd_client.put(p + "k", b"1")
        await eventually(lambda: len(rec.events) == 1, what="first event")

        etcd_proxy.blackhole()
        t0 = time.monotonic()
        # A call made at once rides the dead connection: it times out instead of hanging.
        with pytest.raises(EtcdRecipeError) as early:
            await watcher.get(p + "k", timeout=0.5)
        assert time.monotonic() - t0 < 3.0
        _assert_clear_failure(early.value)

        await eventually(lambda: WatchSuspended in rec.kinds(), timeout=8, what="WatchSuspended")
        detected = time.monotonic() - t0
        assert detected < 4.0, f"blackhole detected after {detected:.1f}s"
        cause = rec.items[rec.index(WatchSuspended)].cause
        assert isinstance(cause, EtcdConnectionError | EtcdTimeoutError), cause

        # Once detected, calls fail fast and clearly too.
        t1 = time.monotonic()
        with pytest.raises(EtcdRecipeError) as late:
            await watcher.get(p + "k", timeout=0.5)
        assert time.monotonic() - t1 < 3.0
        _assert_clear_failure(late.value)

        second = await etcd_client.put(p + "k", b"2")
        etcd_proxy.restore()
        await eventually(lambda: len(rec.events) == 2, timeout=10, what="event after restore")
        _assert_exact(rec, [first.revision, second.revision])
        assert WatchResubscribed in rec.kinds()
        assert (await watcher.get(p + "k")).value == b"2"  # type: ignore[union-attr]
        await rec.stop()


async def _compaction_while_disconnected(server, resync):
    """Watcher behind a proxy sees one event, gets blackholed; meanwhile more writes and a
    compaction happen; then the proxy is restored. Returns (recorder, writer-revisions)."""
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as watcher,
        ):
            first = await direct.put("/c/k", b"1")
            watch = watcher.watch("/c/k", start_revision=first.revision, resync=resync)
            await watch.start()
            rec = Recorder(watch)
            await eventually(lambda: len(rec.events) == 1, what="first event")

            proxy.blackhole()
            await eventually(
                lambda: WatchSuspended in rec.kinds(), timeout=8, what="WatchSuspended"
            )
            missed = [(await direct.put("/c/k", str(i))).revision for i in range(2, 6)]
            await direct.compact(missed[-1])
            proxy.restore()
            if resync is None:
                await eventually(lambda: rec.task.done(), timeout=10, what="the watch to end")
            else:
                await eventually(
                    lambda: WatchResynced in rec.kinds(), timeout=10, what="WatchResynced"
                )
                after = await direct.put("/c/k", b"after")
                await eventually(
                    lambda: any(e.revision == after.revision for e in rec.events),
                    timeout=10,
                    what="the event after the resync",
                )
                missed.append(after.revision)
            await rec.stop()
            return rec, first.revision, missed
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_raw_watch_behind_compaction_while_disconnected_raises(fresh_etcd_server):
    rec, first, missed = await _compaction_while_disconnected(fresh_etcd_server, None)
    assert isinstance(rec.error, CompactedError), rec.error
    assert rec.error.compact_revision == missed[-1]
    assert [e.revision for e in rec.events] == [first]  # nothing silently skipped


@pytest.mark.slow
async def test_resync_watch_behind_compaction_while_disconnected(fresh_etcd_server):
    anchors: list[int] = []

    async def resync() -> int:
        async with connect(**fresh_etcd_server.client_kwargs()) as c:
            rev = (await c.status()).revision
        anchors.append(rev + 1)
        return rev + 1

    rec, first, revs = await _compaction_while_disconnected(fresh_etcd_server, resync)
    assert rec.error is None
    resynced = rec.items[rec.index(WatchResynced)]
    compacted_at, after = revs[-2], revs[-1]
    assert resynced.compact_revision == compacted_at
    assert resynced.anchor_revision == anchors[0] == compacted_at + 1
    # Events: the first one, then (after the in-band resync) only the write after the anchor.
    assert [e.revision for e in rec.events] == [first, after]
    assert rec.index(WatchSuspended) < rec.index(WatchResynced)


async def test_progress_request_advances_an_idle_synced_watch(
    ordered_progress, etcd_client, etcd_prefix
):
    async with etcd_client.watch(etcd_prefix + "idle") as watch:
        created_at = watch.resume_revision
        assert created_at > 0  # anchored at "now" once the server confirmed it
        head = 0
        for i in range(5):
            head = (await etcd_client.put(etcd_prefix + f"other{i}", b"x")).revision
        etcd_client.request_progress()
        await eventually(
            lambda: watch.resume_revision == head + 1, timeout=5, what="progress to apply"
        )
        # Nothing was delivered: the other keys are not watched.
        await etcd_client.put(etcd_prefix + "idle", b"now")
        item = await asyncio.wait_for(watch.__anext__(), 5)
        assert isinstance(item, WatchEvent)
        assert item.kv.value == b"now"


async def test_progress_request_does_not_skip_a_replaying_watch(
    ordered_progress, etcd_proxy, etcd_client, etcd_prefix
):
    """A watch replaying history is not yet synced on the server, yet etcd 3.5.1 answers a
    progress request at once with the store's head revision (watch_id -1). If the watch took
    that as its resume point, a reconnect right after would silently skip the backlog."""
    key = etcd_prefix + "k"
    revisions = [(await etcd_client.put(key, str(i))).revision for i in range(200)]
    async with connect(etcd_proxy.url, **FAST) as watcher:
        watch = watcher.watch(key, start_revision=revisions[0])
        await watch.start()
        rec = Recorder(watch)
        watcher.request_progress()
        t0 = time.monotonic()
        while watch.resume_revision == revisions[0] and time.monotonic() - t0 < 0.05:
            await asyncio.sleep(0.001)
        etcd_proxy.cut()  # the stream breaks; the watch resumes from resume_revision
        await eventually(lambda: WatchResubscribed in rec.kinds(), what="resubscription")
        await eventually(
            lambda: len(rec.events) >= len(revisions), timeout=5, what="the whole backlog"
        )
        _assert_exact(rec, revisions)
        await rec.stop()


@pytest.mark.slow
async def test_progress_request_does_not_skip_a_watch_catching_up_in_batches(
    ordered_progress, etcd_proxy, etcd_client, etcd_prefix
):
    """etcd replays history to an unsynced watch in batches of at most 1000 revisions, one
    batch per 100 ms. A watch that has delivered past the head it was created at may still be
    unsynced when writes continued meanwhile; a stream-wide progress reply (the head revision)
    must not move its resume point past events the server has not sent yet."""
    key = etcd_prefix + "k"
    revisions: list[int] = []

    async def write(n: int) -> None:
        for _ in range(n):
            revisions.append((await etcd_client.put(key, b"v")).revision)

    await asyncio.gather(*(write(40) for _ in range(50)))  # a 2000-revision backlog
    revisions.sort()
    head_at_create = (await etcd_client.status()).revision
    async with connect(etcd_proxy.url, **FAST) as watcher:
        watch = watcher.watch(key, start_revision=revisions[0])
        await watch.start()
        rec = Recorder(watch)
        # More writes while the watch replays: the second batch ends past head_at_create
        # but the server still has events pending for it.
        writers = asyncio.gather(*(write(10) for _ in range(50)))
        await eventually(
            lambda: watch.resume_revision > head_at_create, timeout=5, what="replay progress"
        )
        before = watch.resume_revision
        watcher.request_progress()
        t0 = time.monotonic()
        while watch.resume_revision == before and time.monotonic() - t0 < 0.05:
            await asyncio.sleep(0.001)
        etcd_proxy.cut()
        await writers
        revisions.sort()
        await eventually(lambda: WatchResubscribed in rec.kinds(), what="resubscription")
        await eventually(lambda: len(rec.events) >= len(revisions), timeout=5, what="every write")
        await asyncio.sleep(0.2)
        _assert_exact(rec, revisions)
        await rec.stop()


async def test_plain_iteration_yields_only_data_events_across_a_restart(fresh_etcd_server):
    """The documented ``async for event in watch`` loop survives a server restart: recovery
    events go to the recovery listeners and to ``items()``, never into the data loop."""
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        rev = (await client.put("/naive/k", b"0")).revision
        recoveries: list[object] = []
        async with client.watch("/naive/k", start_revision=rev + 1) as watch:
            watch.add_recovery_listener(recoveries.append)
            server.restart()
            await client.put("/naive/k", b"1")
            event = await asyncio.wait_for(watch.__anext__(), 15)
            # No isinstance check is needed: the static type is WatchEvent too.
            assert event.kv.value == b"1" and event.type is EventType.PUT
        assert [type(r) for r in recoveries] == [WatchSuspended, WatchResubscribed]


async def test_items_with_progress_yield_confirmations_in_order(
    ordered_progress, etcd_client, etcd_prefix
):
    """A watch created above the head is synced: a progress request confirms the revision
    in-band, after the events it covers. A replaying watch gets no such confirmation (etcd
    3.5.1 answers stream-wide even while a watch replays; see test above)."""
    key = etcd_prefix + "p"
    rev = (await etcd_client.put(key, b"0")).revision
    async with etcd_client.watch(key, start_revision=rev + 1) as watch:
        items = watch.items_and_progress()
        changed = await etcd_client.put(key, b"1")
        first = await asyncio.wait_for(items.__anext__(), 5)
        assert isinstance(first, WatchEvent) and first.revision == changed.revision
        head = (await etcd_client.put(etcd_prefix + "other", b"x")).revision
        etcd_client.request_progress()
        progress = await asyncio.wait_for(items.__anext__(), 5)
        assert isinstance(progress, WatchProgress)
        assert progress.key == key.encode() and progress.revision >= head
        # items() does not yield the confirmations.
        plain = watch.items()
        etcd_client.request_progress()
        last = await etcd_client.put(key, b"2")
        item = await asyncio.wait_for(plain.__anext__(), 5)
        assert isinstance(item, WatchEvent) and item.revision == last.revision


def _server_watchers(url: str) -> int:
    """etcd's count of server-side watchers (its /metrics endpoint)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no watcher metric")


async def _watchers_reach(url: str, expected: int) -> int:
    deadline = time.monotonic() + 5
    count = await asyncio.to_thread(_server_watchers, url)
    while count != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        count = await asyncio.to_thread(_server_watchers, url)
    return count


@pytest.mark.parametrize("with_hook", [False, True], ids=["raw", "resync-hook"])
async def test_a_compacted_watch_leaves_no_watcher_behind_on_etcd(fresh_etcd_server, with_hook):
    """etcd keeps a watcher it reported compacted registered on the stream until the client
    cancels it (issue 31: the count went 0 -> 1 and stayed while the stream lived). A raw
    watch ending with CompactedError leaves none; a resynced one leaves exactly its re-create."""
    url = fresh_etcd_server.url
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        keeper = client.watch("/keeper")  # keeps the shared stream open throughout
        await keeper.start()
        base = await _watchers_reach(url, 1)
        assert base == 1
        first = await client.put("/c/k", b"1")
        second = await client.put("/c/k", b"2")
        await client.compact(second.revision)

        async def hook() -> int:
            return (await client.range("/c/", prefix=True)).revision + 1

        watch = client.watch(
            "/c/", prefix=True, start_revision=first.revision, resync=hook if with_hook else None
        )
        items: list[object] = []
        async with watch:
            if with_hook:
                async for item in watch.items():
                    items.append(item)
                    if isinstance(item, WatchResynced):
                        break
                assert await _watchers_reach(url, base + 1) == base + 1  # its re-create only
            else:
                with pytest.raises(CompactedError):
                    async for item in watch.items():
                        items.append(item)
                assert await _watchers_reach(url, base) == base, items
        assert await _watchers_reach(url, base) == base
        await keeper.aclose()


async def test_progress_answers_of_an_early_sending_server_lose_no_event(etcd_client, etcd_prefix):
    """etcd before 3.5.8 sends the answer to a progress request ahead of events still queued
    for the stream (etcd-io/etcd#15220). A watch that believed it took those events for
    replayed ones and dropped them: 38-57 of ~12,000 events lost with eight writers and a
    request every 2 ms. The client learns the server's version and ignores such answers."""
    prefix = etcd_prefix + "busy/"
    async with etcd_client.watch(prefix, prefix=True) as watch:
        items: list[object] = []

        async def consume() -> None:
            async for item in watch.items_and_progress():
                items.append(item)

        consumer = asyncio.create_task(consume())
        hub = etcd_client._watch_hub
        await eventually(lambda: hub.progress_ordered is not None, what="the server's version")
        assert hub.progress_ordered is False  # etcd 3.5.1
        written: list[int] = []
        stop = time.monotonic() + 2.0

        async def write(i: int) -> None:
            n = 0
            while time.monotonic() < stop:
                n += 1
                value = b"x" * 200 + str(n).encode()
                written.append((await etcd_client.put(f"{prefix}k{i}", value)).revision)

        async def ask() -> None:
            while time.monotonic() < stop:
                etcd_client.request_progress()
                await asyncio.sleep(0.002)

        await asyncio.gather(*(write(i) for i in range(8)), ask())
        written.sort()
        seen = lambda: [i.revision for i in items if isinstance(i, WatchEvent)]  # noqa: E731
        await eventually(lambda: len(seen()) >= len(written), timeout=10, what="every write")
        await asyncio.sleep(0.1)  # anything late
        assert seen() == written
        assert not any(isinstance(i, WatchProgress) for i in items)
        consumer.cancel()


async def test_an_early_sending_server_s_progress_answer_moves_no_watch(etcd_client, etcd_prefix):
    """On etcd 3.5.1 a progress request is answered (the stream-wide reply arrives), but the
    client ignores it: an idle watch's resume point stays where its own events put it."""
    async with etcd_client.watch(etcd_prefix + "idle") as watch:
        items = watch.items_and_progress()
        hub = etcd_client._watch_hub
        await eventually(lambda: hub.progress_ordered is not None, what="the server's version")
        before = watch.resume_revision
        head = (await etcd_client.put(etcd_prefix + "other", b"x")).revision
        assert head >= before
        first = asyncio.create_task(_first(items))
        etcd_client.request_progress()
        await asyncio.sleep(0.5)  # etcd 3.5.1 answers within a millisecond
        assert not first.done() and watch.resume_revision == before
        # the watch itself goes on: the next item is the next event, not a progress
        written = await etcd_client.put(etcd_prefix + "idle", b"1")
        item = await asyncio.wait_for(first, 5)
        assert isinstance(item, WatchEvent) and item.revision == written.revision


async def _first(items):
    return await items.__anext__()
