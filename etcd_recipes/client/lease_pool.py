"""The lock recipes' acquisition leases as a **client resource**: a small pool per client and
TTL (Go's ``concurrency.Session``, shared), so a mutex made per request costs no lease of its
own. Not public.

* A hold -- or an acquisition waiting to become one -- **checks out** a live lease that is not
  already checked out **on the same lock path** (etcd's lock layout is ``<path>/<lease hex>``,
  so two holders in one process on one path must never share a lease: both would "own" the
  key). Holds on different paths share a lease. A lease is granted only when every pooled
  lease is in use on that path, so the pool holds at most as many leases as there were, at
  the busiest moment, simultaneous checkouts on **one** path -- plus, for
  :data:`IDLE_SECONDS`, leases nobody uses any more.
* A lease nobody has checked out is revoked after :data:`IDLE_SECONDS`, and every pooled lease
  is revoked when the client closes (:func:`close_lease_pools`, called by ``aclose()``).
* A lost lease (expired, revoked, or reported unknown by etcd) is dropped from the pool at
  once and **never handed out again**; every hold on it learns of the loss from the lease
  itself (:meth:`AcquisitionLease.wait_lost`), whatever its path or recipe.
* A lease that may still carry a key nobody owns (a release or an aborted acquisition whose
  delete etcd did not answer) is **retired**: no new checkout, revoked when its last user
  returns it (its keys vanish with it).
* A grant cancelled in flight is not leaked: it completes in the background and the lease
  joins the pool as idle (revoked after :data:`IDLE_SECONDS` unless used).

Not guaranteed: a lease lost takes every hold on it with it (that is what sharing means --
as with a Go session); an idle lease is kept alive (one keep-alive message per third of its
TTL) until it is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ClientClosedError
from ..events import LeaseEvent, LeaseExpired
from .lease import AcquisitionLease

if TYPE_CHECKING:
    from . import EtcdClient

__all__ = [
    "IDLE_SECONDS",
    "LeaseCheckout",
    "LeasePool",
    "PooledLease",
    "close_lease_pools",
    "lease_pool",
    "pooled_lease_ids",
]

IDLE_SECONDS = 3.0
"""How long a pooled lease nobody has checked out is kept before it is revoked."""

LeaseListener = Callable[[LeaseEvent], Any]


class PooledLease(AcquisitionLease):
    """A pooled acquisition lease: a hold's ``revoke()`` leaves it to the pool (:meth:`end`)."""

    def __init__(self, client: EtcdClient, ttl: int) -> None:
        # The lock recipe checked ``ttl`` at its constructor: not again on the way down.
        self._setup(client, ttl)
        self.users: list[LeaseCheckout] = []
        self.idle_since: float | None = None
        self.retired = False

    async def revoke(self) -> None:
        """Kept: the pool revokes it when it is idle, retired, or the client closes."""

    async def end(self) -> None:
        """Stop keeping the lease alive and revoke it (no RPC when it is lost already)."""
        if self.is_lost and not self._closed:
            self._closed = True
            if self._reg is not None:
                self._client._leases.unregister(self._reg)
            await self._events.aclose()
            return
        await super().revoke()

    def mark_lost(self, cause: BaseException | None) -> None:
        """etcd does not know the lease any more (a write with it failed): lost for every user."""
        if self._reg is not None:
            with contextlib.suppress(ClientClosedError):
                self._client._leases.unregister(self._reg)
        self._on_lost(cause)


class LeaseCheckout:
    """One use of a pooled lease on one lock path, until it is given back."""

    __slots__ = ("lease", "listener", "path", "returned")

    def __init__(self, lease: PooledLease, path: str, listener: LeaseListener | None) -> None:
        self.lease = lease
        self.path = path
        self.listener = listener
        self.returned = False


class LeasePool:
    """The pooled acquisition leases of one client and TTL (see the module docstring)."""

    def __init__(self, client: EtcdClient, ttl: int) -> None:
        self._client = client
        self.ttl = ttl
        self._leases: list[PooledLease] = []
        self._granting: asyncio.Lock | None = None
        self._pending: set[asyncio.Future[Any]] = set()  # grants whose caller was cancelled
        self._reaper: asyncio.Task[None] | None = None
        self._reap_timer: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def lease_ids(self) -> list[int]:
        """The ids of the pooled leases (in use or idle), oldest first."""
        return [lease.id for lease in self._leases]

    def _pick(self, path: str) -> PooledLease | None:
        best: PooledLease | None = None
        for lease in self._leases:
            if lease.is_lost or lease.retired or any(u.path == path for u in lease.users):
                continue
            if best is None or len(lease.users) > len(best.users):
                best = lease  # the busiest: idle ones drain and are revoked
        return best

    async def checkout(self, path: str, listener: LeaseListener | None = None) -> LeaseCheckout:
        """A live lease not in use on ``path`` (granted if there is none); ``listener`` gets
        the lease's events until the checkout is given back."""
        lease = self._pick(path)
        if lease is None:
            if self._granting is None:
                self._granting = asyncio.Lock()
            async with self._granting:
                lease = self._pick(path) or await self._grant()
        if self._closed:
            raise ClientClosedError("the client is closed")
        checkout = LeaseCheckout(lease, path, listener)
        lease.users.append(checkout)
        lease.idle_since = None
        return checkout

    async def _grant(self) -> PooledLease:
        if self._closed:
            raise ClientClosedError("the client is closed")
        lease = PooledLease(self._client, self.ttl)
        grant = asyncio.ensure_future(lease.grant())
        try:
            await asyncio.shield(grant)
        except asyncio.CancelledError:
            # The grant may land anyway: let it finish, and keep the lease as idle.
            self._pending.add(grant)
            grant.add_done_callback(lambda done: self._granted_late(lease, done))
            raise
        self._add(lease)
        return lease

    def _granted_late(self, lease: PooledLease, grant: asyncio.Future[Any]) -> None:
        self._pending.discard(grant)
        if grant.cancelled() or grant.exception() is not None:
            return
        self._add(lease)
        self._idle(lease)

    def _add(self, lease: PooledLease) -> None:
        lease.add_listener(lambda event: self._on_event(lease, event))
        self._leases.append(lease)
        if self._closed:
            self._idle(lease)

    def _on_event(self, lease: PooledLease, event: LeaseEvent) -> None:
        if isinstance(event, LeaseExpired) and lease in self._leases:
            self._leases.remove(lease)  # lost: never handed out again
        for user in list(lease.users):
            if user.listener is not None:
                user.listener(event)

    async def give_back(self, checkout: LeaseCheckout, *, retire: bool = False) -> None:
        """End ``checkout``; ``retire`` when a key nobody owns may remain on its lease."""
        if checkout.returned:
            return
        checkout.returned = True
        lease = checkout.lease
        with contextlib.suppress(ValueError):
            lease.users.remove(checkout)
        lease.retired = lease.retired or retire
        if not lease.users:
            if lease.retired or lease.is_lost or self._closed:
                await self._drop(lease)
            else:
                self._idle(lease)

    def lost(self, checkout: LeaseCheckout, cause: BaseException | None) -> None:
        """etcd reported the checkout's lease unknown: it is lost for every holder."""
        checkout.lease.mark_lost(cause)

    async def _drop(self, lease: PooledLease) -> None:
        if lease in self._leases:
            self._leases.remove(lease)
        await lease.end()

    def _idle(self, lease: PooledLease) -> None:
        if self._closed or lease.is_lost:
            task = asyncio.get_running_loop().create_task(self._drop(lease))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return
        lease.idle_since = time.monotonic()
        # A timer, not a task: a lease given back and checked out again at once (a mutex in a
        # loop) would otherwise start a reaper task per cycle that finds nothing idle.
        if self._reap_timer is None and (self._reaper is None or self._reaper.done()):
            self._reap_timer = asyncio.get_running_loop().call_later(
                IDLE_SECONDS, self._start_reaper
            )

    def _start_reaper(self) -> None:
        self._reap_timer = None
        if self._closed or all(lease.idle_since is None for lease in self._leases):
            return
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(
                self._reap(), name="etcd-recipes-lease-pool-reaper"
            )

    async def _reap(self) -> None:
        while not self._closed:
            now = time.monotonic()
            idle = [lease for lease in self._leases if lease.idle_since is not None]
            if not idle:
                return
            due = [lease for lease in idle if now - lease.idle_since >= IDLE_SECONDS]  # type: ignore[operator]
            for lease in due:
                lease.idle_since = None
                self._leases.remove(lease)
            for lease in due:
                await lease.end()
            rest = [lease.idle_since for lease in self._leases if lease.idle_since is not None]
            if rest:
                await asyncio.sleep(max(0.01, min(rest) + IDLE_SECONDS - time.monotonic()))

    async def aclose(self) -> None:
        """Revoke every pooled lease (the client is closing); later checkouts fail."""
        self._closed = True
        timer, self._reap_timer = self._reap_timer, None
        if timer is not None:
            timer.cancel()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
            with contextlib.suppress(BaseException):
                await reaper
        if self._pending:
            with contextlib.suppress(BaseException):
                await asyncio.wait(set(self._pending), timeout=5.0)
        leases, self._leases = self._leases, []
        await asyncio.gather(*(lease.end() for lease in leases), return_exceptions=True)


_POOLS: weakref.WeakKeyDictionary[EtcdClient, dict[int, LeasePool]] = weakref.WeakKeyDictionary()


def lease_pool(client: EtcdClient, ttl: int) -> LeasePool:
    """The pool of ``client``'s acquisition leases of ``ttl`` seconds (made on first use)."""
    pools = _POOLS.get(client)
    if pools is None:
        pools = _POOLS[client] = {}
    pool = pools.get(ttl)
    if pool is None:
        pool = pools[ttl] = LeasePool(client, ttl)
    return pool


def pooled_lease_ids(client: EtcdClient) -> list[int]:
    """Every pooled lease of ``client`` (all TTLs): for diagnostics and tests."""
    return [lid for pool in _POOLS.get(client, {}).values() for lid in pool.lease_ids]


async def close_lease_pools(client: EtcdClient) -> None:
    """Revoke ``client``'s pooled leases (its ``aclose()`` calls this while it is open)."""
    pools = _POOLS.pop(client, {})
    for pool in pools.values():
        with contextlib.suppress(Exception):
            await pool.aclose()
