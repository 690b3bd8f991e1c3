"""User callbacks of the blocking facade: listeners and hooks (hand-written, not generated).

* **Listeners** (``Callable[[E], Any]``) run on one daemon thread per client, in the order the
  async side emitted the events, never on the event loop: a slow or blocking listener delays
  only later listeners, never the recipes. The wrapper handed to the async side returns an
  awaitable that settles when the listener has run, so a listener's exception still reaches
  the async side's reporting (logged, and recorded where the async API records it).
* **Hooks** the async API awaits (``Callable[..., Awaitable[R]]``, e.g. ``establish``,
  ``resync``) are plain functions for sync users; they run in anyio worker threads and may
  call back into the facade. A cancellation that arrives while a hook runs waits for it to
  return, then is delivered (as it would be to an async hook at its next ``await``).

Example::

    import threading

    from etcd_recipes.sync._runtime.callbacks import Callbacks

    seen = []
    callbacks = Callbacks("doc-callbacks")
    wrapped = callbacks.listener(
        lambda event: seen.append((event, threading.current_thread().name)), awaitable=False
    )
    wrapped("an event")  # what the async side calls; queued for the listener thread
    callbacks.stop(10.0)  # drains the queue and joins the thread
    assert seen == [("an event", "doc-callbacks-listeners")]
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ["Callbacks"]

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger("etcd_recipes.sync")


class Callbacks:
    """The listener thread and hook threads of one runtime."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._wrappers: dict[tuple[Callable[..., Any], bool], Callable[..., Any]] = {}
        self._dispatcher: _Dispatcher | None = None
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def owns(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of ours (a listener or hook thread)."""
        return thread in self._threads

    # ------------------------------------------------------------------ listeners

    def listener(self, fn: Callable[..., Any], *, awaitable: bool) -> Callable[..., Any]:
        """The wrapper that queues ``fn`` for the listener thread (the same one per ``fn``,
        so removing a listener finds it again).

        With ``awaitable=True`` the wrapper returns a future settled with the listener's
        result (for async APIs that accept sync or async listeners); otherwise ``None``, and
        a listener's exception is logged.
        """
        if not callable(fn):
            raise TypeError(f"a listener must be callable, not {fn!r}")
        key = (fn, awaitable)
        with self._lock:
            existing = self._wrappers.get(key)
        if existing is not None:
            return existing

        def wrapper(*args: Any) -> Any:
            fut: asyncio.Future[Any] | None = None
            loop: asyncio.AbstractEventLoop | None = None
            if awaitable:
                with contextlib.suppress(RuntimeError):
                    loop = asyncio.get_running_loop()
                    fut = loop.create_future()
            self._dispatch(functools.partial(_run_listener, fn, args, loop, fut))
            return fut

        functools.update_wrapper(wrapper, fn)
        with self._lock:
            return self._wrappers.setdefault(key, wrapper)

    def _dispatch(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._dispatcher is None:
                self._dispatcher = _Dispatcher(f"{self._name}-listeners")
                self._threads.add(self._dispatcher.thread)
            dispatcher = self._dispatcher
        dispatcher.put(job)

    # ------------------------------------------------------------------ hooks

    def hook(self, fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
        """Wrap a blocking hook as the coroutine function the async API awaits."""
        if not callable(fn):
            raise TypeError(f"a hook must be callable, not {fn!r}")

        def in_thread(*args: P.args, **kwargs: P.kwargs) -> T:
            self._threads.add(threading.current_thread())
            return fn(*args, **kwargs)

        async def hook(*args: P.args, **kwargs: P.kwargs) -> T:
            result = await anyio.to_thread.run_sync(functools.partial(in_thread, *args, **kwargs))
            # Like an async hook cancelled mid-await: a cancellation that arrived while the
            # thread ran is delivered now, so the caller's cleanup for a failed hook runs.
            await anyio.lowlevel.checkpoint_if_cancelled()
            return result

        functools.update_wrapper(hook, fn)
        return hook

    # ------------------------------------------------------------------ shutdown

    def stop(self, timeout: float) -> None:
        """Let the listener thread drain and stop; join it and the hook threads (bounded).

        Called on the loop thread after the loop ended (anyio has then told its idle worker
        threads to exit).
        """
        end = time.monotonic() + timeout
        with self._lock:
            dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.stop()
        current = threading.current_thread()
        for thread in list(self._threads):
            if thread is not current:
                thread.join(max(0.0, end - time.monotonic()))


def _run_listener(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    loop: asyncio.AbstractEventLoop | None,
    fut: asyncio.Future[Any] | None,
) -> None:
    result: Any = None
    error: BaseException | None = None
    try:
        result = fn(*args)
    except BaseException as exc:  # handed back to the async side (or logged)
        error = exc
    if loop is not None and fut is not None:
        try:
            loop.call_soon_threadsafe(_settle, fut, result, error)
            return
        except RuntimeError:  # the loop is closed: nobody awaits the result any more
            pass
    if error is not None:
        log.warning("listener %r raised %r", fn, error, exc_info=error)


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class _Dispatcher:
    """One daemon thread running queued jobs in order."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def put(self, job: Callable[[], None]) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job()
