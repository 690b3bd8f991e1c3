"""The locks family's holds: a hold in etcd shared by the task holds that use it, the
scoped body that is cancelled when the hold is lost, and their metrics. Package-private.

Metrics (through the recipe's meter, never inline): every acquisition that is not reentrant
reports ``lock_wait_finished`` once (:class:`_Acquisition`, also the ``lock.acquire`` span);
every hold reports ``lock_hold_finished`` once (``released`` or ``lost``), and a lost one
``lease_lost`` too (:meth:`_Held.metered`). Not guaranteed: an event dropped by a full meter
queue is not retried.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from .._core.caller import Caller
from .._core.metering import RecipeMeter, SpanHandle
from .._recipe.hold import Hold
from .._recipe.outcomes import failure_outcome, hold_loss_kind
from ..client.lease_pool import LeaseCheckout, PooledLease
from ..errors import LostError, RecipeClosedError
from ._line import _Line
from ._session import _Session
from .hold import LockHold

if TYPE_CHECKING:
    pass


class _LossSink(Protocol):
    def _lost(self, held: _Held, cause: BaseException | None) -> None: ...


class _Held:
    """A hold in etcd, shared by the task holds that use it (a downgraded read shares the
    write's) and released when the last of them lets go."""

    def __init__(self, hold: Hold, checkout: LeaseCheckout, session: _Session) -> None:
        self.hold = hold
        self.checkout = checkout
        self.lease: PooledLease = checkout.lease
        self.session = session
        self.public = LockHold(hold)
        self.refs = 0
        self.done = False
        self.views: list[_LossSink] = []
        self.line: _Line | None = None  # the local turn (_local_line), held with this
        self._meter: RecipeMeter | None = None  # set once acquired: then reports its end once
        self._since = 0.0
        hold.add_loss_hook(self._on_lost)

    def metered(self, meter: RecipeMeter) -> _Held:
        """The acquisition succeeded: from now on this hold reports how it ends, once."""
        self._meter, self._since = meter, time.monotonic()
        if self.hold.is_lost:  # lost between admission and now
            self._report("lost")
        return self

    def _report(self, ended: str) -> None:
        meter, self._meter = self._meter, None
        if meter is None:
            return
        meter.lock_hold(time.monotonic() - self._since, ended)
        if ended == "lost":
            meter.lease_lost(hold_loss_kind(self.hold.lease))

    def _pass_turn(self) -> None:
        """Let the next local waiter queue (once: at the release, or at a loss before it)."""
        line, self.line = self.line, None
        if line is not None:
            line.release()

    def _on_lost(self, cause: BaseException | None) -> None:
        self._report("lost")
        self._pass_turn()  # the key is gone or going: whoever is next need not wait for release
        for view in list(self.views):
            view._lost(self, cause)

    async def release(self) -> bool:
        """Delete the key (if it is still ours); False if the hold had been lost."""
        if self.done:
            return False
        self.done = True
        current = False
        try:
            current = await self.hold.release()
            return current
        finally:
            # Cancelled once the delete was answered, the hold still ended "released".
            self._report("released" if current or self.hold.released_current else "lost")
            try:
                # A key whose delete etcd did not answer may remain: the pool revokes its lease.
                await self.session.leave(self.checkout, retire=not self.hold.delete_confirmed)
            finally:
                self._pass_turn()  # after the lease is back: the next one takes the same


class _Acquisition:
    """One (non-reentrant) acquisition being timed: reports ``lock_wait_finished`` and ends
    the ``lock.acquire`` span exactly once, with the outcome."""

    __slots__ = ("_meter", "_span", "_started")

    def __init__(self, meter: RecipeMeter, path: str, **attributes: object) -> None:
        self._meter: RecipeMeter | None = meter
        self._started = time.monotonic()
        self._span: SpanHandle = meter.span("lock.acquire", path, **attributes)

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        """Report ``outcome`` (``acquired``, ``timeout``, ``cancelled``, ``lost``, ``error``)."""
        meter, self._meter = self._meter, None
        if meter is None:
            return
        meter.lock_wait(time.monotonic() - self._started, outcome)
        self._span.end(outcome, error)

    def failed(self, exc: BaseException) -> None:
        """The acquisition raised ``exc``: report the outcome it stands for."""
        self.end(failure_outcome(exc), exc)


async def metered_acquisition(
    meter: RecipeMeter, path: str, acquisition: Awaitable[_Held | None]
) -> _Held | None:
    """Await ``acquisition`` (a new, non-reentrant one) reporting its wait and span once:
    the metered hold it got, or ``None`` when it timed out."""
    metric = _Acquisition(meter, path)
    try:
        held = await acquisition
    except BaseException as exc:
        metric.failed(exc)
        raise
    if held is None:
        metric.end("timeout")
        return None
    metric.end("acquired")
    return held.metered(meter)


def _lost_while_running(
    name: str, what: str, held: _Held, error: type[LostError]
) -> Callable[[], LostError]:
    def lost() -> LostError:
        hold = held.hold
        cause = hold.lost_cause if hold.is_lost else RecipeClosedError("closed")
        err = error(f"{name}: the {what} was lost while the body ran ({cause})")
        err.__cause__ = cause
        return err

    return lost


@contextlib.asynccontextmanager
async def _scoped_body(
    held: _Held, lost: Callable[[], LostError], release: Callable[[], Awaitable[object]]
) -> AsyncIterator[LockHold]:
    """Run a ``with_lock``/``with_permit`` body in the hold's loss scope, then release.

    If the hold is lost (or its recipe closed) while the body runs, the body is cancelled and
    ``lost()`` is raised instead (the caller's own cancellation, or an inner conversion, wins);
    see :mod:`etcd_recipes._recipe.hold` for the mechanism.
    """
    try:
        async with held.hold.scope(lost):
            yield held.public
    finally:
        await release()


class _TaskHold:
    __slots__ = ("count", "held", "task")

    def __init__(self, task: Caller, held: _Held) -> None:
        self.task = task
        self.held = held
        self.count = 1

    @property
    def is_valid(self) -> bool:
        return not (self.held.hold.is_lost or self.held.hold.is_released)
