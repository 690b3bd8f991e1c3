"""Listener sets that never run user callbacks inside the task that reports the event.

Each emit schedules the listeners with ``loop.call_soon`` (FIFO, so order is preserved); a
coroutine function listener is run as its own task. A listener that raises is logged and handed
to the error sink; it never breaks the reporter.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from .logctx import library_logger

__all__ = ["ListenerSet"]

log = library_logger("etcd_recipes.listeners")


class ListenerSet:
    """An ordered set of callbacks, called with the arguments given to :meth:`emit`."""

    __slots__ = ("_listeners", "_name", "_on_error", "_tasks")

    def __init__(self, name: str, on_error: Callable[[str, BaseException], None] | None = None):
        self._name = name
        self._listeners: list[Callable[..., Any]] = []
        self._on_error = on_error
        self._tasks: set[asyncio.Task[Any]] | None = None  # created on first async listener

    def add(self, listener: Callable[..., Any]) -> None:
        """Register ``listener`` (a plain or ``async`` callable taking the event)."""
        if not callable(listener):
            raise TypeError(f"{self._name} listener must be callable")
        self._listeners.append(listener)

    def remove(self, listener: Callable[..., Any]) -> None:
        """Unregister ``listener``; unknown listeners are ignored."""
        try:
            self._listeners.remove(listener)
        except ValueError:
            pass

    def __len__(self) -> int:
        return len(self._listeners)

    def emit(self, *args: Any) -> None:
        """Schedule every listener with ``args`` (returns immediately)."""
        if not self._listeners:
            return
        loop = asyncio.get_running_loop()
        for listener in list(self._listeners):
            loop.call_soon(self._invoke, listener, args)

    def _invoke(self, listener: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result = listener(*args)
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                if self._tasks is None:
                    self._tasks = set()
                self._tasks.add(task)
                task.add_done_callback(self._task_done)
        except Exception as exc:
            self._report(exc)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._report(task.exception())  # type: ignore[arg-type]

    def _report(self, exc: BaseException) -> None:
        log.warning("%s listener raised %r", self._name, exc, exc_info=exc)
        if self._on_error is not None:
            try:
                self._on_error(f"{self._name}-listener", exc)
            except Exception:  # pragma: no cover - the sink itself failed
                log.exception("error sink failed")
