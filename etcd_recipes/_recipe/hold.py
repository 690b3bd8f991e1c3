"""Exclusive holds: a key owned through an acquisition lease, its fencing token, and loss.

Shared by every exclusive recipe (mutex, read-write lock, semaphore permits, leadership).

* **Fencing**: a hold's ``fencing_token`` is its key's create revision. It grows with every new
  hold on the same path, and :meth:`Hold.compare` (``create_revision(key) == token``) is true
  only while *this* hold's key exists, so a transaction guarded by it commits only while the
  hold is current -- the one thing a lease-based lock cannot promise on its own.
* **Lost means lost**: a hold is lost when its lease is lost (expired, revoked, renewals
  stopped past the TTL) or its key is deleted out of band. Loss is detected by a background
  monitor (a watch on the key anchored at the acquisition's revision + 1, plus the lease's own
  loss signal) and reported once to listeners.

**How a lost hold cancels the body** -- the one mechanism of every exclusive hold (mutex,
read-write lock, semaphore permits, leadership terms). A scoped body runs inside
:meth:`Hold.scope`, which registers a *body guard* for the task running it. When the hold is
lost (or its recipe closes under it), every guard of the hold is fired: the guarded task gets
**one** ``task.cancel()`` (from its innermost guard). When the body's scope exits, the guard
turns that cancellation into the recipe's :class:`~etcd_recipes.errors.LostError` subclass
(``LockLostError``, ``PermitLostError``, ``LeadershipLostError``; the cause chained) and undoes
its own cancel request (``Task.uncancel()``), so an enclosing ``asyncio.timeout`` or anyio scope
does not mistake it for its own. Two cases keep the original exception: a cancellation that
someone else requested too (``Task.cancelling()`` grew beyond what the guard issued: theirs
wins, unchanged), and an inner scope that already raised the ``LostError``.

Why ``task.cancel()`` and not an anyio cancel scope: the blocking facade runs a ``with``
block's ``__aenter__`` and ``__aexit__`` as two calls into one task on its loop thread, each
inside a shielded scope of its own, so a cancel scope opened by ``__aenter__`` could neither be
exited by ``__aexit__`` nor reach the task between the two calls. A task cancellation reaches
that task wherever it waits (in the facade: for the caller's thread to leave the block), and
the guard converts it at ``__aexit__``. The body itself runs in the caller's thread and cannot
be interrupted there; the ``LostError`` is raised when the block ends, and ``is_lost`` and the
listeners tell earlier. In async code the body is interrupted at its next ``await``.

Not guaranteed: detection takes time (up to a keep-alive interval, or the watch's delivery);
a paused process notices only when it runs again. Use the fencing compare for writes that
must not happen after the hold is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import Task
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.txn import AnyOp, Cmp, Compare
from ..client.convert import guarded_delete
from ..client.lease import AcquisitionLease
from ..errors import LostError
from ..types import EventType, TxnResult, WatchEvent
from .waiting import wait_for_change

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["RELEASE_TIMEOUT", "BodyGuard", "Hold", "cancelling"]

RELEASE_TIMEOUT = 5.0
"""Seconds a release's guarded delete may take; unanswered, the key is left to the lease."""

log = library_logger("etcd_recipes.hold")


def cancelling(task: asyncio.Task[Any]) -> int:
    """``task.cancelling()`` (Python >= 3.11), else 0."""
    count = getattr(task, "cancelling", None)
    return int(count()) if count is not None else 0


class BodyGuard:
    """One scoped body's registration for loss: its task, and whether it was fired."""

    __slots__ = ("active", "cancelling", "fired", "issued", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.active = True
        self.fired = False
        self.issued = False  # our task.cancel() took effect (to be undone with uncancel())
        self.cancelling = cancelling(task)

    def leave(
        self, exc: BaseException | None, lost: Callable[[], LostError]
    ) -> BaseException | None:
        """Deactivate; the error to raise instead of ``exc`` (``None``: let ``exc`` be)."""
        self.active = False
        if not self.fired:
            return None
        if self.issued:
            uncancel = getattr(self.task, "uncancel", None)
            if uncancel is not None:
                uncancel()
        if isinstance(exc, LostError):
            return None  # an inner block converted already
        if isinstance(exc, asyncio.CancelledError) and cancelling(self.task) > self.cancelling:
            return None  # the task is being cancelled by someone else too: theirs wins
        return lost()


def _fire(guards: Sequence[BodyGuard]) -> None:
    """Mark the active guards fired; cancel each of their tasks once (from its innermost)."""
    innermost: dict[asyncio.Task[Any], BodyGuard] = {}
    for guard in guards:
        if guard.active and not guard.fired:
            guard.fired = True
            innermost[guard.task] = guard
    for task, guard in innermost.items():
        if not task.done():
            guard.issued = task.cancel("the hold was lost")


class Hold:
    """One exclusive hold: ``key`` created at ``fencing_token`` on ``lease``."""

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
        self.key: bytes | str = key
        """The key this hold owns."""
        self.lease: AcquisitionLease = lease
        """The acquisition lease the key is attached to."""
        self.fencing_token: int = create_revision
        """The key's create revision: strictly greater for every later hold on the path."""
        self._error = error
        self._owner = owner
        self._lost = False
        self.lost_cause: BaseException | None = None
        self._released = False
        self._guards: list[BodyGuard] = []
        self._loss_hooks: list[Callable[[BaseException | None], None]] = []
        self._monitor: asyncio.Task[None] | None = None
        self.delete_confirmed: bool = False
        """After :meth:`release`: whether etcd answered its guarded delete."""
        self.released_current: bool = False
        """After :meth:`release`: whether the hold was still current when it let go (what
        ``release()`` returns -- also known when a deferred cancellation propagates instead)."""
        self.listeners: ListenerSet = ListenerSet("hold-lost")

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
        """Run ``success`` only while this hold is current (plus any ``extra`` compares)."""
        return await self._client.txn([self.compare(), *extra], success, failure)

    def add_listener(self, listener: Callable[[BaseException | None], Any]) -> None:
        """Call ``listener(cause)`` once, when the hold is lost."""
        self.listeners.add(listener)

    def add_loss_hook(self, hook: Callable[[BaseException | None], None]) -> None:
        """Call ``hook(cause)`` synchronously when the hold is lost, before its scoped bodies
        are cancelled (for the recipe's own bookkeeping; user listeners use
        :meth:`add_listener`, which runs them later, on the loop)."""
        self._loss_hooks.append(hook)

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

    def _mark_lost(self, cause: BaseException | None, *, releasing: bool = False) -> None:
        if self._lost or (self._released and not releasing):
            return
        self._lost = True
        self.lost_cause = cause
        log.warning("%s: hold lost (%s)", self._owner, cause)
        for hook in self._loss_hooks:
            try:
                hook(cause)
            except Exception:
                log.exception("%s: a loss hook failed", self._owner)
        _fire(self._guards)
        with contextlib.suppress(RuntimeError):
            self.listeners.emit(cause)

    @contextlib.asynccontextmanager
    async def scope(self, lost: Callable[[], LostError] | None = None) -> AsyncIterator[Hold]:
        """Run a body that is **cancelled** if the hold is lost (see the module docstring); the
        body's caller then gets ``lost()`` -- by default the recipe's
        :class:`~etcd_recipes.errors.LostError` subclass, cause chained.
        """
        if self._lost:
            raise self._lost_error()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Hold.scope() runs in an asyncio task")
        guard = BodyGuard(task)
        self._guards.append(guard)
        convert = lost or self._lost_error
        try:
            yield self
        except BaseException as exc:
            self._guards.remove(guard)
            replacement = guard.leave(exc, convert)
            if replacement is not None:
                raise replacement from exc
            raise
        self._guards.remove(guard)
        replacement = guard.leave(None, convert)
        if replacement is not None:
            raise replacement

    def cancel_bodies(self, *, sparing: Task[Any] | None = None) -> None:
        """Cancel the scoped bodies of this hold (its recipe is closing), except ``sparing``'s
        (the task that closes it): they raise their ``lost()`` error, as on loss."""
        _fire([g for g in self._guards if g.task is not sparing])

    def _lost_error(self) -> LostError:
        err = self._error(f"{self._owner}: the hold was lost ({self.lost_cause})")
        err.__cause__ = self.lost_cause
        return err

    async def release(self) -> bool:
        """Delete the key (only if it is still this hold's) and revoke the lease.

        Returns False if the hold had already been lost -- or was found lost by the release
        itself: the delete is guarded on the key, so when its compare fails the hold was not
        current any more (a process paused past its TTL, say) and the loss is reported now,
        to the loss hooks and listeners, as the monitor would have. ``delete_confirmed`` then
        tells whether etcd answered the delete (False: the key may still exist). Idempotent;
        bounded (the delete's own deadline, :data:`RELEASE_TIMEOUT`).

        Cancellation-safe without a shield scope of its own: a cancellation that arrives while
        the delete is in flight waits for etcd's answer (shielded, bounded), the release
        completes, and the cancellation propagates afterwards.
        """
        if self._released:
            return False
        self._released = True
        was_lost = self._lost
        deferred: list[BaseException] = []
        current: bool | None = None
        try:
            current = await guarded_delete(
                self._client, self.key, self.fencing_token, timeout=RELEASE_TIMEOUT, settle=deferred
            )
        except Exception:
            pass
        # The delete goes first (a successor waiting on this key learns of it one monitor
        # teardown sooner); the monitor ignores what it sees once the hold is released, and
        # the guarded delete's answer is the authority on whether the hold was still current.
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            monitor.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await monitor
            was_lost = was_lost or self._lost
        self.delete_confirmed = current is not None
        if current is False and not was_lost:
            cause = self.lease.lost_cause if self.lease.is_lost else None
            self._mark_lost(
                cause
                or self._error(
                    f"{self._owner}: the hold was not current at release "
                    "(its key or lease was gone)"
                ),
                releasing=True,
            )
            was_lost = True
        self.released_current = not was_lost
        await self.lease.revoke()
        if deferred:
            raise deferred[0]
        return not was_lost
