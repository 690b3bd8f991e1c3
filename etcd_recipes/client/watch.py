"""Resilient watches, multiplexed on one gRPC Watch stream per client.

Guarantees:

* every watch of a client shares one bidirectional stream (cheap: ~8 KB per parked watcher);
* after any stream failure a watch resumes at ``last seen revision + 1`` -- no event is lost or
  delivered twice across a reconnect; progress notifications advance that revision;
* when the history it needs was compacted, a watch with a ``resync`` hook calls it (the hook
  re-reads the state and returns the revision to continue from) and reports ``WatchResynced``
  -- once per compaction it meets, however often the stream fails meanwhile, and no event
  older than the hook's revision is delivered after it; a raw watch without a hook raises
  :class:`~etcd_recipes.errors.CompactedError` -- it never hangs and never silently skips
  the gap;
* a watch re-created after a failure or a resync asks etcd for one revision more than it
  needs (``resume - 1``; the replayed revision is dropped): etcd before 3.5.15 serves a watch
  that starts *exactly at* the compact revision but has dropped a DELETE made at that
  revision (etcd-io/etcd#18089), so resuming there could skip a deletion silently -- the one
  extra revision turns that case into a compaction (a resync, or ``CompactedError``);
* iterating a watch yields data events only (:class:`~etcd_recipes.types.WatchEvent`), so a
  plain ``async for`` loop never meets anything else; recovery events
  (``WatchSuspended``/``WatchResubscribed``/``WatchResynced``/``WatchFailed``) go to the
  recovery listeners and, in order with the data events, to :meth:`Watch.items`; a failure
  ends the iteration with :class:`~etcd_recipes.errors.WatchFailedError`;
* user code never runs inside the stream reader task: each watch is consumed by its own
  iterator (or dispatcher task), so a slow consumer stalls only itself.

Not guaranteed: a watch created "from now" (``start_revision=0``) that suspends before seeing
any event or progress notification resumes from the server's current revision, a possible gap
reported as ``WatchResubscribed(resume_revision=0)``; anchor watches at a read's revision + 1.
The *first* create uses ``start_revision`` as given (a watch above the head is served at once,
one at or below it by etcd's 100 ms catch-up loop), so a ``start_revision`` that is exactly
the compact revision inherits etcd-io/etcd#18089; a re-created watch waits up to ~100 ms for
etcd's catch-up loop before its first event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

from aetcd import rpc as pb

from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.mailbox import Mailbox, Signal
from ..errors import ClientClosedError, CompactedError, EtcdRecipeError, WatchFailedError
from ..events import (
    WatchFailed,
    WatchRecoveryEvent,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
)
from ..resilience import WatchResilience
from ..types import WatchEvent, WatchProgress

if TYPE_CHECKING:
    from .watch_hub import WatchHub

__all__ = ["ResyncHook", "Watch", "WatchItem"]

log = library_logger("etcd_recipes.watch")

WatchItem = Union[WatchEvent, WatchRecoveryEvent]
"""What :meth:`Watch.items` yields: data events and recovery events, in order."""
ResyncHook = Callable[[], Awaitable[int]]


class _Compacted:
    __slots__ = ("revision",)

    def __init__(self, revision: int) -> None:
        self.revision = revision


_QueueItem = Union[list[WatchEvent], WatchRecoveryEvent, WatchProgress, _Compacted]


class Watch:
    """One watch on a key, a prefix or a range. Create it with :meth:`EtcdClient.watch`.

    Use it as an async context manager and iterate it for the data events; iterate
    :meth:`items` instead to see recovery events in order with them::

        async with client.watch("/jobs/", prefix=True, start_revision=rev + 1) as watch:
            async for event in watch:
                print(event.type, event.kv.key, event.kv.value)
    """

    def __init__(
        self,
        hub: WatchHub,
        key: bytes,
        range_end: bytes | None,
        *,
        start_revision: int,
        prev_kv: bool,
        no_put: bool,
        no_delete: bool,
        resync: ResyncHook | None,
        resilience: WatchResilience,
        display_key: bytes,
    ) -> None:
        self._hub = hub
        self._key = key
        self._range_end = range_end
        self.key: bytes = display_key
        """The watched key (or prefix), without the client's namespace."""
        self._resume = start_revision
        self._prev_kv = prev_kv
        self._no_put = no_put
        self._no_delete = no_delete
        self._resync = resync
        self._resilience = resilience
        self._id: int | None = None  # the server's id for it on the current stream
        self._queue: Mailbox[_QueueItem] = Mailbox()
        self._buffer: deque[WatchItem | WatchProgress] = deque()
        self._created = False
        self._awaiting_resync = False  # compacted: the consumer re-creates it after the hook
        self._floor = 0  # events below it are stale (covered by the last resync's re-read)
        self._requested = 0  # the start revision of the create in flight
        self._exact = False  # the next (or in-flight) create starts at _resume itself
        self._settled = Signal()  # set once created, or closed/failed before that
        self._server_active = False
        self._suspended = False
        self._attempt = 0
        self._since = 0.0
        self._state = "new"  # new -> active -> closed
        self._error: BaseException | None = None
        self._failed_sent = False
        self.recovery_listeners: ListenerSet = ListenerSet("watch-recovery")

    # ------------------------------------------------------------------ public surface

    @property
    def resume_revision(self) -> int:
        """The revision the watch would resume from after a failure (``0``: "now")."""
        return self._resume

    @property
    def buffered(self) -> int:
        """Events received and not yet iterated, of the server response being consumed. ``0``
        after an event means that response is done -- etcd sends a revision's events together,
        so a consumer grouping by revision knows the revision is complete."""
        return len(self._buffer)

    @property
    def is_synced(self) -> bool:
        """Whether the server has caught this watch up to the present (it started above the
        head revision, or a progress notification said so). A watch replaying history gets
        its events from etcd's catch-up loop, up to ~100 ms late."""
        return self._synced

    @property
    def is_closed(self) -> bool:
        """Whether the watch was closed (or failed for good)."""
        return self._state == "closed"

    def add_recovery_listener(self, listener: Callable[[WatchRecoveryEvent], Any]) -> None:
        """Call ``listener`` with each recovery event (besides delivering it in-band)."""
        self.recovery_listeners.add(listener)

    async def start(self) -> Watch:
        """Register with the server and wait until it confirms the watch is live."""
        if self._state == "closed":
            raise ClientClosedError("this watch was closed")
        if self._state == "new":
            self._state = "active"
            self._hub.register(self)
        try:
            await self._settled.wait()
        except BaseException:
            self._close_now()
            raise
        if not self._created:
            self._close_now()
            raise self._error or ClientClosedError("the watch was closed before it started")
        return self

    async def aclose(self) -> None:
        """Cancel the watch on the server; idempotent."""
        self._close_now()

    async def __aenter__(self) -> Watch:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close_now()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            item = await self._next_item()
            if isinstance(item, WatchEvent):
                return item

    async def items(self) -> AsyncIterator[WatchItem]:
        """Iterate data events and, in order with them, recovery events.

        Ends like plain iteration: after a final ``WatchFailed`` it raises
        :class:`~etcd_recipes.errors.WatchFailedError`; after a compaction without a
        ``resync`` hook, :class:`~etcd_recipes.errors.CompactedError`.

        Example::

            from etcd_recipes import WatchEvent, WatchResubscribed

            rev = (await client.put(prefix + "/jobs/1", b"a")).revision
            async with client.watch(prefix + "/jobs/", prefix=True, start_revision=rev) as watch:
                async for item in watch.items():
                    if isinstance(item, WatchResubscribed):
                        print("the stream was re-created; nothing was missed")
                    elif isinstance(item, WatchEvent):
                        assert item.kv.value == b"a"
                        break
        """
        while True:
            try:
                item = await self._next_item()
            except StopAsyncIteration:
                return
            if not isinstance(item, WatchProgress):
                yield item

    async def items_and_progress(self) -> AsyncIterator[WatchItem | WatchProgress]:
        """Like :meth:`items`, plus a :class:`~etcd_recipes.types.WatchProgress` each time etcd
        confirms that the watch has delivered every change up to a revision.

        Only a watch known to be caught up gets them (one created above the head revision,
        or after etcd's own per-watch notification), and answers to
        :meth:`EtcdClient.request_progress` only from etcd 3.5.8 or later (3.4.25 on the 3.4
        line): older servers send them ahead of events still on their way.

        Example::

            from etcd_recipes import WatchEvent, WatchProgress

            key = prefix + "/idle"
            async with client.watch(key) as watch:  # from now: caught up at once
                client.request_progress()  # answered in-band by etcd >= 3.5.8 only
                written = await client.put(key, b"v")
                async for item in watch.items_and_progress():
                    if isinstance(item, WatchProgress):
                        assert item.key == key.encode()  # the revisions it covers are done
                    elif isinstance(item, WatchEvent):
                        assert item.revision == written.revision
                        break
        """
        while True:
            try:
                item = await self._next_item()
            except StopAsyncIteration:
                return
            yield item

    async def _next_item(self) -> WatchItem | WatchProgress:
        if self._state == "new":
            await self.start()
        while not self._buffer:
            if self._state == "closed" and self._queue.empty():
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            item = await self._queue.get()
            await self._absorb(item)
        return self._buffer.popleft()

    # ------------------------------------------------------------------ consumer-side handling

    async def _absorb(self, item: _QueueItem) -> None:
        if isinstance(item, list):
            if item and item[0].kv.mod_revision < self._floor:
                item = [event for event in item if event.kv.mod_revision >= self._floor]
            self._buffer.extend(item)
        elif isinstance(item, _Compacted):
            await self._handle_compaction(item.revision)
        else:
            self._buffer.append(item)
            if isinstance(item, WatchFailed):
                self._error = WatchFailedError(f"watch on {self.key!r} failed: {item.cause}")
                if item.cause is not None:
                    self._error.__cause__ = item.cause

    async def _handle_compaction(self, compact_revision: int) -> None:
        if self._resync is None:
            self._awaiting_resync = False
            self._error = CompactedError(
                f"watch on {self.key!r}: history was compacted up to revision {compact_revision};"
                " re-read the state and watch again from the read's revision + 1",
                compact_revision=compact_revision,
            )
            self._close_now()
            return
        attempt = 0
        start = time.monotonic()
        while True:
            attempt += 1
            try:
                anchor = await self._resync()
                break
            except EtcdRecipeError as exc:
                delay = self._resilience.retry_policy.next_delay(attempt, time.monotonic() - start)
                if delay is None:
                    self._awaiting_resync = False
                    failed = WatchFailed(self.key, exc)
                    self._emit(failed)
                    await self._absorb(failed)
                    self._close_now()
                    return
                await asyncio.sleep(delay)
        self._resume = self._floor = anchor
        self._awaiting_resync = False
        event = WatchResynced(self.key, compact_revision, anchor)
        self._hub.metrics.emit("increment_watch_recovery", "resynced", self.key)
        self._emit(event)
        self._buffer.append(event)
        if self._state == "active":
            self._hub.recreate(self)

    def _emit(self, event: WatchRecoveryEvent) -> None:
        with contextlib.suppress(RuntimeError):
            self.recovery_listeners.emit(event)

    # ------------------------------------------------------------------ hub-side callbacks

    def _close_now(self) -> None:
        if self._state == "closed":
            return
        was_new = self._state == "new"
        self._state = "closed"
        self._settled.set()
        if not was_new:
            self._hub.unregister(self)
        self._queue.put_nowait([])  # wake a parked consumer

    def _create_request(self) -> Any:
        filters = []
        if self._no_put:
            filters.append(pb.WatchCreateRequest.NOPUT)
        if self._no_delete:
            filters.append(pb.WatchCreateRequest.NODELETE)
        start = max(self._resume, 0)
        if self._created and start > 1 and not self._exact:
            start -= 1  # one revision early (etcd-io/etcd#18089); _on_events drops it
        self._requested = start
        create = pb.WatchCreateRequest(
            key=self._key,
            range_end=self._range_end or b"",
            start_revision=start,
            progress_notify=self._resilience.progress_notify,
            filters=filters,
            prev_kv=self._prev_kv,
            watch_id=0,  # the server picks (see WatchHub)
        )
        return pb.WatchRequest(create_request=create)

    def _on_created(self, header_revision: int) -> None:
        self._server_active = True
        self._auth_retried = False
        if self._resume <= 0:
            # Anchored at "now": from here on we know exactly where we are.
            self._resume = header_revision + 1
        # Synced from the start only if it starts above the head; a replaying watch is synced
        # once etcd sends it a per-watch progress notification.
        self._synced = self._requested > header_revision or self._requested <= 0
        if self._suspended:
            self._suspended = False
            self._attempt = 0
            event = WatchResubscribed(self.key, self._resubscribe_revision)
            self._hub.metrics.emit("increment_watch_recovery", "resubscribed", self.key)
            self._emit(event)
            self._queue.put_nowait(event)
        self._created = True
        self._settled.set()

    def _needs_recreate(self, header_revision: int) -> bool:
        """After a create reply: should the watch be re-created at once?

        A watch created one revision early (see :meth:`_create_request`) is caught up by etcd's
        100 ms loop and never counts as synced, so progress requests would not advance it.
        When nothing was written since its resume point (the head is ``resume - 1``), a
        compaction cannot be *at* ``resume`` and a create at ``resume`` itself is safe -- and
        synced at once. If that exact create then finds newer writes (a compaction at
        ``resume`` may have come with them), it is re-created early again."""
        if self._exact:
            self._exact = False
            return self._requested <= header_revision
        if self._created and self._requested == header_revision == self._resume - 1:
            self._exact = True
            return True
        return False

    def _on_events(self, events: list[WatchEvent], header_revision: int) -> None:
        if events and events[0].kv.mod_revision < self._resume:
            # Replayed (a re-create starts one revision early): delivered already.
            events = [event for event in events if event.kv.mod_revision >= self._resume]
        if events:
            self._resume = max(self._resume, events[-1].kv.mod_revision + 1)
            self._queue.put_nowait(events)

    def _on_stream_progress(self, header_revision: int) -> None:
        # Only for watches known to be synced (see _on_created / _on_progress).
        if self._server_active and self._synced:
            self._advance(header_revision)

    def _on_progress(self, header_revision: int) -> None:
        # etcd sends per-watch progress notifications only to synced watchers, in order with
        # their events: safe to advance, and proof the watch has caught up.
        if self._server_active:
            self._advance(header_revision)
            self._synced = True

    def _advance(self, header_revision: int) -> None:
        self._resume = max(self._resume, header_revision + 1)
        # In-band, after every event it vouches for (items_and_progress() yields it).
        self._queue.put_nowait(WatchProgress(self.key, header_revision))

    def _on_compacted(self, compact_revision: int) -> None:
        self._server_active = False
        # Until the consumer has run the resync hook, re-creating it (after a stream failure)
        # would only meet the same compaction again: a second resync, and events of the
        # first one's re-create queued behind the second (stale once it anchors later).
        self._awaiting_resync = self._resync is not None
        self._queue.put_nowait(_Compacted(compact_revision))

    def _on_failure(self, cause: BaseException | None) -> bool:
        """The stream (or this watch) failed; returns False when the watch gives up."""
        self._server_active = False
        now = time.monotonic()
        if not self._suspended:
            self._suspended = True
            self._attempt = 0
            self._since = now
            self._resubscribe_revision = self._resume
            event = WatchSuspended(self.key, cause)
            self._hub.metrics.emit("increment_watch_recovery", "suspended", self.key)
            self._emit(event)
            self._queue.put_nowait(event)
        self._attempt += 1
        self._resubscribe_revision = self._resume
        delay = self._resilience.retry_policy.next_delay(self._attempt, now - self._since)
        if delay is None:
            self._fail(cause)
            return False
        return True

    def _fail(self, cause: BaseException | None) -> None:
        if self._failed_sent:
            return
        self._failed_sent = True
        event = WatchFailed(self.key, cause)
        self._hub.metrics.emit("increment_watch_recovery", "failed", self.key)
        self._emit(event)
        self._queue.put_nowait(event)
        if self._error is None:
            self._error = WatchFailedError(f"watch on {self.key!r} failed: {cause}")
        self._state = "closed"
        self._settled.set()
        self._hub.unregister(self)
        self._queue.put_nowait([])

    _resubscribe_revision = 0
    _synced = False
    _auth_retried = False
