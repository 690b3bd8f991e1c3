"""The locks family's session: the acquisition lease an instance keeps across its holds (a Go
``concurrency.Session``), leased transactions that notice a lease etcd forgot, and the small
task and deadline helpers every lock recipe shares. Package-private.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._core.caller import Caller, current_caller
from .._core.hold import Hold
from .._core.lease import AcquisitionLease
from .._core.txn import AnyOp, Compare
from .._core.waiting import run_shielded
from ..errors import (
    LeaseNotFoundError,
    RecipeClosedError,
)
from ..events import LeaseEvent
from ..types import (
    RangeResult,
    TxnResult,
)

if TYPE_CHECKING:
    from ..client import EtcdClient


_REQUEUE_DELAY = 0.25  # before queueing again after losing the waiter key or lease (reference)
_MONITOR_DELAY = 0.02  # a hold's loss monitor starts this long after the acquisition


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


def _monitor_soon(hold: Hold, seen: int) -> None:
    """Start watching ``hold`` for loss shortly, unless it is released first.

    Anchored at ``seen`` (the read that confirmed the hold), so a loss in between is still
    seen; short holds -- the common case -- then never pay for a watch of their own.
    """

    def start() -> None:
        if not (hold.is_released or hold.is_lost):
            hold.start_monitor(after_revision=seen)

    asyncio.get_running_loop().call_later(_MONITOR_DELAY, start)


def _task() -> Caller:
    """Who owns what this call takes: the task, or the facade caller's thread."""
    return current_caller()


class _SessionLease(AcquisitionLease):
    """The acquisition lease shared by an instance's successive holds (a Go "session").

    :class:`~etcd_recipes._core.hold.Hold` revokes its lease on release; here a release must
    keep it for the instance's next hold, so :meth:`revoke` is a no-op and :meth:`end` revokes.
    """

    async def revoke(self) -> None:
        """Kept for the instance's next hold (see :meth:`end`)."""

    async def end(self) -> None:
        """Stop keeping the lease alive and revoke it (shielded and bounded)."""
        await super().revoke()


async def _grant_or_revoke(lease: _SessionLease) -> None:
    """Grant ``lease``; if the caller is cancelled meanwhile, the grant may still land on the
    server, so let it finish (shielded, bounded) and revoke it: no lease is left behind."""
    grant = asyncio.ensure_future(lease.grant())
    try:
        await asyncio.shield(grant)
    except asyncio.CancelledError:

        async def undo() -> None:
            with contextlib.suppress(Exception):
                await grant
            await lease.end()

        await run_shielded(undo, what="revoking the lease of a cancelled acquisition")
        raise


class _Session:
    """The instance's acquisition lease: granted on first use, kept across holds, dropped when
    lost (a new one is granted by the next acquisition), revoked when an aborted acquisition
    leaves it unused, and on close."""

    def __init__(self, client: EtcdClient, ttl: int, on_event: Callable[[LeaseEvent], Any]) -> None:
        self._client = client
        self._ttl = ttl
        self._on_event = on_event
        self._lease: _SessionLease | None = None
        self._users = 0  # waiter keys and holds attached to the current lease
        self._granting: asyncio.Lock | None = None
        self._closed = False

    @property
    def lease(self) -> _SessionLease | None:
        return self._lease

    async def join(self) -> _SessionLease:
        """The live lease (granted if needed), counted as used until :meth:`leave`."""
        if self._closed:
            raise RecipeClosedError("the lock was closed")
        if self._granting is None:
            self._granting = asyncio.Lock()
        async with self._granting:
            lease = self._lease
            if lease is None or lease.is_lost:
                lease = _SessionLease(self._client, self._ttl)
                lease.add_listener(self._on_event)
                await _grant_or_revoke(lease)
                if self._closed:
                    await lease.end()
                    raise RecipeClosedError("the lock was closed")
                self._lease, self._users = lease, 0
            self._users += 1
            return lease

    def discard(self, lease: _SessionLease) -> None:
        """etcd no longer knows ``lease`` (revoked out of band before the keep-alive noticed):
        the next acquisition grants a new one."""
        if lease is self._lease:
            self._lease, self._users = None, 0

    def leave(self, lease: _SessionLease) -> None:
        """A hold on ``lease`` was released; the lease stays for the next acquisition."""
        if lease is self._lease:
            self._users = max(0, self._users - 1)

    async def abandon(self, lease: _SessionLease) -> None:
        """An acquisition on ``lease`` was aborted: revoke the lease if nothing else uses it."""
        if lease is not self._lease:
            return
        self._users = max(0, self._users - 1)
        if self._users == 0 and not lease.is_lost:
            self._lease = None
            await lease.end()

    async def close(self) -> None:
        self._closed = True
        lease, self._lease = self._lease, None
        if lease is not None and not lease.is_lost:
            await lease.end()


def _range(result: TxnResult, index: int) -> RangeResult:
    read = result.responses[index]
    assert isinstance(read, RangeResult)
    return read


async def _leased_txn(
    client: EtcdClient,
    session: _Session,
    lease: _SessionLease,
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
        session.discard(lease)
        raise _Requeue(f"lease {lease.id:x} no longer exists", delay=0.0) from exc
