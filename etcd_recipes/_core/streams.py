"""Push surfaces as async iterators and ordered listeners: one fan-out primitive.

A :class:`Broadcast` is fed by a recipe (``publish()`` never blocks and never runs user code)
and read two ways:

* :class:`EventStream` -- an async iterator with a **bounded** buffer. It is registered when
  it is created and unregistered when it is closed, when the loop that iterates it breaks
  out and drops it, or when its buffer overflows. An overflow is never silent and never
  blocks the producer: the stream yields what it buffered, then raises
  :class:`~etcd_recipes.errors.EventStreamOverflowError`. A *conflated* stream keeps only
  the newest item instead (for states, where only the latest matters).
* listeners -- each with its own ordered dispatcher task, so a slow (or ``async``) listener
  delays only itself and sees every item in order. A listener that raises is reported to the
  broadcast's error sink and keeps receiving.

A producer that fails for good calls :meth:`Broadcast.fail`: every stream then raises that
error after its buffered items (a stream created later yields the current state first, if the
broadcast has one, then raises it); listeners stay registered.

Not guaranteed: items published before a stream or listener was registered are not replayed;
a broadcast of a state gives a new reader the current state as its first item instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from ..errors import EventStreamOverflowError, InvalidArgumentError
from .logctx import library_logger

__all__ = ["DEFAULT_STREAM_BUFFER", "Broadcast", "EventStream"]

log = library_logger("etcd_recipes.streams")

T = TypeVar("T")

DEFAULT_STREAM_BUFFER = 10_000
"""Items an :class:`EventStream` buffers before it overflows."""

_ErrorSink = Callable[[str, BaseException], Any]


class EventStream(Generic[T]):
    """An async iterator over a recipe's events, with a bounded buffer.

    Iterate it; ``break`` (or :meth:`aclose`, or leaving ``async with``) unregisters it. If
    the consumer falls ``maxsize`` items behind, the stream ends with
    :class:`~etcd_recipes.errors.EventStreamOverflowError` after the buffered items -- the
    producer is never blocked and nothing is dropped silently.

    Example::

        from etcd_recipes import DistributedMutex

        mutex = DistributedMutex(client, f"{prefix}/job")
        async with mutex.connection_states() as states:
            print(await anext(states))  # the current state first: ConnectionState.CONNECTED
        await mutex.aclose()
    """

    __slots__ = (
        "__weakref__",
        "_broadcast",
        "_closed",
        "_conflate",
        "_error",
        "_items",
        "_maxsize",
        "_overflowed",
        "_waiter",
    )

    def __init__(self, broadcast: Broadcast[T], maxsize: int, conflate: bool) -> None:
        self._broadcast: Broadcast[T] | None = broadcast
        self._maxsize = maxsize
        self._conflate = conflate
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._overflowed = False
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        state = "overflowed" if self._overflowed else "closed" if self._closed else "open"
        name = self._broadcast.name if self._broadcast is not None else "-"
        return f"<EventStream {name} {state} buffered={len(self._items)}/{self._maxsize}>"

    @property
    def buffered(self) -> int:
        """Items received and not yet iterated."""
        return len(self._items)

    def __aiter__(self) -> EventStream[T]:
        return self

    async def __anext__(self) -> T:
        while not self._items:
            if self._overflowed:
                raise EventStreamOverflowError(
                    f"{self._name()}: the consumer fell {self._maxsize} items behind; "
                    "later items were not buffered (iterate faster or pass a larger maxsize)",
                    maxsize=self._maxsize,
                )
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    async def aclose(self) -> None:
        """Unregister the stream; iteration then ends after nothing more. Idempotent."""
        self._items.clear()
        self._end()

    async def __aenter__(self) -> EventStream[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ---------------------------------------------------------------- producer side

    def _name(self) -> str:
        return self._broadcast.name if self._broadcast is not None else "event stream"

    def _offer(self, item: T) -> None:
        if self._closed:
            return
        if self._conflate:
            self._items.clear()
        elif len(self._items) >= self._maxsize:
            self._overflowed = True
            log.warning("%s: a consumer fell %d items behind; ended", self._name(), self._maxsize)
            self._end()
            return
        self._items.append(item)
        self._wake()

    def _end(self, error: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._error = error
        broadcast, self._broadcast = self._broadcast, None
        if broadcast is not None and broadcast._streams is not None:
            broadcast._streams.discard(self)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _running_in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Dispatcher(Generic[T]):
    """One listener's ordered queue and the task that drains it."""

    def __init__(self, listener: Callable[[T], Any], broadcast: Broadcast[T]) -> None:
        self.listener = listener
        self._broadcast = broadcast
        self._items: deque[T] = deque()
        self._task: asyncio.Task[None] | None = None

    def offer(self, item: T) -> None:
        self._items.append(item)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._drain(), name=f"{self._broadcast.name}-listener"
            )

    async def _drain(self) -> None:
        while self._items:
            item = self._items.popleft()
            try:
                result = self.listener(item)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._broadcast._report(exc)

    def stop(self) -> asyncio.Task[None] | None:
        self._items.clear()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            return task
        return None


class Broadcast(Generic[T]):
    """Fan one producer's items out to bounded :class:`EventStream` s and ordered listeners.

    ``current`` (optional) gives the item a *new* stream starts with -- the present state
    (``None``: nothing to start with yet); with ``listeners_start_current``, new listeners
    start with it too.
    """

    __slots__ = (
        "_closed",
        "_current",
        "_dispatchers",
        "_failure",
        "_listeners_start_current",
        "_loop",
        "_on_error",
        "_streams",
        "name",
    )

    def __init__(
        self,
        name: str,
        on_error: _ErrorSink | None = None,
        *,
        current: Callable[[], T | None] | None = None,
        listeners_start_current: bool = False,
    ) -> None:
        self.name = name
        self._on_error = on_error
        self._current = current
        self._listeners_start_current = listeners_start_current
        # Created with the first stream: most recipes' broadcasts never get one (a parked
        # waiter's recipe carries two or three, and a WeakSet costs ~1 KB).
        self._streams: weakref.WeakSet[EventStream[T]] | None = None
        self._dispatchers: list[_Dispatcher[T]] = []
        self._closed = False
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # of the readers, once registered

    def __repr__(self) -> str:
        return (
            f"<Broadcast {self.name} streams={self.stream_count} "
            f"listeners={len(self._dispatchers)}{' closed' if self._closed else ''}>"
        )

    @property
    def stream_count(self) -> int:
        """Registered streams (closed, overflowed and dropped ones excluded)."""
        return len(self._streams) if self._streams is not None else 0

    @property
    def listener_count(self) -> int:
        return len(self._dispatchers)

    def stream(
        self, maxsize: int = DEFAULT_STREAM_BUFFER, *, conflate: bool = False
    ) -> EventStream[T]:
        """A new registered stream (already ended if the broadcast is closed; after
        :meth:`fail`, the current state, if any, then the failure)."""
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise InvalidArgumentError(f"maxsize must be a positive int, got {maxsize!r}")
        self._loop = asyncio.get_running_loop()
        stream = EventStream(self, maxsize, conflate)
        if self._closed:
            stream._end()
            return stream
        if self._failure is not None:
            if self._current is not None and (first := self._current()) is not None:
                stream._offer(first)
            stream._end(self._failure)
            return stream
        if self._streams is None:
            self._streams = weakref.WeakSet()
        self._streams.add(stream)
        if self._current is not None and (first := self._current()) is not None:
            stream._offer(first)
        return stream

    def add_listener(self, listener: Callable[[T], Any]) -> None:
        """Call ``listener(item)`` for every later item, in order, from its own task."""
        if not callable(listener):
            raise TypeError(f"{self.name} listener must be callable")
        with contextlib.suppress(RuntimeError):  # registered off the loop: bound at first item
            self._loop = asyncio.get_running_loop()
        dispatcher = _Dispatcher(listener, self)
        self._dispatchers.append(dispatcher)
        first = self._current() if self._listeners_start_current and self._current else None
        if first is not None:
            dispatcher.offer(first)

    def remove_listener(self, listener: Callable[[T], Any]) -> None:
        """Stop calling ``listener`` (items queued for it are dropped); unknown ones are
        ignored."""
        for dispatcher in list(self._dispatchers):
            if dispatcher.listener == listener:
                self._dispatchers.remove(dispatcher)
                dispatcher.stop()
                return

    def clear_listeners(self) -> None:
        for dispatcher in self._dispatchers:
            dispatcher.stop()
        self._dispatchers.clear()

    def publish(self, item: T) -> None:
        """Offer ``item`` to every stream and listener. Never blocks, never runs user code.

        Safe from any thread: off the readers' loop, the item is handed to that loop."""
        if self._closed or not (self._streams or self._dispatchers):
            return
        loop = self._loop
        if loop is not None and not _running_in(loop):
            loop.call_soon_threadsafe(self.publish, item)
            return
        for stream in list(self._streams or ()):
            stream._offer(item)
        for dispatcher in self._dispatchers:
            dispatcher.offer(item)

    def fail(self, error: BaseException) -> None:
        """End every stream with ``error`` (raised after its buffered items), now and for
        streams created later; listeners stay registered. Call it on the readers' loop."""
        if self._closed or self._failure is not None:
            return
        self._failure = error
        for stream in list(self._streams or ()):
            stream._end(error)

    async def aclose(self) -> None:
        """End every stream (after their buffered items) and stop every listener."""
        self._closed = True
        for stream in list(self._streams or ()):
            stream._end()
        tasks = [t for d in self._dispatchers if (t := d.stop()) is not None]
        self._dispatchers.clear()
        if tasks:
            await asyncio.wait(tasks)  # cancelled listeners finish; their outcome is theirs

    def _report(self, exc: BaseException) -> None:
        log.warning("%s listener raised %r", self.name, exc, exc_info=exc)
        if self._on_error is not None:
            try:
                self._on_error(f"{self.name}-listener", exc)
            except Exception:  # pragma: no cover - the sink itself failed
                log.exception("error sink failed")
