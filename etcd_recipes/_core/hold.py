"""Exclusive holds: a key owned through an acquisition lease, its fencing token, and loss.

Shared by every exclusive recipe (mutex, read-write lock, semaphore permits, leadership).

* **Fencing**: a hold's ``fencing_token`` is its key's create revision. It grows with every new
  hold on the same path, and :meth:`Hold.compare` (``create_revision(key) == token``) is true
  only while *this* hold's key exists, so a transaction guarded by it commits only while the
  hold is current -- the one thing a lease-based lock cannot promise on its own.
* **Lost means lost**: a hold is lost when its lease is lost (expired, revoked, renewals
  stopped past the TTL) or its key is deleted out of band. Loss is detected by a background
  monitor (a watch on the key anchored at the acquisition's revision + 1, plus the lease's own
  loss signal), reported once to listeners, and cancels every :meth:`Hold.scope` body, which
  then raises the recipe's :class:`~etcd_recipes.errors.LostError` subclass.

Not guaranteed: detection takes time (up to a keep-alive interval, or the watch's delivery);
a paused process notices only when it runs again. Use the fencing compare for writes that
must not happen after the hold is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import LostError
from ..types import EventType, TxnResult, WatchEvent
from .lease import AcquisitionLease
from .listeners import ListenerSet
from .txn import AnyOp, Cmp, Compare, Op
from .waiting import wait_for_change

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["Hold"]

log = logging.getLogger("etcd_recipes.hold")


class Hold:
    """One exclusive hold: ``key`` created at ``fencing_token`` on ``lease``.

    Example::

        hold = Hold(client, key, lease, create_revision, LockLostError, "mutex /locks/a")
        hold.start_monitor()
        async with hold.scope():
            await hold.guarded_txn([Op.put("/data", b"v")])  # commits only while held
        await hold.release()
    """

    def __init__(
        self,
        client: EtcdClient,
        key: bytes | str,
        lease: AcquisitionLease,
        create_revision: int,
        error: type[LostError],
        owner: str,
    ) -> None:
        self._client = client
        self.key = key
        """The key this hold owns."""
        self.lease = lease
        """The acquisition lease the key is attached to."""
        self.fencing_token = create_revision
        """The key's create revision: strictly greater for every later hold on the path."""
        self._error = error
        self._owner = owner
        self._lost = False
        self.lost_cause: BaseException | None = None
        self._released = False
        self._scopes: set[anyio.CancelScope] = set()
        self._monitor: asyncio.Task[None] | None = None
        self.listeners = ListenerSet("hold-lost")

    @property
    def is_lost(self) -> bool:
        """Whether the hold was lost (its lease or key is gone)."""
        return self._lost

    @property
    def is_released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    def compare(self) -> Compare:
        """A compare that holds only while this hold's key exists with its original create
        revision -- include it in a transaction to fence writes."""
        return Cmp.create_revision(self.key) == self.fencing_token

    async def guarded_txn(
        self,
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp] = (),
        *,
        extra: Sequence[Compare] = (),
    ) -> TxnResult:
        """Run ``success`` only while this hold is current (plus any ``extra`` compares).

        Example::

            result = await hold.guarded_txn([Op.put("/balance", b"42")])
            if not result.succeeded:
                ...  # the hold is gone: someone else may own the resource now
        """
        return await self._client.txn([self.compare(), *extra], success, failure)

    def add_listener(self, listener: Callable[[BaseException | None], Any]) -> None:
        """Call ``listener(cause)`` once, when the hold is lost."""
        self.listeners.add(listener)

    def start_monitor(self, after_revision: int | None = None) -> None:
        """Start watching for loss (key deleted after ``after_revision``, or lease lost)."""
        if self._monitor is None:
            rev = self.fencing_token if after_revision is None else after_revision
            self._monitor = asyncio.get_running_loop().create_task(
                self._watch_for_loss(rev), name=f"hold-monitor:{self._owner}"
            )

    async def _watch_for_loss(self, after_revision: int) -> None:
        async def probe() -> tuple[bool, int]:
            read = await self._client.range(self.key)
            gone = not read.kvs or read.kvs[0].create_revision != self.fencing_token
            return gone, read.revision

        def deleted(event: WatchEvent) -> bool:
            return event.type is EventType.DELETE

        key_watch = asyncio.ensure_future(
            wait_for_change(
                self._client,
                self.key,
                after_revision=after_revision,
                trigger=deleted,
                probe=probe,
                no_put=True,
            )
        )
        lease_lost = asyncio.ensure_future(self.lease.wait_lost())
        try:
            done, _ = await asyncio.wait(
                {key_watch, lease_lost}, return_when=asyncio.FIRST_COMPLETED
            )
            if self._released:
                return
            if lease_lost in done:
                self._mark_lost(self.lease.lost_cause)
            else:
                exc = key_watch.exception()
                self._mark_lost(exc or self._error(f"{self._owner}: the key was deleted"))
        finally:
            key_watch.cancel()
            lease_lost.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(key_watch, lease_lost, return_exceptions=True)

    def _mark_lost(self, cause: BaseException | None) -> None:
        if self._lost or self._released:
            return
        self._lost = True
        self.lost_cause = cause
        log.warning("%s: hold lost (%s)", self._owner, cause)
        for scope in list(self._scopes):
            scope.cancel()
        with contextlib.suppress(RuntimeError):
            self.listeners.emit(cause)

    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Hold]:
        """Run a body that is **cancelled** if the hold is lost; the body's caller then gets
        the recipe's :class:`~etcd_recipes.errors.LostError` (cause chained)."""
        if self._lost:
            raise self._lost_error()
        with anyio.CancelScope() as cancel_scope:
            self._scopes.add(cancel_scope)
            try:
                yield self
            finally:
                self._scopes.discard(cancel_scope)
        if self._lost and cancel_scope.cancelled_caught:
            raise self._lost_error()

    def _lost_error(self) -> LostError:
        err = self._error(f"{self._owner}: the hold was lost ({self.lost_cause})")
        err.__cause__ = self.lost_cause
        return err

    async def release(self) -> bool:
        """Delete the key (only if it is still this hold's) and revoke the lease.

        Returns False if the hold had already been lost. Idempotent; shielded and bounded.
        """
        if self._released:
            return False
        self._released = True
        was_lost = self._lost
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            monitor.cancel()
        with anyio.CancelScope(shield=True):
            if monitor is not None:
                with contextlib.suppress(BaseException):
                    await monitor
            with anyio.move_on_after(5.0):
                with contextlib.suppress(Exception):
                    await self._client.txn([self.compare()], [Op.delete(self.key)])
            await self.lease.revoke()
        return not was_lost
