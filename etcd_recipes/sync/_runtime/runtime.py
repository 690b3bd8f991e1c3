"""The private event-loop thread behind :mod:`etcd_recipes.sync` (hand-written, not generated).

One :class:`Runtime` per sync client: a daemon thread running its own asyncio loop, on which
the async client is created and lives (grpc.aio objects are bound to the loop that created
them). Every blocking call submits a coroutine to that loop and waits -- except the plain KV
calls, which :meth:`Runtime.direct` sends from the calling thread (``client/blocking.py``: no
hand-off, the same guards, deadline and errors):

* ``KeyboardInterrupt`` (or any exception raised in the waiting thread) cancels the coroutine
  through an anyio cancel scope, so shielded cleanup runs to completion; the caller waits for
  it (at most :data:`FACADE_CLEANUP_WAIT` seconds) and then re-raises;
* inside :func:`fail_after`, a call that passes the deadline is cancelled the same way and
  raises :class:`~etcd_recipes.errors.EtcdTimeoutError` once its cleanup is done;
* calling from a thread with a running event loop (including the loop thread itself) raises
  :class:`~etcd_recipes.errors.UsageError` instead of deadlocking;
* listeners run on one listener thread per runtime (in order, off the loop); hooks the async
  API awaits run in anyio worker threads and may call back into the facade (``callbacks``);
* :meth:`Runtime.stop` cancels what is still running, closes the root object (the async
  client), stops the loop and joins every thread the runtime started.

**Why a hand-made loop thread and not anyio's** ``BlockingPortal``. The design (architecture
§5) names the portal as the well-kept tool, and it does give what a facade needs first: a loop in a
daemon thread with a clean start and stop (``start_blocking_portal``), ``call()`` for
coroutines and plain functions, and ``wrap_async_context_manager`` entering and exiting in one
task (the design :class:`~.calls.ContextRun` follows). What it lacks is the contract this
facade exists for (§4): when the waiting thread gets ``KeyboardInterrupt`` or a
:func:`fail_after` deadline passes, cancel the coroutine and *wait for its cleanup* before
raising. A portal call is a ``concurrent.futures.Future``; ``future.cancel()`` cancels the
task's scope but marks the future done at once, before the cleanup has even started (checked
with anyio 4.16), and nothing else reports the task's end -- so the wait-for-cleanup needs
this module's own per-call done flag and scope either way, which is most of
:class:`~.calls.Call`. It has no deadlines (``fail_after`` here is a per-thread stack carried
into each call's cancel scope, so the timeout and the cleanup wait are one mechanism), no fork
detection (in a forked child ``portal.call()`` waits forever; here it raises
:class:`~etcd_recipes.errors.ForkedProcessError`), no shutdown order (calls first, then the
client's own blocks, then ``aclose()``), and no notion of the listener and hook threads
``stop()`` must join or must not join from. Using the portal only for the thread/loop
lifecycle would save the ~20 lines of ``_run``/``_main`` but keep all of the above, and hold a
generator context manager open across the client's lifetime (entered in ``__init__``, exited
from ``stop()``, the finalizer, or a thread that must not join itself). It also costs per call:
``portal.call()`` spawns a task through a blocking ``from_thread.run_sync`` round trip and then
waits on a ``Future`` (a condition variable), where :meth:`Runtime.call` does one
``call_soon_threadsafe`` and parks on a pre-acquired lock. Measured on the shared, loaded
2-core dev box (no-op calls, medians of 3-5 rounds, three runs): a coroutine 57-82 us here vs
172-192 us through the portal, a plain function 28-36 us vs 127-223 us. So the runtime stays
hand-made; the portal is the reference it is checked against (``benchmarks/sync_portal.py``
repeats the measurement).

Example::

    import asyncio

    from etcd_recipes.sync._runtime.runtime import Runtime

    rt = Runtime()
    try:
        assert rt.call(asyncio.sleep, 0, "done") == "done"
    finally:
        rt.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import math
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import anyio

from ..._core.caller import CALLER
from ..._core.shield import CLEANUP_TIMEOUT
from ...client.blocking import FAIL_AFTER_EXPIRED
from ...client.rpc import Unary
from ...errors import ClientClosedError, EtcdTimeoutError, ForkedProcessError, UsageError
from .callbacks import Callbacks
from .calls import (
    Call,
    ContextRun,
    current_deadline,
    fail_after,
    refuse_running_loop,
    running_loop_here,
    scope_deadline,
)

if TYPE_CHECKING:
    from .twin import SyncTwin

__all__ = [
    "FACADE_CLEANUP_WAIT",
    "Runtime",
    "fail_after",
    "register_twin_class",
    "running_loop_here",
    "twin_class_for",
]

P = ParamSpec("P")
T = TypeVar("T")


def _blocks(holder: Any) -> dict[int, list[ContextRun]]:
    """The open ``with`` blocks on ``holder``, a stack per thread (blocks nest per thread)."""
    found: dict[int, list[ContextRun]] = holder.__dict__.setdefault("_sync_context_runs", {})
    return found


FACADE_CLEANUP_WAIT = 2 * CLEANUP_TIMEOUT
"""Seconds a blocking call waits for its cancelled coroutine's cleanup (10 s).

The longest shielded cleanup the async side runs is a recipe's ``aclose()``, which
``_recipe/recipe.py`` bounds at twice :data:`etcd_recipes._core.shield.CLEANUP_TIMEOUT` (the
bound of one cleanup step); waiting that long means the facade never walks away from a cleanup
the loop is still running. Shutdown uses the same bound per phase.
"""

_running_loop = asyncio._get_running_loop  # None outside a loop, without raising
_POLL = 0.25  # the waiting thread wakes this often (Ctrl-C is seen on every platform)
_ids = itertools.count(1)
_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()
log = logging.getLogger("etcd_recipes.sync")

_TWINS: dict[type, type[SyncTwin]] = {}
"""Async class -> its twin class: the runtime owns the registry it wraps results with, so
``twin`` imports the runtime and never the other way round (no run-time import cycle)."""


def register_twin_class(async_type: type, twin: type[SyncTwin]) -> None:
    """Record ``twin`` as the blocking twin of ``async_type`` (``SyncTwin.__init_subclass__``)."""
    _TWINS[async_type] = twin


def twin_class_for(async_type: type) -> type[SyncTwin]:
    """The twin class registered for ``async_type`` (or its nearest twinned base)."""
    for klass in async_type.__mro__:
        twin = _TWINS.get(klass)
        if twin is not None:
            return twin
    raise TypeError(f"etcd_recipes.sync has no blocking twin for {async_type.__qualname__}")


def _twinned(async_type: type) -> bool:
    return any(klass in _TWINS for klass in async_type.__mro__)


class Runtime:
    """A private event-loop thread; see the module docstring."""

    def __init__(self) -> None:
        self._id = next(_ids)
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._state = "starting"  # starting -> running -> stopping -> stopped
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        self._stop_event: asyncio.Event | None = None
        self._loop_ident = 0
        self._tasks: dict[asyncio.Task[None], Call] = {}
        self._scope_class: type[anyio.CancelScope] = anyio.CancelScope
        self.root: Any = None
        """The async object closed (``aclose()``) when the runtime stops: the client."""
        self._twins: weakref.WeakValueDictionary[int, SyncTwin] = weakref.WeakValueDictionary()
        self._callbacks = Callbacks(f"etcd-recipes-sync-{self._id}")
        self._thread = threading.Thread(
            target=self._run, name=f"etcd-recipes-sync-{self._id}", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._state != "running":
            raise RuntimeError("the etcd-recipes event-loop thread failed to start")
        _runtimes.add(self)

    @classmethod
    def create(cls, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> tuple[Runtime, T]:
        """Start a runtime and run the plain factory ``fn`` on its loop thread."""
        refuse_running_loop()
        rt = cls()
        try:
            return rt, rt.call_sync(fn, *args, **kwargs)
        except BaseException:
            rt.stop()
            raise

    @classmethod
    def create_awaiting(
        cls, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> tuple[Runtime, T]:
        """Start a runtime and await the async factory ``fn`` on its loop."""
        refuse_running_loop()
        rt = cls()
        try:
            return rt, rt.call(fn, *args, **kwargs)
        except BaseException:
            rt.stop()
            raise

    # ------------------------------------------------------------------ state

    @property
    def is_running(self) -> bool:
        """Whether calls are accepted (False once :meth:`stop` was called)."""
        return self._state == "running"

    @property
    def loop_thread(self) -> threading.Thread:
        """The thread that runs the event loop."""
        return self._thread

    def _check_caller(self) -> None:
        if os.getpid() != self._pid:
            raise ForkedProcessError(
                "this sync client was created in another process (before fork()); create a "
                "new client in the child"
            )
        if threading.get_ident() == self._loop_ident:
            raise UsageError(
                "a blocking etcd_recipes.sync call was made on the client's own event-loop "
                "thread; it would deadlock"
            )
        refuse_running_loop()

    def _closed_error(self) -> ClientClosedError:
        return ClientClosedError("the sync client was closed")

    def _submit(self, callback: Callable[..., None], *args: Any) -> None:
        """Schedule ``callback(*args)`` on the loop: the one hand-over to the loop thread."""
        with self._lock:
            if self._state != "running":
                raise self._closed_error()
            assert self._loop is not None
            self._loop.call_soon_threadsafe(callback, *args, context=self._context)

    # ------------------------------------------------------------------ calls

    def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await ``fn(*args, **kwargs)`` on the loop and return its result (see module doc)."""
        self._check_caller()
        call = Call(current_deadline())
        self._submit(self._spawn, fn, args, kwargs, call)
        return self._wait(call)  # type: ignore[no-any-return]

    def call_closing(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T | None:
        """Like :meth:`call` for close-like calls: no deadline, and a no-op once stopped."""
        self._check_caller()
        if self._state != "running":
            return None
        call = Call(None)
        try:
            self._submit(self._spawn, fn, args, kwargs, call)
        except ClientClosedError:
            return None
        return self._wait(call)  # type: ignore[no-any-return]

    def call_sync(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a plain function on the loop thread (inline once the runtime has stopped)."""
        self._check_caller()
        if self._state != "running":
            return fn(*args, **kwargs)
        call = Call(None)

        def run(c: Call) -> None:
            token = CALLER.set(c.caller)  # (the shared context: reset below)
            try:
                c.result = fn(*args, **kwargs)
            except BaseException as exc:
                c.error = exc
            finally:
                CALLER.reset(token)
                c.done.set()

        try:
            self._submit(run, call)
        except ClientClosedError:
            return fn(*args, **kwargs)
        return self._wait(call)  # type: ignore[no-any-return]

    def direct(self, plan: Callable[P, Unary[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Send the plain KV call ``plan(*args, **kwargs)`` describes from the calling thread
        (grpc's blocking stub; no hand-off to the loop): see ``client/blocking.py``. A
        ``detached`` one (a read-only transaction) is awaited on the loop like :meth:`call`."""
        if os.getpid() != self._pid or threading.get_ident() == self._loop_ident:
            self._check_caller()  # raises the fork or deadlock error
        if _running_loop() is not None:
            refuse_running_loop()
        if self._state != "running":
            raise self._closed_error()
        unary = plan(*args, **kwargs)  # checks the arguments, builds the request: here
        if unary.detached:  # a read-only transaction: never cancelled server-side
            return self.call(unary.send)
        return unary.send_blocking(current_deadline())

    def next(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` (an ``__anext__``); ``StopAsyncIteration`` becomes ``StopIteration``."""
        try:
            return self.call(fn)
        except StopAsyncIteration:
            raise StopIteration from None

    def _spawn(self, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any, call: Call) -> None:
        assert self._loop is not None
        # Always under an anyio cancel scope: cancelling the task natively would pierce anyio
        # shields inside the call (e.g. anyio.to_thread waiting for a hook to return).
        task = self._loop.create_task(self._execute(call, fn, args, kwargs))
        self._tasks[task] = call  # _execute removes it as it ends (no done-callback handle)

    async def _execute(
        self, call: Call, fn: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
    ) -> None:
        CALLER.set(call.caller)  # this task's own context: holds belong to the thread
        try:
            with self._scope_class(deadline=scope_deadline(call.deadline)) as scope:
                call.scope = scope
                if call.reason:
                    scope.cancel()
                call.result = await fn(*args, **kwargs)
            if scope.cancelled_caught:
                call.error = self._cancel_error(call)
        except BaseException as exc:  # everything is handed to the waiting thread
            call.error = exc
        finally:
            call.scope = None
            self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            call.done.set()

    def _cancel_error(self, call: Call) -> BaseException | None:
        if call.reason == "shutdown":
            return ClientClosedError("the sync client was closed while this call was waiting")
        if call.reason == "interrupt":
            return None  # the waiting thread re-raises its own exception
        return EtcdTimeoutError(FAIL_AFTER_EXPIRED)

    def _wait(self, call: Call) -> Any:
        try:
            while not call.done.wait(_POLL):
                pass
        except BaseException:  # KeyboardInterrupt (or a signal handler's exception)
            self._interrupt(call)
            raise
        error = call.error
        if error is not None:
            call.error = None
            try:
                raise error
            finally:
                del error
        return call.result

    def _interrupt(self, call: Call) -> None:
        """Cancel ``call`` and wait (bounded) until its cleanup has finished."""
        loop = self._loop
        if loop is not None and not call.done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(call.cancel, "interrupt")
        if not call.done.wait(FACADE_CLEANUP_WAIT):
            log.warning(
                "an interrupted etcd_recipes.sync call did not finish its cleanup within %ss",
                FACADE_CLEANUP_WAIT,
            )

    # ------------------------------------------------------------------ with blocks

    def enter(self, holder: Any, cm: Any) -> Any:
        """Run ``cm.__aenter__()`` in a task that stays open until :meth:`exit`.

        ``holder`` keeps the open block (a stack, so blocks on one object may nest).
        """
        self._check_caller()
        run = ContextRun(cm, current_deadline())
        self._submit(self._spawn_context, run)
        try:
            while not run.entered.wait(_POLL):
                pass
        except BaseException:
            self._interrupt(run)
            raise
        if run.done.is_set():  # __aenter__ failed (or was cancelled): no block to exit
            self._wait(run)
            raise self._closed_error()  # pragma: no cover - _wait raised already
        stack = _blocks(holder).setdefault(threading.get_ident(), [])
        stack.append(run)
        return run.result

    def exit(
        self,
        holder: Any,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        """Run the ``__aexit__`` of the innermost block :meth:`enter` opened on ``holder``."""
        self._check_caller()
        stack = _blocks(holder).get(threading.get_ident(), [])
        if not stack:
            raise UsageError("__exit__ without a matching __enter__ in this thread")
        run = stack.pop()
        if not stack:
            del _blocks(holder)[threading.get_ident()]
        run.exit_args = (exc_type, exc, tb)
        loop = self._loop
        if not run.done.is_set() and loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._release_context, run)
        try:
            return self._wait(run)
        except ClientClosedError:
            if run.reason == "shutdown":
                return None  # the client was closed first; the block was cleaned up then
            raise

    def _spawn_context(self, run: Call) -> None:
        assert isinstance(run, ContextRun)
        assert self._loop is not None
        task = self._loop.create_task(self._run_context(run))
        self._tasks[task] = run  # _run_context removes it as it ends

    def _release_context(self, run: ContextRun) -> None:
        if run.exit_event is not None:
            run.exit_event.set()

    async def _run_context(self, run: ContextRun) -> None:
        cm = run.obj
        CALLER.set(run.caller)
        try:
            # Only this outer scope: a context manager that opens a cancel scope or task group
            # in __aenter__ must close it in __aexit__ with nothing of ours in between (LIFO).
            with anyio.CancelScope(deadline=scope_deadline(run.deadline)) as scope:
                run.scope = scope
                if run.reason:
                    scope.cancel()
                run.exit_event = asyncio.Event()
                run.result = await cm.__aenter__()
                scope.deadline = math.inf  # fail_after() bounds entering, not the block
                run.entered.set()
                await self._hold_open(run, cm, run.exit_event)
            if scope.cancelled_caught:
                run.error = self._cancel_error(run)
        except BaseException as exc:
            run.error = exc
        finally:
            run.scope = None
            run.exit_args = (None, None, None)
            self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            run.done.set()
            run.entered.set()

    @staticmethod
    async def _hold_open(run: ContextRun, cm: Any, exit_event: asyncio.Event) -> None:
        """Wait until the sync block ends, then exit the way ``async with`` would."""
        try:
            await exit_event.wait()
        except BaseException as exc:
            # Cancelled while the block runs: by the context manager itself (a lost hold
            # cancels its scope), or by shutdown/Ctrl-C. __aexit__ sees that, like a body
            # interrupted in `async with`; its own cleanup is shielded where it must be.
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            return
        run.result = await cm.__aexit__(*run.exit_args)

    # ------------------------------------------------------------------ twins, listeners, hooks

    def twin(self, obj: Any, root: SyncTwin | None) -> Any:
        """The sync twin of the async ``obj`` (the same one each time), or ``None`` for ``None``."""
        if obj is None:
            return None
        with self._lock:
            existing = self._twins.get(id(obj))
            if existing is not None and existing._a is obj:
                return existing
            cls = twin_class_for(type(obj))
            twin = cls.__new__(cls)
            twin._bind(self, obj, root)
            return twin

    def register(self, twin: SyncTwin) -> None:
        """Remember ``twin`` as the twin of its async object (see :meth:`twin`)."""
        with self._lock:
            self._twins[id(twin._a)] = twin

    def listener(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a listener so it runs on this runtime's listener thread (see ``callbacks``)."""
        return self._callbacks.listener(fn, awaitable=True)

    def listener_nowait(self, fn: Callable[..., Any]) -> Callable[..., None]:
        """Like :meth:`listener`, for callbacks typed to return ``None`` (errors are logged)."""
        return self._callbacks.listener(fn, awaitable=False)

    def hook(self, fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
        """Wrap a blocking hook as the coroutine function the async API awaits; an argument
        that is an async object with a twin (a recipe passing itself) reaches ``fn`` as that
        twin, so the hook gets the object the blocking caller knows."""
        if not callable(fn):
            return self._callbacks.hook(fn)

        def with_twins(*args: Any, **kwargs: Any) -> T:
            return fn(*(self._known_twin(arg) for arg in args), **kwargs)

        functools.update_wrapper(with_twins, fn)
        return self._callbacks.hook(with_twins)

    def _known_twin(self, obj: Any) -> Any:
        # Registered, else fresh for a twinned type never seen (run_stm's STM), else obj.
        with self._lock:
            twin, owner = self._twins.get(id(obj)), self._twins.get(id(self.root))
        if twin is not None and twin._a is obj:
            return twin
        return self.twin(obj, owner) if owner is not None and _twinned(type(obj)) else obj

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Cancel running calls, close :attr:`root`, stop the loop and join the threads.

        Idempotent. Called from the loop, a listener or a hook thread it only starts the
        shutdown (those threads cannot wait for themselves).
        """
        if os.getpid() != self._pid:
            return  # a forked child: the thread does not exist here
        with self._lock:
            starting = self._state == "running"
            if starting:
                self._state = "stopping"
            loop, stop_event = self._loop, self._stop_event
        if starting and loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop_event.set)
        current = threading.current_thread()
        if current is self._thread or self._callbacks.owns(current):
            return
        self._thread.join(FACADE_CLEANUP_WAIT * 2 + 5)
        if self._thread.is_alive():  # pragma: no cover - a cleanup ignored its bound
            log.warning("the etcd-recipes event-loop thread did not stop in time")

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException:  # pragma: no cover - the loop itself broke
            log.exception("the etcd-recipes event-loop thread failed")
        finally:
            self._state = "stopped"
            self._ready.set()
            self._callbacks.stop(FACADE_CLEANUP_WAIT)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()
        self._stop_event = asyncio.Event()
        # anyio.CancelScope() looks the backend up (sniffio) and initializes twice on every
        # call; its asyncio class, taken once here, is the same scope without that.
        self._scope_class = type(anyio.CancelScope())
        self._loop_ident = threading.get_ident()
        self._state = "running"
        self._ready.set()
        await self._stop_event.wait()
        with anyio.CancelScope(shield=True):
            await self._shutdown()

    async def _shutdown(self) -> None:
        root = self.root
        # Children first (their cleanup may still need the client), then the root's own
        # blocks, then the root itself.
        for first in (True, False):
            pending = [
                t
                for t, c in self._tasks.items()
                if first != (isinstance(c, ContextRun) and c.obj is root and root is not None)
            ]
            for task in pending:
                self._tasks[task].cancel("shutdown")
            if pending:
                await asyncio.wait(pending, timeout=FACADE_CLEANUP_WAIT)
        if root is not None and hasattr(root, "aclose"):
            with anyio.move_on_after(FACADE_CLEANUP_WAIT):
                try:
                    await root.aclose()
                except Exception:
                    log.debug("closing %r failed", root, exc_info=True)


def _after_fork_in_child() -> None:
    for rt in list(_runtimes):
        rt._state = "stopped"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
