"""The locks family's holds: a hold in etcd shared by the task holds that use it, and the
scoped body that is cancelled when the hold is lost. Package-private.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from .._core.caller import Caller
from .._core.hold import Hold
from .._core.lease_pool import LeaseCheckout, PooledLease
from ..errors import (
    LostError,
    RecipeClosedError,
)
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
        self.serial: asyncio.Lock | None = None  # the instance's local turn, held with this
        hold.add_loss_hook(self._on_lost)

    def _on_lost(self, cause: BaseException | None) -> None:
        for view in list(self.views):
            view._lost(self, cause)

    async def release(self) -> bool:
        """Delete the key (if it is still ours); False if the hold had been lost."""
        if self.done:
            return False
        self.done = True
        try:
            return await self.hold.release()
        finally:
            if self.serial is not None:
                self.serial.release()
            # A key whose delete etcd did not answer may remain: the pool revokes its lease.
            await self.session.leave(self.checkout, retire=not self.hold.delete_confirmed)


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
    see :mod:`etcd_recipes._core.hold` for the mechanism.
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
