"""Who is calling: the identity that owns a lock hold. Not public.

In async code a hold belongs to the asyncio task that took it (reentrant per task, released
by that task or, once it has finished, by anyone). The blocking facade runs every call in a
fresh task on its loop thread, so there the owner is the *calling thread*: the facade's
runtime sets :data:`CALLER` for each call it runs, and :func:`current_caller` answers with
that thread's :class:`ThreadCaller` -- one object per thread, so holds, ``is_held`` and
reentrancy mean "this thread" for a sync caller exactly as they mean "this task" for an
async one. Background tasks of recipes clear it (they are callers of their own).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from typing import Protocol

from ..errors import UsageError

__all__ = [
    "CALLER",
    "Caller",
    "ThreadCaller",
    "caller_or_none",
    "close_method",
    "current_caller",
    "thread_caller",
]


class Caller(Protocol):
    """What owns a hold: an asyncio task, or a facade caller's :class:`ThreadCaller`."""

    def done(self) -> bool: ...


class ThreadCaller:
    """A blocking-facade caller: one thread. ``done()`` once the thread has ended."""

    __slots__ = ("__weakref__", "thread")

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    def done(self) -> bool:
        return not self.thread.is_alive()

    def __repr__(self) -> str:
        return f"<thread {self.thread.name}>"


CALLER: contextvars.ContextVar[ThreadCaller | None] = contextvars.ContextVar(
    "etcd_recipes_caller", default=None
)
"""Set by the blocking facade's runtime around each call it runs for a thread."""

_by_thread: weakref.WeakKeyDictionary[threading.Thread, ThreadCaller] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def thread_caller(thread: threading.Thread | None = None) -> ThreadCaller:
    """The one :class:`ThreadCaller` of ``thread`` (the current thread by default)."""
    thread = thread or threading.current_thread()
    with _lock:
        found = _by_thread.get(thread)
        if found is None:
            found = _by_thread[thread] = ThreadCaller(thread)
        return found


def caller_or_none() -> Caller | None:
    """The calling thread (inside a facade call), else the current task, else ``None``."""
    return CALLER.get() or asyncio.current_task()


def current_caller() -> Caller:
    """Like :func:`caller_or_none`, raising outside any task."""
    found = caller_or_none()
    if found is None:
        raise UsageError("locks are acquired and released from an asyncio task")
    return found


def close_method() -> str:
    """How the caller spells "close" in messages: ``close()`` for a blocking-facade thread,
    ``aclose()`` in async code."""
    return "close()" if CALLER.get() is not None else "aclose()"
