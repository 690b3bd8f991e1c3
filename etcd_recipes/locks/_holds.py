"""The locks family's holds: a hold in etcd shared by the task holds that use it, and the
scoped body that is cancelled when the hold is lost. Package-private.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._core.hold import Hold
from ..errors import (
    LostError,
    RecipeClosedError,
)
from ._session import _cancelling, _Session, _SessionLease, _task
from .hold import LockHold

if TYPE_CHECKING:
    pass


class _LossSink(Protocol):
    def _lost(self, held: _Held, cause: BaseException | None) -> None: ...


class _Held:
    """A hold in etcd, shared by the task holds that use it (a downgraded read shares the
    write's) and released when the last of them lets go."""

    def __init__(self, hold: Hold, lease: _SessionLease, session: _Session) -> None:
        self.hold = hold
        self.lease = lease
        self.session = session
        self.public = LockHold(hold)
        self.refs = 0
        self.done = False
        self.views: list[_LossSink] = []
        self.serial: asyncio.Lock | None = None  # the instance's local turn, held with this
        hold.add_listener(self._on_lost)

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
            self.session.leave(self.lease)
            if self.serial is not None:
                self.serial.release()


class _Guard:
    """Cancels the task running a scoped body when its hold is lost (see :meth:`_LockBase._lost`).

    A plain ``task.cancel()`` rather than an anyio cancel scope, because the blocking facade
    runs ``__aexit__`` inside a shielded scope of its own, which a scope opened by
    ``__aenter__`` cannot be exited from.
    """

    __slots__ = ("active", "cancelling", "fired", "issued", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.active = True
        self.fired = False
        self.issued = False
        self.cancelling = _cancelling(task)


def _fire(guards: Sequence[_Guard]) -> None:
    """Mark every active guard fired; cancel their task once (from the innermost guard)."""
    active = [g for g in guards if g.active and not g.fired]
    for guard in active:
        guard.fired = True
    if active and not active[-1].task.done():
        active[-1].issued = active[-1].task.cancel("the lock hold was lost")


def _leave_guard(
    guard: _Guard, exc: BaseException | None, lost: Callable[[], LostError]
) -> BaseException | None:
    """Deactivate ``guard``; the error to raise instead of ``exc`` (None: let ``exc`` be)."""
    guard.active = False
    if not guard.fired:
        return None
    if guard.issued:
        uncancel = getattr(guard.task, "uncancel", None)
        if uncancel is not None:
            uncancel()
    if isinstance(exc, LostError):
        return None  # an inner block converted already
    if isinstance(exc, asyncio.CancelledError) and _cancelling(guard.task) > guard.cancelling:
        return None  # the task is being cancelled by someone else too: theirs wins
    return lost()


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
    held: _Held,
    guards: list[_Guard],
    lost: Callable[[], LostError],
    release: Callable[[], Awaitable[object]],
) -> AsyncIterator[LockHold]:
    """Run a ``with_lock``/``with_permit`` body under a loss guard, then release.

    If the hold is lost while the body runs, the body is cancelled and ``lost()`` is raised
    instead (the caller's own cancellation, or an inner conversion, wins over it).
    """
    guard = _Guard(_task())
    guards.append(guard)

    def leave(exc: BaseException | None) -> BaseException | None:
        with contextlib.suppress(ValueError):
            guards.remove(guard)
        return _leave_guard(guard, exc, lost)

    try:
        yield held.public
    except BaseException as exc:
        replacement = leave(exc)
        await release()
        if replacement is not None:
            raise replacement from exc
        raise
    replacement = leave(None)
    await release()
    if replacement is not None:
        raise replacement


class _TaskHold:
    __slots__ = ("count", "guards", "held", "task")

    def __init__(self, task: asyncio.Task[Any], held: _Held) -> None:
        self.task = task
        self.held = held
        self.count = 1
        self.guards: list[_Guard] = []

    @property
    def is_valid(self) -> bool:
        return not (self.held.hold.is_lost or self.held.hold.is_released)
