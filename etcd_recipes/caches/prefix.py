"""PrefixCache: a local, always-converging copy of a key range (a prefix, or one key).

Guarantees:

* ``start()`` returns only once the cache holds a snapshot read at **one** revision (paged,
  every page at the first page's revision; the load restarts if that revision is compacted
  mid-load); it retries until ``start_timeout`` and then **raises** -- a cache never starts
  empty because the server was down (CURATOR-328);
* after the snapshot, a watch from ``snapshot revision + 1`` on the client's shared watch
  stream: nothing falls between the read and the watch, and a reconnect resumes exactly;
* changes are reported one :class:`~etcd_recipes.CacheBatch` per revision, in revision order,
  never twice (a replayed revision is dropped); the snapshot is always reported, as an
  ``INITIAL`` batch, even when empty;
* a **resync** -- history compacted past the resume point, a server restored from a backup (its
  revision went backwards or its cluster id changed), a watch that gave up -- re-reads the
  range and reports the **difference** as synthetic events between ``RESYNCING`` and
  ``RESYNCED`` markers, so whoever applies every event converges (CURATOR-391: a key deleted
  and re-created meanwhile is told apart by its create revision); repeated resyncs back off
  (bounded and jittered: a compaction loop cannot hammer etcd);
* reads (``get``, ``items``, ``len``, ``in``, ``revision``) do no I/O; ``get_consistent`` and
  ``wait_for_revision`` make a read as fresh as a linearizable read: they request watch
  progress and, where progress requests go unanswered (``etcd grpc-proxy``), prove with two
  reads (a count, and the keys modified since) that nothing changed since the cache's
  revision;
* a value its codec cannot decode becomes an entry with ``error`` set plus a recorded
  background exception; the cache goes on.

* a listener or stream registered at any time starts with an ``INITIAL`` batch of the content
  at the cache's revision, then gets every later batch: applying them all reproduces the
  cache.

Metrics (to the client's metrics hook; ``metrics_name`` is the ``name`` label): one
``cache_synced`` per full load (``initial`` at start, ``resync`` after each re-read, with its
duration and the entry count after it) and ``cache_size_changed`` for every change of the entry
count -- the load's ``+size``, each revision's and re-read's difference, ``-size`` at close --
so a gauge summed over caches and processes stays right without reading any cache.

Not guaranteed: while the connection is down the cache serves what it last saw
(``is_synced`` is ``False`` then); after a restore from an older backup the cache's revision
goes back with the server's (the ``RESYNCED`` marker says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

import anyio

from .._core.keys import prefix_range_end
from .._core.logctx import library_logger
from .._core.metering import RecipeMeter
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.validate import check_count, check_revision, check_timeout
from .._recipe.recipe import Recipe
from ..client.watch import Watch
from ..codecs import Codec, ValueT, as_codec
from ..errors import ClientClosedError, EtcdRecipeError, EtcdTimeoutError, InvalidArgumentError
from ..events import (
    ConnectionState,
    WatchRecoveryEvent,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
)
from ..resilience import RetryPolicy
from ..types import KeyValue, WatchEvent, WatchProgress
from ._reads import read_range, restored, unchanged_since
from ._store import Store
from ._view import _CacheReads
from .events import BatchKind, CacheBatch, KeyFilter, Transform

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["PrefixCache"]

log = library_logger("etcd_recipes.caches")

_RESYNC_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.5, max_delay=30.0, jitter=0.3)
_START_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.1, max_delay=2.0, jitter=0.2)
_CALM = 10.0  # seconds without a resync after which the resync backoff starts over
_PROGRESS_WAIT = 0.25  # seconds to wait for a progress answer before proving by reads


def _seconds(value: Any, what: str) -> float:
    checked = check_timeout(value, what=what, optional=False)
    assert checked is not None
    return checked


class PrefixCache(_CacheReads[ValueT], Recipe, Generic[ValueT]):
    """A local copy of every key under ``prefix`` (or of one key, ``single_key=True``),
    kept current by a watch.

    ``codec`` decodes values (bytes by default); ``values=False`` keeps keys and revisions
    only; ``transform`` maps each decoded value at ingest (e.g. to keep only what you need);
    ``key_filter`` keeps only the keys it accepts. Keys are ``str`` (UTF-8; other bytes
    survive as surrogate escapes). ``metrics_name`` is the ``name`` label of its metrics
    (low-cardinality: never a key or a path).

    Example::

        from etcd_recipes import PrefixCache

        await client.put(f"{prefix}/config/mode", b"blue")
        async with PrefixCache(client, f"{prefix}/config/") as cache:
            assert cache.get(f"{prefix}/config/mode") == b"blue"  # no I/O
            written = await client.put(f"{prefix}/config/mode", b"green")
            await cache.wait_for_revision(written.revision)
            assert cache.get(f"{prefix}/config/mode") == b"green"
    """

    _path_arg = "prefix"
    _absolute_path = False  # a read-only view may follow any keys (another program's, Go's)

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        *,
        codec: Codec[ValueT] | None = None,
        single_key: bool = False,
        values: bool = True,
        transform: Transform[ValueT] | None = None,
        key_filter: KeyFilter | None = None,
        page_size: int = 1000,
        start_timeout: float = 30.0,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, prefix, client_id=client_id, metrics_name=metrics_name)
        self.single_key: bool = single_key
        """Whether the cache holds the one key ``path`` rather than a prefix."""
        self.page_size: int = check_count(page_size, what="page_size")
        """Keys read per page of a snapshot."""
        self.start_timeout: float = _seconds(start_timeout, "start_timeout")
        """Seconds ``start()`` keeps trying before it raises."""
        if transform is not None and not callable(transform):
            raise InvalidArgumentError("transform must be callable")
        if key_filter is not None and not callable(key_filter):
            raise InvalidArgumentError("key_filter must be callable")
        self._codec: Codec[ValueT] = as_codec(codec)
        self._values = values
        self._key = prefix.encode("utf-8")
        self._end = None if single_key else prefix_range_end(self._key)
        self._store: Store[ValueT] = Store(
            self._codec,
            values=values,
            transform=transform,
            key_filter=key_filter,
            on_error=self._record_exception_at,
        )
        self._revision = 0
        self._synced = False
        self._loaded = False
        self._changed: asyncio.Event | None = None
        self._batches: Broadcast[CacheBatch[ValueT]] = Broadcast(
            "cache-events",
            self._record_listener_error,
            current=self._current_batch,
            listeners_start_current=True,
        )
        self._recovery: Broadcast[WatchRecoveryEvent] = self._broadcast("watch-recovery")
        self._cluster_id = 0
        self._resyncs = 0
        self._last_resync = 0.0
        self._resync_attempt = 0
        self._resyncing = False

    # ---------------------------------------------------------------- identity

    def __repr__(self) -> str:
        synced = "synced" if self._synced else "not synced"
        return (
            f"<{self.exception_context} {self._lifecycle} {synced} revision={self._revision} "
            f"keys={len(self._store.entries)} {self._state.value}>"
        )

    @property
    def revision(self) -> int:
        """The revision the cache reflects: every change up to it is applied."""
        return self._revision

    @property
    def is_synced(self) -> bool:
        """Whether the cache is loaded and its watch live (not resyncing or reconnecting)."""
        return self._synced

    @property
    def resync_count(self) -> int:
        """How many times the cache re-read the range since it started."""
        return self._resyncs

    # ---------------------------------------------------------------- events

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[CacheBatch[ValueT]]:
        """The batches, as an async iterator (bounded by ``maxsize`` batches; see
        :class:`~etcd_recipes.EventStream`). It starts with an ``INITIAL`` batch: the load's,
        or -- once loaded -- the content at the current revision; then every later change.

        Example::

            from etcd_recipes import BatchKind, PrefixCache

            cache = PrefixCache(client, f"{prefix}/e/")
            async with cache.events() as batches:
                await cache.start()
                assert (await anext(batches)).kind is BatchKind.INITIAL
                await client.put(f"{prefix}/e/k", b"v")
                batch = await anext(batches)
                assert [event.key for event in batch] == [f"{prefix}/e/k"]
            await cache.aclose()
        """
        return self._batches.stream(maxsize)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the cache's watch, as an async iterator ending at close:
        ``WatchSuspended``, ``WatchResubscribed`` (the changes made meanwhile replayed),
        ``WatchResynced`` (compacted or restored: the difference re-read, as a ``RESYNC``
        batch; ``compact_revision`` is at least where the cache lost track), ``WatchFailed``.

        Example::

            from etcd_recipes import PrefixCache

            async with PrefixCache(client, f"{prefix}/rec/") as cache:
                assert cache.recovery_events().buffered == 0  # nothing to recover from
        """
        return self._recovery.stream(maxsize)

    def _current_batch(self) -> CacheBatch[ValueT] | None:
        """What a reader registered after the load starts with: the content now."""
        if not self._loaded or self.is_closed:
            return None  # not loaded yet: the load's INITIAL batch will come
        return self._store.snapshot_batch(self._revision)

    def add_listener(self, listener: Callable[[CacheBatch[ValueT]], Any]) -> None:
        """Call ``listener(batch)`` for every batch, in order, from a task of its own (a slow
        or ``async`` listener delays only itself), starting like :meth:`events` with an
        ``INITIAL`` batch. A listener that raises is recorded as a background exception and
        keeps receiving.

        Example::

            from etcd_recipes import PrefixCache

            cache = PrefixCache(client, f"{prefix}/l/")
            cache.add_listener(lambda batch: print(batch.kind.value, len(batch)))
            await cache.start()  # the listener prints "INITIAL 0", then a line per change
            await cache.aclose()
        """
        self._batches.add_listener(listener)

    def remove_listener(self, listener: Callable[[CacheBatch[ValueT]], Any]) -> None:
        """Stop calling ``listener``."""
        self._batches.remove_listener(listener)

    def clear_listeners(self) -> None:
        """Remove every batch listener."""
        self._batches.clear_listeners()

    # ---------------------------------------------------------------- consistency

    async def wait_synced(self, timeout: float | None = None) -> bool:
        """Wait until the cache is loaded and live; ``False`` if ``timeout`` passes first.

        Example::

            from etcd_recipes import PrefixCache

            async with PrefixCache(client, f"{prefix}/w/") as cache:
                assert await cache.wait_synced(timeout=5)
        """
        timeout = check_timeout(timeout)
        self._check_open()
        with anyio.move_on_after(timeout):
            while not self._synced:
                self._check_open()
                await self._next_change()
            return True
        return False

    async def wait_for_revision(self, revision: int, timeout: float | None = 10.0) -> int:
        """Wait until the cache reflects ``revision`` (every change up to it); returns the
        cache's revision. Raises :class:`~etcd_recipes.errors.EtcdTimeoutError` after
        ``timeout`` seconds.

        Proves with two reads (a count, and the keys modified since) that the range did not
        change since the cache's revision, else waits for the watch: its events, or etcd's
        answer to a progress request (etcd 3.5.8 or later; older servers' answers and
        ``etcd grpc-proxy``, which forwards none, leave it to the reads). A read that fails
        meanwhile (a cut, a restart) is retried until the timeout, never raised.

        Example::

            from etcd_recipes import PrefixCache

            async with PrefixCache(client, f"{prefix}/r/") as cache:
                written = await client.put(f"{prefix}/elsewhere", b"x")  # outside the range
                assert await cache.wait_for_revision(written.revision) >= written.revision
        """
        revision, timeout = check_revision(revision), check_timeout(timeout)
        self._check_started()
        with anyio.move_on_after(timeout):
            while self._revision < revision:
                self._check_started()
                if self._synced:
                    await self._confirm_unchanged()
                    if self._revision >= revision:
                        break
                self._client.request_progress()
                with anyio.move_on_after(_PROGRESS_WAIT):
                    while self._revision < revision:
                        await self._next_change()
        if self._revision < revision:
            raise EtcdTimeoutError(
                f"{self.exception_context}: not at revision {revision} within {timeout}s "
                f"(at {self._revision}; synced: {self._synced})"
            )
        return self._revision

    async def get_consistent(self, key: str, timeout: float | None = 10.0) -> ValueT | None:
        """``get(key)`` after the cache has caught up with the server's current revision (read
        with one count-only linearizable range): as fresh as a read from etcd.

        Example::

            from etcd_recipes import PrefixCache

            async with PrefixCache(client, f"{prefix}/c/") as cache:
                await client.put(f"{prefix}/c/k", b"new")
                assert await cache.get_consistent(f"{prefix}/c/k") == b"new"
        """
        check_timeout(timeout)
        self._check_started()
        head = await self._client.range(self._key, range_end=self._end, count_only=True)
        await self.wait_for_revision(head.revision, timeout)
        return self.get(key)

    async def _confirm_unchanged(self) -> None:
        seen, count = self._revision, self._store.server_count
        try:
            head = await unchanged_since(self._client, self._key, self._end, seen, count)
        except ClientClosedError:
            raise
        except EtcdRecipeError as exc:  # unreachable for now: the caller waits and asks again
            log.debug("%s: could not confirm revision %d: %r", self.exception_context, seen, exc)
            return
        if head is not None and self._revision == seen and self._synced:
            self._advance(head)

    def _advance(self, revision: int) -> None:
        if revision > self._revision:
            self._revision = revision
            self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _next_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    # ---------------------------------------------------------------- lifecycle

    async def _do_start(self) -> None:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                revision, kvs, total = await self._snapshot()
                self._cluster_id = (await self._client.status()).cluster_id
                break
            except EtcdRecipeError as exc:
                elapsed = time.monotonic() - started
                delay = _START_BACKOFF.next_delay(attempt, elapsed)
                if delay is None or elapsed + delay > self.start_timeout:
                    raise EtcdTimeoutError(
                        f"{self.exception_context}: could not load within "
                        f"{self.start_timeout}s ({attempt} attempts): {exc}"
                    ) from exc
                log.info(
                    "%s: load failed (%s); retrying in %.2fs", self.exception_context, exc, delay
                )
                await asyncio.sleep(delay)
        watch = await self._watch(revision).start()  # live before start() returns
        # The INITIAL batch is built only for readers already registered; a later one gets
        # it from _current_batch (100,000 event objects nobody reads cost ~15 % of a start).
        readers = self._batches.stream_count + self._batches.listener_count
        batch = self._store.load(revision, kvs, total, events=readers > 0)
        self._revision = revision
        self._synced = self._loaded = True
        if readers:
            self._batches.publish(batch)
        self._record_latency("cache.start", started)
        size = len(self._store.entries)
        self._meter.cache_synced("initial", time.monotonic() - started, size)
        self._meter.cache_size(size)
        self._spawn(self._run(watch), "watch")

    async def _do_close(self) -> None:
        self._synced = False
        await self._batches.aclose()
        self._meter.cache_size(-len(self._store.entries))  # a summed gauge forgets this cache
        self._store.clear()
        self._wake()

    async def _snapshot(self) -> tuple[int, list[KeyValue], int]:
        return await read_range(
            self._client, self._key, self._end, self.page_size, keys_only=not self._values
        )

    # ---------------------------------------------------------------- the watch loop

    def _watch(self, revision: int) -> Watch:
        return self._client.watch(
            self._key, range_end=self._end, start_revision=revision + 1, resync=self._on_compacted
        )

    async def _run(self, first: Watch) -> None:
        failures = 0
        watch: Watch | None = first
        while True:
            try:
                if watch is None:  # not following anything until the new watch is live
                    self._synced = False
                    watch = self._watch(self._revision)
                if not await self._follow(watch):
                    return  # the watch ended because the cache closed
                watch = None  # resynced after a restore: watch again from the new revision
                continue
            except Exception as exc:  # the watch gave up, or a bug: never a silently stale cache
                watch = None
                failures += 1
                self._synced = False
                self._record_exception(exc, "watch")
                self._set_state(ConnectionState.SUSPENDED)
                delay = _RESYNC_BACKOFF.next_delay(failures, 0.0) or 30.0
                await asyncio.sleep(delay)
                with contextlib.suppress(Exception):
                    lost_at = self._revision
                    anchor = await self._resync(f"the watch failed ({exc!r})")
                    self._report_resynced(lost_at, anchor)
                    failures = 0

    async def _follow(self, watch: Watch) -> bool:
        """Apply the watch's changes; True when it must start over (after a restore)."""
        pending: list[WatchEvent] = []
        async with watch:
            self._watching()
            async for item in watch.items_and_progress():
                if isinstance(item, WatchEvent):
                    if pending and pending[-1].revision != item.revision:
                        self._apply(pending)
                        pending = []
                    pending.append(item)
                    if watch.buffered == 0:  # a response (whole revisions) is consumed
                        self._apply(pending)
                        pending = []
                    continue
                if pending:
                    self._apply(pending)
                    pending = []
                if isinstance(item, WatchProgress):
                    if self._synced:
                        self._advance(item.revision)
                    continue
                self._on_recovery_event(item)
                self._recovery.publish(item)
                if isinstance(item, WatchSuspended):
                    self._synced = False
                elif isinstance(item, WatchResubscribed):
                    if await self._restored():
                        lost_at = self._revision
                        why = "history was compacted, or the server restored"
                        anchor = await self._resync(why)
                        self._report_resynced(lost_at, anchor)
                        return True
                    self._synced = True
                    self._wake()
        return False

    def _report_resynced(self, lost_at: int, anchor: int) -> None:
        """A re-read the watch did not report (a restore, a compaction found on resubscribe)."""
        event = WatchResynced(self._key, lost_at, anchor)
        self._on_recovery_event(event)
        self._recovery.publish(event)

    def _watching(self) -> None:
        """A watch from the cache's revision + 1 is live: nothing is missing any more, even
        if the re-read that came before failed (then its RESYNCING marker is closed here)."""
        if self._resyncing:
            self._resyncing = False
            self._batches.publish(CacheBatch(BatchKind.RESYNCED, self._revision))
        if not self._synced:
            self._synced = True
            self._wake()

    def _apply(self, events: list[WatchEvent]) -> None:
        revision = events[-1].revision
        if revision <= self._revision:
            log.warning(
                "%s: dropped a replayed revision %d (at %d)",
                self.exception_context,
                revision,
                self._revision,
            )
            return
        before = len(self._store.entries)
        batch = self._store.apply(revision, events)
        self._meter.cache_size(len(self._store.entries) - before)
        self._revision = revision
        self._batches.publish(batch)
        self._wake()

    async def _restored(self) -> bool:
        return await restored(self._client, self._key, self._end, self._revision, self._cluster_id)

    async def _on_compacted(self) -> int:
        """The watch's resync hook: history past our revision is gone."""
        return await self._resync("history was compacted past the cache's revision")

    async def rebuild(self) -> int:
        """Re-read the whole range now and report the difference (as after a compaction:
        ``RESYNCING``, a ``RESYNC`` batch of synthetic events if anything differs,
        ``RESYNCED``); returns the revision read. Rarely needed: the cache resyncs by itself.

        Example::

            from etcd_recipes import PrefixCache

            async with PrefixCache(client, f"{prefix}/rb/") as cache:
                revision = await cache.rebuild()
                assert cache.revision >= revision and cache.resync_count == 1
        """
        self._check_started()
        return await self._resync("rebuild() was called", backoff=False, catch_up=True)

    async def _resync(self, why: str, *, backoff: bool = True, catch_up: bool = False) -> int:
        """Re-read the range and apply the difference. ``catch_up``: the watch runs meanwhile,
        so read again until the read is not older than the cache (its later events are
        dropped as replays, the earlier ones were applied) -- never move the cache back."""
        log.info("%s: resyncing: %s", self.exception_context, why)
        self._synced = False  # stale from here on, backoff included
        if not self._resyncing:  # one marker per episode, however many attempts it takes
            self._resyncing = True
            self._batches.publish(CacheBatch(BatchKind.RESYNCING, self._revision))
        now = time.monotonic()
        if now - self._last_resync > _CALM:
            self._resync_attempt = 0
        self._resync_attempt += 1
        if backoff and self._resync_attempt > 1:  # resyncing in a loop: back off (jittered)
            delay = _RESYNC_BACKOFF.next_delay(self._resync_attempt - 1, 0.0) or 30.0
            await asyncio.sleep(delay)
        started = time.monotonic()
        self._cluster_id = (await self._client.status()).cluster_id
        while True:
            revision, kvs, total = await self._snapshot()
            if not catch_up or revision >= self._revision:
                break  # and no await from here on: the watch cannot apply anything in between
        before = len(self._store.entries)
        batch = self._store.rebuild(revision, kvs, total)
        size = len(self._store.entries)
        if not self.is_closed:  # closing reported -size already
            self._meter.cache_size(size - before)
            self._meter.cache_synced("resync", time.monotonic() - started, size)
        if batch.events:
            self._batches.publish(batch)
        self._revision = revision  # may be lower than before after a restore: that is the truth
        self._resyncs += 1
        self._last_resync = time.monotonic()
        self._synced, self._resyncing = True, False
        self._batches.publish(CacheBatch(BatchKind.RESYNCED, revision))
        self._wake()
        return revision + 1 if not catch_up else revision

    def _report_as(self, meter: RecipeMeter) -> None:
        """Report metrics through ``meter``: a cache layered over this one (``NodeCache``,
        ``PathChildrenCache``) reports under its own class name and ``metrics_name``."""
        self._meter_view = meter

    def _record_exception_at(self, where: str, error: Exception) -> None:
        self._record_exception(error, where)
