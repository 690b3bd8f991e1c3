"""Calls in flight between a waiting thread and the runtime's loop (internal to ``sync``).

A :class:`Call` is one submission: the waiting thread parks on its :class:`Flag` until the
coroutine -- and, after a cancellation, its cleanup -- has ended on the loop. A
:class:`ContextRun` is a ``with`` block whose ``__aenter__`` and ``__aexit__`` run in one task.
:func:`fail_after` keeps a per-thread stack of deadlines that every call made inside it
carries to the loop as its cancel scope's deadline. The guards against calling from a running
event loop live here too. Nothing here starts a thread or touches a loop; see ``_runtime``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio

from ..._core.caller import thread_caller
from ..._core.validate import check_timeout
from ...errors import UsageError

__all__ = [
    "Call",
    "ContextRun",
    "Flag",
    "current_deadline",
    "fail_after",
    "refuse_running_loop",
    "running_loop_here",
    "scope_deadline",
]

_state = threading.local()


@contextlib.contextmanager
def fail_after(seconds: float) -> Iterator[None]:
    """Bound every blocking facade call made by this thread inside the block.

    A call still running at the deadline is cancelled, its cleanup runs to completion, and it
    raises :class:`~etcd_recipes.errors.EtcdTimeoutError` (also a ``TimeoutError``). Code
    between facade calls is not interrupted. Blocks nest; the earliest deadline wins.

    Example::

        from etcd_recipes.sync import EtcdTimeoutError, fail_after

        with client.lease(5) as lease:
            try:
                with fail_after(0.2):
                    lease.wait_lost()  # the lease stays alive: the deadline passes
            except EtcdTimeoutError:
                pass  # raised after 0.2 s, with nothing left running on the loop
    """
    # 0 is allowed: every call inside fails at once (anyio's fail_after(0) does the same).
    bound = check_timeout(seconds, what="fail_after() seconds", optional=False, zero=True)
    assert bound is not None
    stack = _deadlines()
    stack.append(time.monotonic() + bound)
    try:
        yield
    finally:
        stack.pop()


def _deadlines() -> list[float]:
    stack: list[float] | None = getattr(_state, "deadlines", None)
    if stack is None:
        stack = _state.deadlines = []
    return stack


def current_deadline() -> float | None:
    stack: list[float] | None = getattr(_state, "deadlines", None)
    return min(stack) if stack else None


class Flag:
    """A one-shot flag for one waiting thread: a pre-acquired lock released by :meth:`set`.

    Cheaper than ``threading.Event`` (whose every ``wait`` allocates a lock for a condition).
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else timeout):
            self._lock.release()
            return True
        return self._set


class Call:
    """One submission to the loop; ``done`` is set after the coroutine (and its cleanup) ended."""

    __slots__ = ("caller", "deadline", "done", "error", "reason", "result", "scope")

    def __init__(self, deadline: float | None) -> None:
        self.caller = thread_caller()  # made in the calling thread: who owns what it takes
        self.deadline = deadline
        self.done = Flag()
        self.result: Any = None
        self.error: BaseException | None = None
        self.scope: anyio.CancelScope | None = None
        self.reason = ""  # why it was cancelled from outside: "interrupt" or "shutdown"

    def cancel(self, reason: str) -> None:  # on the loop thread
        if not self.reason:
            self.reason = reason
        if self.scope is not None:
            self.scope.cancel()


class ContextRun(Call):
    """A ``with`` block: ``__aenter__`` and ``__aexit__`` run in one task (cancel scopes and
    task groups entered by ``__aenter__`` are exited by the same task)."""

    __slots__ = ("entered", "exit_args", "exit_event", "obj")

    def __init__(self, obj: Any, deadline: float | None) -> None:
        super().__init__(deadline)
        self.obj = obj
        self.entered = threading.Event()
        self.exit_event: asyncio.Event | None = None
        self.exit_args: tuple[Any, Any, Any] = (None, None, None)


def running_loop_here() -> bool:
    """Whether the calling thread runs an asyncio event loop right now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def refuse_running_loop() -> None:
    if not running_loop_here():
        return
    raise UsageError(
        "a blocking etcd_recipes.sync call was made from a running event loop, which it "
        "would block; use the async API (etcd_recipes) there, or run the blocking code in "
        "a worker thread (anyio.to_thread.run_sync / loop.run_in_executor)"
    )


def scope_deadline(deadline: float | None) -> float:
    # anyio's clock on asyncio is loop.time(), i.e. time.monotonic().
    return math.inf if deadline is None else deadline
