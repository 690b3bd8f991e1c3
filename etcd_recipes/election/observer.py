"""Watching an election without running for it: :class:`LeaderObserver` and
:func:`leadership_events`.

Guaranteed: no term is dropped silently. The observer's watch is anchored at its first read,
so after a reconnect etcd replays what happened meanwhile and every term is reported, in
order, with its fencing token. When that history is gone (compacted while the observer was
cut off, or a watch that resumed from "now"), it reports :class:`LeadershipGap` -- terms may
have been missed -- followed by the current state read from etcd. It never reports a stale
leader after a recovery. It reports states (who leads now, and the value the leader
proclaimed: :meth:`LeaderSelector.proclaim <etcd_recipes.LeaderSelector.proclaim>`), observed
through one watch of the LEADER key and the term's proclaimed value; it does not run for the
election. A proclamation is reported as an :class:`Elected` with the same leader and fencing
token and the new ``value``; a value left by an earlier term (on another lease, or written
before the current LEADER key) is never reported as the current term's.
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
from ..types import EventType, KeyValue, RangeResult, WatchEvent
from ._keys import leader_key, leader_name, proclaimed_key
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
        self._said = proclaimed_key(path)
        self._keys = (self._leader.encode(), self._said.encode())
        self._kvs: dict[bytes, KeyValue] = {}  # the LEADER key and the proclaimed value
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

    async def _read(self) -> RangeResult:
        """One read of the LEADER key and the proclaimed value (the range between them holds
        nothing else of this election's layout; other keys in it are ignored)."""
        return await self._client.range(self._leader, range_end=self._keys[1] + b"\0")

    async def _do_start(self) -> None:
        read = await self._read()
        self._apply_read(read, notify=False)
        self._spawn(self._observe(read.revision), "watch")

    async def _observe(self, revision: int) -> None:
        async def resync() -> int:  # the history since self._revision was compacted
            read = await self._read()
            self._apply_gap(read)
            return read.revision + 1

        watch = self._client.watch(
            self._leader,
            range_end=self._keys[1] + b"\0",
            start_revision=revision + 1,
            resync=resync,
        )
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
                            self._apply_gap(await self._read())
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

    def _leadership(self) -> Elected | None:
        """The state the last seen LEADER key and proclaimed value make: the value counts
        only if it is on the LEADER key's lease and was written after that key was created."""
        kv = self._kvs.get(self._keys[0])
        if kv is None:
            return None
        said = self._kvs.get(self._keys[1])
        if said is not None and (said.lease != kv.lease or said.mod_revision <= kv.create_revision):
            said = None  # an earlier term's
        value = said.value if said is not None else None
        return Elected(leader_name(kv.value), kv.create_revision, value)

    def _take(self, read: RangeResult) -> None:
        self._revision = read.revision
        self._kvs = {kv.key: kv for kv in read.kvs if kv.key in self._keys}

    def _apply_read(self, read: RangeResult, *, notify: bool = True) -> None:
        if read.revision < self._revision:
            return
        self._take(read)
        self._set(self._leadership(), notify)

    def _apply_gap(self, read: RangeResult) -> None:
        """Apply a read made after history was lost: unless the same term still holds, say
        that terms may have been missed, then report the current state (even if unchanged)."""
        if read.revision < self._revision:
            return
        after = self._revision
        self._take(read)
        new = self._leadership()
        current = self._current
        if new is not None and current is not None and new.fencing_token == current.fencing_token:
            self._set(new)  # the same term (its value may have changed): none was missed
            return
        self._current = new
        self._publish(LeadershipGap(after, read.revision))
        self._publish(new if new is not None else Vacated())

    def _apply_event(self, event: WatchEvent) -> None:
        if event.kv.mod_revision < self._revision or event.kv.key not in self._keys:
            return  # already reflected by a later read, or not this election's key
        # Two keys can change at one revision (a lease expiry deletes both): apply each.
        self._revision = event.kv.mod_revision
        if event.type is EventType.PUT:
            self._kvs[event.kv.key] = event.kv
        else:
            self._kvs.pop(event.kv.key, None)
        self._set(self._leadership())

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
