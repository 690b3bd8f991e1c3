"""The locks family's waiter line: the in-process turn every mutex of one client on one path
takes before it queues in etcd (:func:`_local_line`), and the handles through which
``aclose()`` aborts an acquisition that waits (:class:`_Abort`, :class:`_Bounded`).
Package-private.

Guaranteed: one waiter key (and one lease) per client and path in etcd, whatever the number
of waiting tasks; a turn given to a waiter that is cancelled meanwhile is passed on. Not
guaranteed: any order across processes beyond etcd's own queue (a turn is only who may queue
next; mutual exclusion is etcd's).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

import anyio

if TYPE_CHECKING:
    from ..client import EtcdClient

_T = TypeVar("_T")


class _Aborted(Exception):
    """aclose() aborted an acquisition while it waited (see :class:`_Abort`)."""


class _Abort:
    """aclose()'s handle on an acquisition without a timeout, costing nothing until it waits.

    An acquisition with a timeout runs in an anyio cancel scope with that deadline, which
    aclose() cancels. Without one -- the common case -- there is no scope while it only
    makes RPCs (a hold that a closed recipe acquires meanwhile is released at once, after
    the fact); only its waits (for this instance's turn, for a predecessor) run in a scope
    of their own, through :meth:`wait`, which raises :class:`_Aborted` when cancelled.
    """

    __slots__ = ("_scope", "cancelled", "parked")

    def __init__(self) -> None:
        self.cancelled = False
        self._scope: anyio.CancelScope | None = None
        self.parked: asyncio.Future[None] | None = None  # waiting in a _Line, scope-less

    def cancel(self) -> None:
        self.cancelled = True
        if self._scope is not None:
            self._scope.cancel()
        parked = self.parked
        if parked is not None and not parked.done():
            parked.set_exception(_Aborted("aborted by aclose()"))

    async def wait(self, aw: Awaitable[_T]) -> _T:
        """Await ``aw``; :class:`_Aborted` if :meth:`cancel` is called first or meanwhile."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.cancelled:
                scope.cancel()
            try:
                return await aw
            finally:
                self._scope = None
        raise _Aborted("aborted by aclose()")


class _Bounded:
    """The :class:`_Abort` stand-in of an acquisition whose whole run is in a deadline scope
    (which aclose() cancels): its waits need no scope of their own."""

    __slots__ = ()

    async def wait(self, aw: Awaitable[_T]) -> _T:
        return await aw


_BOUNDED = _Bounded()


class _Line:
    """The turn that every mutex of one client on one path takes -- one acquisition at a
    time, first come first served -- before it queues in etcd (see :func:`_local_line`).

    A waiter costs one bare future: no task, timer or cancel scope of its own. Whoever has the
    turn passes it with :meth:`release` (to the next waiter, still taken) exactly once.
    """

    __slots__ = ("__weakref__", "_taken", "_waiters")

    def __init__(self) -> None:
        self._taken = False
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def locked(self) -> bool:
        """Whether someone has the turn (acquiring, holding or releasing the lock)."""
        return self._taken

    @property
    def waiting(self) -> int:
        """How many wait for the turn."""
        return len(self._waiters)

    def take(self) -> bool:
        """Take the turn if it is free (no waiting): whether it was."""
        if self._taken:
            return False
        self._taken = True
        return True

    async def wait(self, abort: _Abort | _Bounded) -> None:
        """Wait for the turn, in line; :class:`_Aborted` when ``abort`` is cancelled first."""
        if self.take():
            return
        if isinstance(abort, _Abort) and abort.cancelled:
            raise _Aborted("aborted by aclose()")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        if isinstance(abort, _Abort):
            abort.parked = turn
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.release()  # given the turn, then cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(turn)
            raise
        finally:
            if isinstance(abort, _Abort):
                abort.parked = None

    def release(self) -> None:
        """Pass the turn to the next waiter (or free it)."""
        waiters = self._waiters
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._taken = False


_LINES: weakref.WeakKeyDictionary[EtcdClient, weakref.WeakValueDictionary[str, _Line]] = (
    weakref.WeakKeyDictionary()
)


def _local_line(client: EtcdClient, path: str) -> _Line:
    """The turn that every mutex of ``client`` on ``path`` takes before it queues in etcd.

    So a process has one waiter key (and one lease) per client and path in etcd, whatever the
    number of its waiting tasks: those wait in line here, on a future each, and each of them
    queues a fresh key at the tail when its turn comes -- behind the waiters other processes
    queued meanwhile (the processes take turns). Mutual exclusion is still etcd's: a turn is
    only who may queue next. Shared by the instances on the path; gone with the last of them.
    """
    lines = _LINES.get(client)
    if lines is None:
        lines = _LINES[client] = weakref.WeakValueDictionary()
    line = lines.get(path)
    if line is None:
        line = lines[path] = _Line()
    return line
