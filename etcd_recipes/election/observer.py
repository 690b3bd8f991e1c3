"""Watching an election without running for it: :class:`LeaderObserver` and
:func:`leadership_events`.

Guaranteed: no term is dropped silently. The observer's watch is anchored at its first read,
so after a reconnect etcd replays what happened meanwhile and every term is reported, in
order, with its fencing token. When that history is gone (compacted while the observer was
cut off, or a watch that resumed from "now"), it reports :class:`LeadershipGap` -- terms may
have been missed -- followed by the current state read from etcd. It never reports a stale
leader after a recovery. It reports states (who leads now), observed through one watch; it
does not run for the election.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.validate import check_count
from .._recipe.recipe import Recipe
from ..errors import EtcdRecipeError, WatchFailedError
from ..events import ConnectionState, WatchFailed, WatchResubscribed
from ..types import EventType, RangeResult, WatchEvent
from ._keys import leader_key, leader_name
from .terms import Elected, LeadershipEvent, LeadershipGap, Vacated

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["LeaderObserver", "leadership_events"]

log = library_logger("etcd_recipes.election")


class LeaderObserver(Recipe):
    """Reports who leads an election, without running for it.

    Example::

        from etcd_recipes import Elected, LeaderLatch, LeaderObserver

        async with LeaderObserver(client, f"{prefix}/election") as observer:
            print("leader now:", observer.current_leader)  # None: nobody runs for it yet
            async with LeaderLatch(client, f"{prefix}/election", client_id="node-1"):
                async for event in observer.events():  # the current state first, then changes
                    print(event)  # Vacated(), then Elected(leader='node-1', ...)
                    if isinstance(event, Elected):
                        break

    Listeners (:meth:`add_listener`) get each change, not the state at ``start()``; the
    iterator of :meth:`events` starts with the current state. After a reconnect the changes
    made meanwhile are replayed (every term, in order); when they were compacted away, a
    :class:`LeadershipGap` ("terms may have been missed") comes first, then the current state.
    ``metrics_name`` is the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    one_shot = True

    def __init__(self, client: EtcdClient, path: str, *, metrics_name: str = "") -> None:
        super().__init__(client, path, metrics_name=metrics_name)
        self._leader = leader_key(path)
        self._current: Elected | None = None
        self._revision = 0
        self._listeners = ListenerSet("leadership-event", self._record_listener_error)
        self._events: Broadcast[LeadershipEvent] = self._broadcast(
            "leadership-event", current=lambda: self.current
        )

    @property
    def current_leader(self) -> str | None:
        """The leader's client id, or ``None`` when nobody leads (as last observed)."""
        return self._current.leader if self._current is not None else None

    @property
    def current(self) -> Elected | Vacated:
        """The current state as an event: :class:`Elected` (with the fencing token) or
        :class:`Vacated`."""
        return self._current if self._current is not None else Vacated()

    def add_listener(self, listener: Callable[[LeadershipEvent], Any]) -> None:
        """Call ``listener(event)`` for every change of leader (not for the initial state)."""
        self._listeners.add(listener)

    def remove_listener(self, listener: Callable[[LeadershipEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._listeners.remove(listener)

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[LeadershipEvent]:
        """The current state, then every change, until the observer is closed.

        Bounded by ``maxsize`` (see :class:`~etcd_recipes.EventStream`); breaking out of the
        loop unregisters it. Raises :class:`~etcd_recipes.errors.WatchFailedError` (after the
        states it buffered) if the watch gave up.

        Example::

            from etcd_recipes import Elected, LeaderLatch, LeaderObserver

            async with LeaderObserver(client, f"{prefix}/election") as observer:
                async with LeaderLatch(client, f"{prefix}/election", client_id="me"):
                    async for event in observer.events():
                        if isinstance(event, Elected) and event.leader == "me":
                            break
        """
        check_count(maxsize, what="maxsize")
        self._check_started()
        return self._events.stream(maxsize)

    async def _do_start(self) -> None:
        read = await self._client.range(self._leader)
        self._apply_read(read, notify=False)
        self._spawn(self._observe(read.revision), "watch")

    async def _observe(self, revision: int) -> None:
        async def resync() -> int:  # the history since self._revision was compacted
            read = await self._client.range(self._leader)
            self._apply_gap(read)
            return read.revision + 1

        watch = self._client.watch(self._leader, start_revision=revision + 1, resync=resync)
        failure: EtcdRecipeError
        try:
            async with watch:
                async for item in watch.items():
                    if isinstance(item, WatchEvent):
                        self._apply_event(item)
                        continue
                    self._on_recovery_event(item)
                    if isinstance(item, WatchResubscribed) and item.resume_revision == 0:
                        # Resumed from "now": what happened meanwhile will not be replayed.
                        try:
                            self._apply_gap(await self._client.range(self._leader))
                        except EtcdRecipeError as exc:  # the watch's own events still follow
                            self._record_exception(exc, "re-read")
                    # Otherwise the watch resumed where it stopped: etcd replays every change
                    # made meanwhile, so each missed term is reported from the events. (A
                    # re-read here would jump past them and drop those terms.)
                    elif isinstance(item, WatchFailed):
                        break
            failure = WatchFailedError(f"{self.exception_context}: the watch on LEADER failed")
        except EtcdRecipeError as exc:  # the watch failed for good, or the client was closed
            failure = exc
        if self.is_closed:
            return
        self._record_exception(failure, "watch")
        self._set_state(ConnectionState.LOST)
        self._events.fail(failure)

    def _apply_read(self, read: RangeResult, *, notify: bool = True) -> None:
        if read.revision < self._revision:
            return
        self._revision = read.revision
        kv = read.kvs[0] if read.kvs else None
        self._set(Elected(leader_name(kv.value), kv.create_revision) if kv else None, notify)

    def _apply_gap(self, read: RangeResult) -> None:
        """Apply a read made after history was lost: unless the same term still holds, say
        that terms may have been missed, then report the current state (even if unchanged)."""
        if read.revision < self._revision:
            return
        after, self._revision = self._revision, read.revision
        kv = read.kvs[0] if read.kvs else None
        new = Elected(leader_name(kv.value), kv.create_revision) if kv else None
        if new is not None and new == self._current:
            return  # the term we reported is still current: none can have been missed
        self._current = new
        self._publish(LeadershipGap(after, read.revision))
        self._publish(new if new is not None else Vacated())

    def _apply_event(self, event: WatchEvent) -> None:
        if event.kv.mod_revision <= self._revision:
            return  # already reflected by a later read
        self._revision = event.kv.mod_revision
        if event.type is EventType.PUT:
            self._set(Elected(leader_name(event.kv.value), event.kv.create_revision))
        else:
            self._set(None)

    def _set(self, new: Elected | None, notify: bool = True) -> None:
        if new == self._current:
            return
        self._current = new
        if not notify:
            return
        self._publish(new if new is not None else Vacated())

    def _publish(self, event: LeadershipEvent) -> None:
        log.info("%s: %s", self.exception_context, event)
        self._listeners.emit(event)
        self._events.publish(event)


async def leadership_events(client: EtcdClient, path: str) -> AsyncIterator[LeadershipEvent]:
    """The leadership events of ``path`` (current state first) from a private
    :class:`LeaderObserver` that lives as long as the iteration (the Kotlin library's
    ``leadershipAsFlow``). Close the iterator (``contextlib.aclosing``) to stop early.

    Example::

        import contextlib
        from etcd_recipes import Elected, LeaderLatch, leadership_events

        async with LeaderLatch(client, f"{prefix}/election", client_id="node-1"):
            path = f"{prefix}/election"
            async with contextlib.aclosing(leadership_events(client, path)) as events:
                async for event in events:
                    print(event)  # Elected(leader='node-1', ...) once the latch has won
                    if isinstance(event, Elected):
                        break
    """
    async with LeaderObserver(client, path) as observer:
        async for event in observer.events():
            yield event
