"""Lease handles: leases kept alive by the client's keeper, revoked on close.

* The client's :class:`~etcd_recipes.client.lease_keeper.LeaseKeeper` renews every lease on
  one stream and detects loss (TTL <= 0, or renewals stopped past the TTL); the handles here
  register with it and turn what it reports into lease events.
* :class:`AcquisitionLease` -- exclusivity (lock holds, permits, leadership): **never healed**.
  Once lost it stays lost, because etcd has already promoted a successor.
* :class:`SelfHealingLease` -- presence (barriers, registrations, transient keys, claims):
  re-granted after loss, then its ``establish`` hook re-creates the keys (normally through a
  compare-and-swap, so healing never steals a key). Reports ``LeaseExpired`` then
  ``LeaseRestored`` or ``LeaseFailed``. A heal first revokes the old lease (etcd restores
  leases on restart, so our old keys may exist again under it); if that cannot be confirmed, a
  declined ``establish`` is retried until the old lease has expired, never given up.
* Granting is cancellation-safe (see :func:`_grant`).

Closing either revokes the lease (best-effort, shielded, bounded), so owned keys vanish at once.
Not guaranteed: between expiry and restoration the keys of a self-healing lease do not exist;
other clients can observe the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.metering import meter_for
from .._core.shield import run_shielded
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.validate import check_ttl
from ..errors import ClientClosedError, EtcdRecipeError
from ..events import (
    LeaseEvent,
    LeaseExpired,
    LeaseFailed,
    LeaseRestored,
    LeaseResumed,
    LeaseSuspended,
)
from ..resilience import LeaseResilience
from ..types import LeaseGrant
from .base import check_client_part
from .lease_calls import LeaseCalls
from .lease_keeper import _Registration

if TYPE_CHECKING:
    from . import EtcdClient

__all__ = ["AcquisitionLease", "SelfHealingLease"]

log = library_logger("etcd_recipes.lease")


GRANT_ANSWER_TIMEOUT = 1.0  # seconds a cancelled grant waits for its answer, to revoke it


async def _grant(client: LeaseCalls, ttl: int) -> LeaseGrant:
    """Grant so that no cancellation leaves a lease behind: a cancellation during the grant
    (its own task) waits, shielded, up to ``GRANT_ANSWER_TIMEOUT`` for the answer, revokes what
    was granted and re-raises (short: a hung server must not stretch a deadline; a lease
    granted later expires at its TTL). Callers record a lease only after this returns."""
    task = asyncio.ensure_future(client._grant_lease(ttl))
    try:
        return await asyncio.shield(task)
    except BaseException:
        if task.done() and (task.cancelled() or task.exception() is not None):
            raise  # nothing was granted (or it cannot be known: it expires at its TTL)

        async def answered_then_revoked() -> None:
            try:
                grant = await task
            except Exception:
                return  # not granted, or unknowable: it expires at its TTL
            await client.lease_revoke(grant.id)

        what = "revoking a lease granted too late"
        await run_shielded(answered_then_revoked, what=what, timeout=GRANT_ANSWER_TIMEOUT)
        raise


async def _revoke_quietly(client: LeaseCalls, lease_id: int) -> None:
    """Revoke, shielded from cancellation and bounded in time; failures are logged."""
    await run_shielded(lambda: client.lease_revoke(lease_id), what=f"revoking lease {lease_id:x}")


class _LeaseBase:
    ttl: int
    """The requested TTL in whole seconds."""

    def __init__(self, client: EtcdClient, ttl: float) -> None:
        self._setup(check_client_part(client, kind=LeaseCalls), check_ttl(ttl))

    def _setup(self, client: LeaseCalls, ttl: int) -> None:
        """The constructor's work on checked arguments: a recipe that validated its TTL at its
        own boundary (the lock recipes' pooled leases) starts here, so a TTL is checked once."""
        self._client = client
        self.ttl = ttl
        self.listeners: ListenerSet = ListenerSet("lease")
        self._events: Broadcast[LeaseEvent] = Broadcast("lease-events")
        self._reg: _Registration | None = None

    def add_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with every :data:`~etcd_recipes.events.LeaseEvent` of this lease."""
        self.listeners.add(listener)

    def remove_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self.listeners.remove(listener)

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[LeaseEvent]:
        """Every later :data:`~etcd_recipes.events.LeaseEvent` of this lease (what the
        listeners get), as an async iterator that ends when the lease is revoked or closed.

        Bounded by ``maxsize`` (a consumer that far behind gets ``EventStreamOverflowError``
        after the buffered events); breaking out of the loop unregisters it.

        Example::

            from etcd_recipes import LeaseExpired

            async with client.lease(ttl=2) as lease:
                events = lease.events()
                await client.lease_revoke(lease.id)  # out of band: the lease is lost
                assert isinstance(await anext(events), LeaseExpired)
        """
        return self._events.stream(maxsize)

    def _emit(self, event: LeaseEvent) -> None:
        kind = type(event).__name__.removeprefix("Lease").lower()
        lease_id = event.old_lease_id if isinstance(event, LeaseRestored) else event.lease_id
        meter_for(self._client._resilience.metrics).emit("increment_keep_alive", kind, lease_id)
        self._events.publish(event)
        with contextlib.suppress(RuntimeError):
            self.listeners.emit(event)


class AcquisitionLease(_LeaseBase):
    """A lease for an exclusive hold: kept alive until released, **never re-granted** once lost.

    Example::

        async with client.lease(ttl=5) as lease:
            await client.put(prefix + "/locks/job", b"me", lease=lease.id)
            assert not lease.is_lost  # await lease.wait_lost() returns once it is lost
        assert await client.get(prefix + "/locks/job") is None  # revoked on exit
    """

    id: int
    """The lease id (0 before :meth:`grant`)."""
    granted_ttl: int
    lost_cause: BaseException | None
    loss_kind: str  # once lost: expired, revoked (before its TTL) or keep_alive_failed

    def __init__(self, client: EtcdClient, ttl: float) -> None:
        super().__init__(client, ttl)

    def _setup(self, client: LeaseCalls, ttl: int) -> None:
        super()._setup(client, ttl)
        self.id = 0
        self.granted_ttl = 0
        self._lost = asyncio.Event()
        self.lost_cause = None
        self.loss_kind = ""
        self._closed = False

    @property
    def is_lost(self) -> bool:
        """Whether the lease was lost (expired, revoked out of band, or renewals stopped)."""
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        """Wait until the lease is lost."""
        await self._lost.wait()

    async def grant(self) -> AcquisitionLease:
        """Grant the lease and start keeping it alive."""
        if self.id:
            raise EtcdRecipeError("this lease was already granted")
        grant = await _grant(self._client, self.ttl)
        self.id, self.granted_ttl = grant.id, grant.ttl
        try:
            self._reg = self._client._leases.register(
                grant.id, grant.ttl, self._on_lost, self._on_suspended, self._on_resumed
            )
        except BaseException:
            await _revoke_quietly(self._client, grant.id)
            raise
        return self

    def _on_lost(self, cause: BaseException | None) -> None:
        if self._lost.is_set() or self._closed:
            return
        self.lost_cause = cause
        self.loss_kind = (self._reg.loss_kind if self._reg is not None else "") or "revoked"
        self._lost.set()
        log.info("lease %x lost: %s", self.id, cause)
        self._emit(LeaseExpired(self.id, cause))

    def _on_suspended(self, cause: BaseException | None) -> None:
        self._emit(LeaseSuspended(self.id, cause))

    def _on_resumed(self) -> None:
        if not self._lost.is_set() and not self._closed:
            self._emit(LeaseResumed(self.id))

    async def revoke(self) -> None:
        """Stop keeping the lease alive and revoke it (best-effort; shielded and bounded)."""
        if self._closed:
            return
        self._closed = True
        if self._reg is not None:
            self._client._leases.unregister(self._reg)
        try:
            if self.id:
                await _revoke_quietly(self._client, self.id)
        finally:
            await self._events.aclose()

    async def __aenter__(self) -> AcquisitionLease:
        return await self.grant()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.revoke()


EstablishHook = Callable[[int], Awaitable[bool]]


class SelfHealingLease(_LeaseBase):
    """A presence lease that heals: on loss it is re-granted and ``establish`` runs again.

    ``establish(lease_id)`` creates the owned keys and returns True, or False to decline (the
    key now belongs to someone else): then the lease is revoked and the healing stops with
    ``LeaseFailed``.

    Example::

        from etcd_recipes import Cmp, Op

        key = prefix + "/presence/me"

        async def establish(lease_id: int) -> bool:
            r = await client.txn([Cmp.missing(key)], [Op.put(key, b"me", lease=lease_id)])
            return r.succeeded

        lease = client.self_healing_lease(2, establish)
        assert await lease.start()
        assert (await client.get(key)).lease == lease.current_lease_id
        await lease.aclose()
    """

    def __init__(
        self,
        client: EtcdClient,
        ttl: float,
        establish: EstablishHook,
        *,
        resilience: LeaseResilience | None = None,
    ) -> None:
        super().__init__(client, ttl)
        self._establish = establish
        self._resilience = resilience or client._resilience.lease
        self._lease_id = 0
        self._healer: asyncio.Task[None] | None = None
        self._closed = False
        self._healthy = False
        self._failed = False

    @property
    def current_lease_id(self) -> int:
        """The id of the lease currently in use (0 before start, or while healing)."""
        return self._lease_id

    @property
    def is_healthy(self) -> bool:
        """False while healing, after a failure, and after close."""
        return self._healthy and not self._closed

    @property
    def has_failed(self) -> bool:
        """Whether healing gave up for good."""
        return self._failed

    async def start(self) -> bool:
        """Grant and establish; False (with the lease revoked) if ``establish`` declined."""
        if self._closed:
            raise ClientClosedError("this lease was closed")
        if self._lease_id:
            raise EtcdRecipeError("this lease was already started")
        grant = await _grant(self._client, self.ttl)
        try:
            ok = await self._establish(grant.id)
        except BaseException:
            await _revoke_quietly(self._client, grant.id)
            raise
        if not ok:
            await _revoke_quietly(self._client, grant.id)
            return False
        self._adopt(grant.id, grant.ttl)
        return True

    def _adopt(self, lease_id: int, ttl: int) -> None:
        self._lease_id = lease_id
        self._healthy = True
        self._reg = self._client._leases.register(
            lease_id, ttl, self._on_lost, self._on_suspended, self._on_resumed
        )

    def _on_suspended(self, cause: BaseException | None) -> None:
        self._emit(LeaseSuspended(self._lease_id, cause))

    def _on_resumed(self) -> None:
        if self._healthy and not self._closed:
            self._emit(LeaseResumed(self._lease_id))

    def _on_lost(self, cause: BaseException | None) -> None:
        if self._closed or self._healer is not None:
            return
        old = self._lease_id
        self._healthy = False
        self._lease_id = 0
        log.info("lease %x lost (%s); healing", old, cause)
        self._emit(LeaseExpired(old, cause))
        self._healer = asyncio.get_running_loop().create_task(
            self._heal(old), name=f"etcd-recipes-lease-healer-{old:x}"
        )

    async def _heal(self, old: int) -> None:
        start = time.monotonic()
        attempt = 0
        last: BaseException | None = None
        try:
            while not self._closed:
                attempt += 1
                # Asked before every attempt, the first too: RetryPolicy.never() = no healing.
                delay = self._resilience.retry_policy.next_delay(attempt, time.monotonic() - start)
                if delay is None:
                    self._failed = True
                    self._emit(LeaseFailed(old, last))
                    return
                await asyncio.sleep(delay)
                try:
                    with anyio.fail_after(self._resilience.heal_operation_timeout):
                        # etcd restores leases on restart (with a fresh TTL): after an outage
                        # longer than the TTL the old lease -- and the keys it owns -- may
                        # exist again. They are ours: revoke them, so a create-if-absent
                        # establish re-creates them instead of declining.
                        await self._client.lease_revoke(old)
                        grant = await _grant(self._client, self.ttl)
                    try:
                        ok = await self._establish(grant.id)
                    except BaseException:
                        await _revoke_quietly(self._client, grant.id)
                        raise
                    if not ok:
                        await _revoke_quietly(self._client, grant.id)
                        if await self._still_alive(old):
                            # The revoke did not get through: our own old lease still holds
                            # the keys. Never give up on them; retry until it has expired.
                            raise EtcdRecipeError(f"lease {old:x} still holds the keys")
                        self._failed = True
                        self._emit(LeaseFailed(old, EtcdRecipeError("establish declined")))
                        return
                    if self._closed:
                        await _revoke_quietly(self._client, grant.id)
                        return
                    self._adopt(grant.id, grant.ttl)
                    log.info("lease %x restored as %x", old, grant.id)
                    self._emit(LeaseRestored(old, grant.id))
                    return
                except (EtcdRecipeError, TimeoutError) as exc:
                    last = exc
        finally:
            self._healer = None

    async def _still_alive(self, lease_id: int) -> bool:
        with anyio.fail_after(self._resilience.heal_operation_timeout):
            return (await self._client.lease_time_to_live(lease_id)).ttl > 0

    async def aclose(self) -> None:
        """Stop healing, stop renewing and revoke the lease (owned keys vanish); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        healer = self._healer
        if healer is not None:
            healer.cancel()
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await healer
        if self._reg is not None:
            self._client._leases.unregister(self._reg)
        try:
            if self._lease_id:
                await _revoke_quietly(self._client, self._lease_id)
                self._lease_id = 0
        finally:
            await self._events.aclose()

    async def __aenter__(self) -> SelfHealingLease:
        if not await self.start():
            raise EtcdRecipeError("the establish hook declined the initial lease")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
