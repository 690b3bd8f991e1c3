"""The locks family's session: a recipe's share of the client's pooled acquisition leases (a Go
``concurrency.Session`` per client and TTL), leased transactions that notice a lease etcd
forgot, the holds' batched loss monitors, and the small task and deadline helpers every lock
recipe shares. The in-process waiter line is :mod:`._line`. Package-private.
"""

from __future__ import annotations

import asyncio
import heapq
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from .._core.caller import Caller, current_caller
from .._core.txn import AnyOp, Compare
from .._recipe.hold import Hold
from ..client.lease_pool import LeaseCheckout, LeasePool, lease_pool
from ..errors import LeaseNotFoundError, LockNotHeldError, RecipeClosedError
from ..events import LeaseEvent
from ..types import RangeResult, TxnResult

if TYPE_CHECKING:
    from ..client import EtcdClient


_T = TypeVar("_T")

_REQUEUE_DELAY = 0.25  # before queueing again after losing the waiter key or lease (reference)
_MONITOR_DELAY = 0.02  # a hold's loss monitor starts this long after the acquisition
_TIMER_SLACK = 0.005  # monitors due this soon start together (one timer fire for a batch)


class _Requeue(Exception):
    """Our waiter key or lease vanished while waiting: queue again at the tail."""

    def __init__(self, message: str, *, delay: float = _REQUEUE_DELAY) -> None:
        super().__init__(message)
        self.delay = delay


class _Busy(Exception):
    """A try-once acquisition (``timeout=0``) found the lock taken: it gave up at once (its
    waiter key removed on the way out, like any abandoned acquisition)."""


# --------------------------------------------------------------------------- helpers


def _deadline_scope(timeout: float | None) -> anyio.CancelScope:
    """A cancel scope that ``aclose()`` can cancel, expiring after ``timeout`` seconds (``0``:
    try once -- the acquisition itself gives up instead of waiting)."""
    if not timeout:
        return anyio.CancelScope()
    return anyio.CancelScope(deadline=anyio.current_time() + timeout)


class _Monitors:
    """The holds of one event loop waiting to start their loss monitors, on one timer.

    A hold's monitor starts :data:`_MONITOR_DELAY` after its acquisition (up to
    :data:`_TIMER_SLACK` earlier: those due that soon start together), as if each had a timer
    of its own; sharing one timer (armed for the earliest, re-armed as they come due) keeps a
    short hold -- the common case -- from arming and cancelling a timer of its own.
    """

    __slots__ = ("_count", "_loop", "_pending", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: list[tuple[float, int, Hold, int]] = []  # a heap, earliest first
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, hold: Hold, seen: int) -> None:
        due = self._loop.time() + _MONITOR_DELAY
        self._count += 1
        heapq.heappush(self._pending, (due, self._count, hold, seen))
        timer = self._timer
        if timer is None or due < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(due, self._due)

    def _due(self) -> None:
        self._timer = None
        pending = self._pending
        now = self._loop.time() + _TIMER_SLACK
        while pending and pending[0][0] <= now:
            _, _, hold, seen = heapq.heappop(pending)
            if not (hold.is_released or hold.is_lost):
                hold.start_monitor(after_revision=seen)
        if pending:
            self._timer = self._loop.call_at(pending[0][0], self._due)


_MONITORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Monitors] = (
    weakref.WeakKeyDictionary()
)


def _monitor_soon(hold: Hold, seen: int) -> None:
    """Start watching ``hold`` for loss shortly (:data:`_MONITOR_DELAY`), unless it is released
    (or lost) first.

    Anchored at ``seen`` (the read that confirmed the hold), so a loss in between is still
    seen; short holds -- the common case -- then never pay for a watch of their own.
    """
    loop = asyncio.get_running_loop()
    monitors = _MONITORS.get(loop)
    if monitors is None:
        monitors = _MONITORS[loop] = _Monitors(loop)
    monitors.add(hold, seen)


def _task() -> Caller:
    """Who owns what this call takes: the task, or the facade caller's thread."""
    return current_caller()


class _Entered:
    """What ``async with`` entered on a lock, per caller (task, or the facade caller's
    thread): each ``__aexit__`` leaves its own caller's innermost entry, so nested and
    concurrent ``async with`` blocks of one lock object never exit each other's hold."""

    __slots__ = ("_stacks",)

    def __init__(self) -> None:
        self._stacks: dict[Caller, list[AbstractAsyncContextManager[Any]]] = {}

    async def enter(self, cm: AbstractAsyncContextManager[Any]) -> None:
        await cm.__aenter__()
        self._stacks.setdefault(_task(), []).append(cm)

    async def exit(
        self,
        name: str,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = _task()
        stack = self._stacks.get(task)
        if not stack:
            raise LockNotHeldError(f"{name}: __aexit__ without a matching __aenter__")
        cm = stack.pop()
        if not stack:
            del self._stacks[task]
        await cm.__aexit__(exc_type, exc, tb)


class _Session:
    """A recipe's share of the client's pooled acquisition leases
    (:mod:`etcd_recipes.client.lease_pool`): each acquisition checks out a lease not in use on
    the recipe's path, kept by the hold it becomes and given back on release (or when the
    acquisition is aborted, or the recipe closed). Lease events reach the recipe while it has
    the lease checked out."""

    def __init__(
        self, client: EtcdClient, ttl: int, path: str, on_event: Callable[[LeaseEvent], Any]
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._path = path
        self._on_event = on_event
        self._checkouts: list[LeaseCheckout] = []
        self._closed = False
        self._lease_pool: LeasePool | None = None

    @property
    def leases(self) -> list[int]:
        """The ids of the leases this recipe has checked out now."""
        return [c.lease.id for c in self._checkouts]

    def _pool(self) -> LeasePool:
        # Looked up once: the pool lives as long as the client (closed with it, never reopened).
        pool = self._lease_pool
        if pool is None:
            pool = self._lease_pool = lease_pool(self._client, self._ttl)
        return pool

    async def join(self) -> LeaseCheckout:
        """Check out a live lease for one acquisition (and the hold it becomes)."""
        if self._closed:
            raise RecipeClosedError("the lock was closed")
        checkout = await self._pool().checkout(self._path, self._on_event)
        if self._closed:
            await self._pool().give_back(checkout)
            raise RecipeClosedError("the lock was closed")
        self._checkouts.append(checkout)
        return checkout

    def discard(self, checkout: LeaseCheckout, cause: BaseException) -> None:
        """etcd no longer knows the lease (revoked out of band before the keep-alive
        noticed): it is lost -- for every hold on it -- and never handed out again."""
        self._pool().lost(checkout, cause)

    async def leave(self, checkout: LeaseCheckout, *, retire: bool = False) -> None:
        """Give the lease back (a hold released, an acquisition aborted); ``retire`` when a
        key of ours may remain on it (its delete was not answered): the pool revokes it."""
        if checkout in self._checkouts:
            self._checkouts.remove(checkout)
        await self._pool().give_back(checkout, retire=retire)

    async def close(self) -> None:
        self._closed = True
        for checkout in list(self._checkouts):
            await self.leave(checkout)


async def _abandon(
    client: EtcdClient, session: _Session, checkout: LeaseCheckout, key: str | None
) -> None:
    """An acquisition was aborted: delete its waiter ``key`` (if it may exist) and give the
    lease back -- retired if the delete failed, so the key goes with the lease."""
    try:
        if key is not None:
            await client.delete(key)
    except BaseException:
        await session.leave(checkout, retire=True)
        raise
    await session.leave(checkout)


def _range(result: TxnResult, index: int) -> RangeResult:
    read = result.responses[index]
    assert isinstance(read, RangeResult)
    return read


async def _leased_txn(
    client: EtcdClient,
    session: _Session,
    checkout: LeaseCheckout,
    compare: Sequence[Compare],
    success: Sequence[AnyOp],
    failure: Sequence[AnyOp] = (),
) -> TxnResult:
    """A transaction that writes with ``lease``. If etcd no longer knows the lease (revoked out
    of band, not noticed by the keep-alive yet), the lease is dropped and the acquisition
    queues again at once with a new one."""
    try:
        return await client.txn(compare, success, failure)
    except LeaseNotFoundError as exc:
        session.discard(checkout, exc)
        raise _Requeue(f"lease {checkout.lease.id:x} no longer exists", delay=0.0) from exc
