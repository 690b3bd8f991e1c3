"""The client's one Watch stream: :class:`WatchHub` opens it, multiplexes every
:class:`~etcd_recipes.client.watch.Watch` of the client on it, routes the server's responses
to them, and re-creates the stream (and every watch on it) after a failure. Not public."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc as pb

from .._core.logctx import library_logger
from .._core.metering import meter_for
from ..errors import ClientClosedError, EtcdRecipeError, PermissionDeniedError
from ..resilience import RetryPolicy
from ..types import EventType, KeyValue, WatchEvent
from .rpc import is_auth_token_error
from .wire import REQUIRE_LEADER, StreamMoved, Wire, task_cancelling

if TYPE_CHECKING:
    from .watch import Watch

__all__ = ["WatchHub", "progress_is_ordered"]

log = library_logger("etcd_recipes.watch")

_HUB_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.05, max_delay=1.0, jitter=0.2)


DEFAULT_STALL_TIMEOUT = 15.0
"""Seconds of silence (no event, no progress answer) after which a watch stream of a server
that answers progress requests is treated as failed and re-opened (see :class:`WatchHub`)."""


def progress_is_ordered(version: str) -> bool:
    """Whether an etcd server of ``version`` sends its answer to a stream-wide progress request
    after every event it has generated up to that revision (etcd-io/etcd#15220, fixed in
    3.5.8 and 3.4.25). Older servers send it ahead of events still queued for the stream: a
    watch trusting it would take events still on their way for ones it already had, and drop
    them -- a silent loss.

    Example::

        from etcd_recipes.client.watch_hub import progress_is_ordered

        assert not progress_is_ordered("3.5.1") and progress_is_ordered("3.5.8")
        assert progress_is_ordered("3.4.25") and not progress_is_ordered("3.4.23")
    """
    try:
        parts = tuple(int(p) for p in version.split("-", 1)[0].split(".")[:3])
    except ValueError:
        return False
    if len(parts) != 3:
        return False
    return parts >= (3, 5, 8) or (3, 4, 25) <= parts < (3, 5, 0)


class WatchHub:
    """Owns the client's single Watch stream and routes responses to :class:`Watch` objects.

    A stream that stays open but silent is not trusted: once a stream's server has answered a
    progress request (asked once per stream until one does), a stream silent for half of
    ``stall_timeout`` while it carries watches is sent a progress request, and one still silent
    at ``stall_timeout`` is failed and re-opened (on another endpoint when the channel has
    one); every watch resumes at its last revision + 1, so nothing is lost. A server that never
    answers (``etcd grpc-proxy`` does not) is left to gRPC keepalive and require-leader.
    ``None`` turns the check off. Cost: one small request per half-bound of idle silence.
    """

    def __init__(self, wire: Wire, *, stall_timeout: float | None = DEFAULT_STALL_TIMEOUT) -> None:
        self._wire = wire
        finite = stall_timeout is not None and stall_timeout != float("inf")
        self._stall_timeout = stall_timeout if finite else None
        self.answers_progress = False
        """Whether a stream's server answered a progress request (then silence is checked)."""
        self.stalls_detected = 0
        """How many streams were failed for silence (for tests and diagnostics)."""
        self._call: Any = None
        self._last_read = 0.0
        self._probe_sent: float | None = None
        self._own_probes = 0  # progress requests of ours awaiting an answer on this stream
        self._stall: EtcdRecipeError | None = None
        self._stopping = False  # the supervisor is being cancelled on purpose
        self.metrics = meter_for(wire.metrics)
        """The sink's meter: watches report recovery events through it, never inline."""
        # Ids are the server's: every create asks for "any id" (0) and the server's "created"
        # replies come in the order of the requests, so each is matched to the oldest create
        # still waiting (as Go's clientv3 does). Our own ids would do directly against etcd,
        # but ``etcd grpc-proxy`` ignores requested ids and numbers a stream's watches itself.
        self._all: dict[Watch, None] = {}  # every registered watch, in registration order
        self._watchers: dict[int, Watch] = {}  # by server id, once created on this stream
        self._pending: deque[Watch | None] = deque()  # creates awaiting "created", in order
        self._outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._stream_up = False
        self._closed = False
        self.streams_opened = 0
        """How many Watch streams this hub has opened (for tests and diagnostics)."""
        self.progress_ordered: bool | None = None
        """Whether the server orders its answers to progress requests after the events they
        cover (see :func:`progress_is_ordered`): ``None`` until a member's version is known,
        ``False`` for good once any member is older. Answers are ignored unless ``True``."""
        self._version_check: asyncio.Task[None] | None = None

    @property
    def watcher_count(self) -> int:
        """How many watches are registered."""
        return len(self._all)

    def register(self, watch: Watch) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
        self._all[watch] = None
        watch._id = None
        if self._stream_up:
            self._send_create(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name="etcd-recipes-watch-stream"
            )

    def _send_create(self, watch: Watch) -> None:
        self._pending.append(watch)
        self._outbox.put_nowait(watch._create_request())

    def _send_cancel(self, watch_id: int) -> None:
        self._outbox.put_nowait(
            pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id))
        )

    def recreate(self, watch: Watch) -> None:
        """Re-create a watch the server dropped (compaction, server-side cancel) on the live
        stream, under a new server id."""
        if watch not in self._all:
            return
        self._forget_id(watch, cancel=True)
        if self._stream_up and watch not in self._pending:
            self._send_create(watch)

    def unregister(self, watch: Watch) -> None:
        if self._all.pop(watch, None) is not None or watch._id is not None:
            self._forget_id(watch, cancel=watch._server_active)
        for i, waiting in enumerate(self._pending):
            if waiting is watch:
                self._pending[i] = None  # its "created" reply will be cancelled on arrival
        watch._server_active = False

    def _forget_id(self, watch: Watch, *, cancel: bool) -> None:
        wid, watch._id = watch._id, None
        if wid is not None and self._watchers.get(wid) is watch:
            del self._watchers[wid]
            if cancel and self._stream_up:
                self._send_cancel(wid)

    async def aclose(self) -> None:
        self._closed = True
        if self._version_check is not None:
            self._version_check.cancel()
        for watch in list(self._all):
            watch._error = ClientClosedError("the client was closed")
            watch._close_now()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def request_progress(self) -> None:
        """Ask the server for a progress notification on every watch of the stream."""
        if self._stream_up:
            self._outbox.put_nowait(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    # ------------------------------------------------------------------ stalled streams

    def _probe(self) -> None:
        """A progress request of our own: its answer proves the stream alive, and goes to no
        watch (``_own_probes``)."""
        self._own_probes += 1
        self._probe_sent = asyncio.get_running_loop().time()
        self._outbox.put_nowait(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def move(self) -> None:
        """Re-open the stream now, on the client's current channel (its endpoints changed):
        every watch resumes at its last revision + 1, nothing is reported as suspended."""
        if self._call is not None:
            self._stall = StreamMoved("the watch stream moves to the new endpoints")
            self._call.cancel()

    def _arm(self, call: Any, delay: float) -> None:
        asyncio.get_running_loop().call_later(max(delay, 0.05), self._check_stall, call)

    def _check_stall(self, call: Any) -> None:
        bound = self._stall_timeout
        if bound is None or call is not self._call or not self._stream_up:
            return  # the check ends with its stream
        now = asyncio.get_running_loop().time()
        silent = now - self._last_read
        if not self.answers_progress or not self._all:
            self._arm(call, bound / 2)
            return
        if silent >= bound:
            self.stalls_detected += 1
            self._stall = EtcdRecipeError(
                f"the watch stream was silent for {silent:.1f}s (no event, no answer to a "
                "progress request): treated as failed"
            )
            call.cancel()
            return
        probed = self._probe_sent is not None and self._probe_sent >= self._last_read
        if silent >= bound / 2 and not probed:
            self._probe()
            probed = True
        self._arm(call, self._last_read + (bound if probed else bound / 2) - now)

    # ------------------------------------------------------------------ the stream

    async def _supervise(self) -> None:
        attempt = 0
        failed_since = 0.0
        while not self._closed:
            if not self._all:
                # Idle: keep no stream open; a new watch restarts the supervisor.
                return
            call = None
            writer: asyncio.Task[None] | None = None
            cause: BaseException | None = None
            try:
                stub = pb.WatchStub(self._wire.channel())
                call = stub.Watch(metadata=(*(self._wire.metadata() or ()), REQUIRE_LEADER))
                self.streams_opened += 1
                self._check_version()
                while not self._outbox.empty():
                    self._outbox.get_nowait()
                self._watchers.clear()
                self._pending.clear()
                for watch in list(self._all):
                    watch._id = None
                    if not watch._awaiting_resync:  # its consumer re-creates it after the hook
                        self._send_create(watch)
                self._stream_up = True
                loop = asyncio.get_running_loop()
                self._call, self._last_read, self._stall = call, loop.time(), None
                self._probe_sent, self._own_probes = None, 0
                if self._stall_timeout is not None:
                    if not self.answers_progress:
                        self._probe()  # learn whether this server answers progress requests
                    self._arm(call, self._stall_timeout / 2)
                writer = loop.create_task(self._write_loop(call))
                got_any = False
                while True:
                    try:
                        msg = await call.read()
                    except asyncio.CancelledError:
                        # Our own cancel (a stall, a move) or a closed channel cancelled the
                        # call: a stream failure. Only the task's own cancellation ends it.
                        if task_cancelling() or self._closed or self._stopping:
                            raise
                        raise self._stall or EtcdRecipeError(
                            "the watch stream was cancelled (its channel closed)"
                        ) from None
                    self._last_read = loop.time()
                    if msg is grpc.aio.EOF:
                        raise EtcdRecipeError("the watch stream ended")
                    if not got_any:
                        got_any = True
                        attempt = 0
                    self._dispatch(msg)
                    if not self._all:
                        break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # stream failure: every watcher suspends and retries
                cause = exc
            finally:
                self._stream_up = False
                self._call = None
                if writer is not None:
                    writer.cancel()
                if call is not None:
                    call.cancel()
            if cause is None or isinstance(cause, StreamMoved):
                continue  # moved on purpose: re-open at once, nothing to report
            mapped: BaseException = cause
            if isinstance(cause, grpc.aio.AioRpcError):
                if is_auth_token_error(cause) and self._wire.auth is not None:
                    with contextlib.suppress(Exception):
                        await self._wire.refresh_auth()
                mapped = self._wire.error(cause, op="watch")
            log.debug("watch stream failed: %r", mapped)
            for watch in list(self._all):
                watch._on_failure(mapped)
            if attempt == 0:
                failed_since = time.monotonic()
            attempt += 1
            delay = _HUB_BACKOFF.next_delay(attempt, time.monotonic() - failed_since) or 1.0
            await asyncio.sleep(delay)

    def _check_version(self) -> None:
        """Learn (once per stream, until a member proves older) whether progress answers can
        be trusted: one Status call, in the background; failures leave it unknown."""
        if self.progress_ordered is False:
            return
        if self._version_check is not None and not self._version_check.done():
            return
        self._version_check = asyncio.get_running_loop().create_task(self._ask_version())

    async def _ask_version(self) -> None:
        try:
            status = await pb.MaintenanceStub(self._wire.channel()).Status(
                pb.StatusRequest(), metadata=self._wire.metadata(), timeout=5.0
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unknown: answers stay ignored until a later stream asks
            log.debug("could not learn the server's version: %r", exc)
            return
        ordered = progress_is_ordered(str(status.version))
        if not ordered:
            self.progress_ordered = False  # one older member is enough, for good
        elif self.progress_ordered is None:
            self.progress_ordered = True

    async def _write_loop(self, call: Any) -> None:
        while True:
            request = await self._outbox.get()
            await call.write(request)

    def _dispatch(self, msg: Any) -> None:
        revision = int(msg.header.revision)
        wid = int(msg.watch_id)
        if msg.created:
            # The reply to the oldest create still waiting (replies keep the requests' order).
            waiting = self._pending.popleft() if self._pending else None
            if wid == -1:  # refused (e.g. an invalid range or a permission error)
                log.warning("the server refused a watch request: %s", msg.cancel_reason)
                if waiting is not None:
                    self._on_server_cancel(waiting, str(msg.cancel_reason))
                return
            if waiting is None or waiting not in self._all:
                if not msg.canceled:
                    self._send_cancel(wid)  # closed before the server created it
                return
            waiting._id = wid
            self._watchers[wid] = waiting
        if wid == -1:
            self.answers_progress = True
            if self._own_probes > 0:  # the answer to a probe of ours: it proved the stream alive
                self._own_probes -= 1
                return
            # A reply to a stream-wide progress request. Before 3.5.8 etcd sends it ahead of
            # events still queued for the stream (etcd-io/etcd#15220): trusting it there loses
            # them, so only an ordering server's answer counts. Even then it advances only
            # watches known to be caught up (see Watch._on_stream_progress).
            if self.progress_ordered is not True:
                return
            for watch in self._watchers.values():
                watch._on_stream_progress(revision)
            return
        watch_or_none = self._watchers.get(wid)
        if watch_or_none is None:
            return
        watch = watch_or_none
        if msg.created and not msg.canceled:
            watch._on_created(revision)
            if watch._needs_recreate(revision):
                self.recreate(watch)
                return
        if msg.canceled:
            watch._server_active = False
            # etcd keeps a compacted watcher registered on the stream (its watcher count stays
            # up) until the client cancels it; a watch cancelled for any other reason is gone.
            self._forget_id(watch, cancel=msg.compact_revision > 0)
            if msg.compact_revision > 0:
                watch._on_compacted(int(msg.compact_revision))
                return
            reason = str(msg.cancel_reason)
            self._on_server_cancel(watch, reason)
            return
        if msg.events:
            events = [self._convert(ev) for ev in msg.events]
            watch._on_events(events, revision)
        elif not msg.created:
            watch._on_progress(revision)

    def _on_server_cancel(self, watch: Watch, reason: str) -> None:
        low = reason.lower()
        stale_token = "auth" in low or "token" in low
        if "permission denied" in low and self._wire.auth is not None:
            # etcd reports an expired stream token as "permission denied" too: refresh the
            # token once; only a denial with a fresh token is final.
            stale_token = not watch._auth_retried
            watch._auth_retried = True
        if "permission denied" in low and not stale_token:
            watch._error = PermissionDeniedError(f"watch on {watch.key!r}: permission denied")
            watch._close_now()
            return
        cause = EtcdRecipeError(f"the server cancelled the watch: {reason or 'no reason given'}")
        if not watch._on_failure(cause):
            return
        delay = watch._resilience.retry_policy.next_delay(max(watch._attempt, 1), 0.0) or 0.05
        if stale_token:
            # The stream's token is stale: refresh it and rebuild the whole stream.
            asyncio.get_running_loop().create_task(self._refresh_and_restart())
            return
        asyncio.get_running_loop().call_later(delay, self.recreate, watch)

    async def _refresh_and_restart(self) -> None:
        if self._wire.auth is not None:
            with contextlib.suppress(Exception):
                await self._wire.refresh_auth()
        if self._task is not None:
            self._stopping = True
            self._task.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            finally:
                self._stopping = False
        if self._all and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._supervise())

    def _convert(self, ev: Any) -> WatchEvent:
        strip = self._wire.strip
        kv = _kv(ev.kv, strip)
        prev = _kv(ev.prev_kv, strip) if ev.HasField("prev_kv") else None
        etype = EventType.DELETE if ev.type == pb.Event.DELETE else EventType.PUT
        return WatchEvent(etype, kv, prev)


def _kv(pb_kv: Any, strip: Callable[[bytes], bytes]) -> KeyValue:
    kv = KeyValue._from_pb(pb_kv)
    stripped = strip(kv.key)
    if stripped is kv.key:
        return kv
    return KeyValue(stripped, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
