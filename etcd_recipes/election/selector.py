"""Leader election around a body: :class:`LeaderSelector` leads while its coroutine
``take_leadership(term)`` runs; one candidacy is at most one term.

The family's guarantees (one LEADER key, fencing, lost means lost, withdrawal on
cancellation) are stated in :mod:`etcd_recipes.election`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._core.validate import check_timeout
from .._core.waiting import run_shielded
from ..errors import (
    AlreadyStartedError,
    EtcdTimeoutError,
    InvalidArgumentError,
    LeadershipLostError,
)
from ._candidate import _Candidate
from .terms import DEFAULT_TTL, LeadershipTerm

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["LeaderSelector"]

_RELINQUISH_TIMEOUT = 5.0


class LeaderSelector(_Candidate):
    """Runs for election; when elected, runs ``take_leadership(term)``. Leadership lasts while
    that coroutine runs.

    Example::

        from etcd_recipes import LeaderSelector, LeadershipTerm

        async def take_leadership(term: LeadershipTerm) -> None:
            # The leader's work: cancelled on a loss (a blocking body polls term.is_current).
            print("leading with token", term.fencing_token)

        async with LeaderSelector(client, f"{prefix}/election", take_leadership) as selector:
            term = await selector.run()  # campaign, lead, step down; or: start()
            assert term is not None and not term.is_current

    :param take_leadership: ``async def take_leadership(term) -> None``; the term ends when it
        returns (or raises). With ``cancel_on_loss=True`` (the default) it is cancelled when the
        term is lost, and the caller of :meth:`run` gets
        :class:`~etcd_recipes.errors.LeadershipLostError`.
    :param relinquish: ``async def relinquish(term) -> None``, always called after a term
        (returned, raised, lost or closed), before the LEADER key is deleted; bounded to 5 s.
    :param lease_ttl: seconds; a crashed leader's term ends this long after its last renewal.
    :param cancel_on_loss: set False to let ``take_leadership`` run on after a loss (it should
        then watch ``term.is_current``).

    One candidacy (``start()`` or ``run()``) is at most one term; afterwards ``start()`` or
    ``run()`` may be called again. ``aclose()`` ends a candidacy: a campaign is withdrawn, a
    running term is cancelled, relinquished and released. ``async with`` does not start a
    candidacy (it only closes the selector on exit).
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        take_leadership: Callable[[LeadershipTerm], Awaitable[None]],
        *,
        relinquish: Callable[[LeadershipTerm], Awaitable[None]] | None = None,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        cancel_on_loss: bool = True,
    ) -> None:
        super().__init__(client, path, lease_ttl=lease_ttl, client_id=client_id)
        if not callable(take_leadership):
            raise InvalidArgumentError("take_leadership must be an async function of the term")
        if relinquish is not None and not callable(relinquish):
            raise InvalidArgumentError("relinquish must be an async function of the term")
        self._take_leadership = take_leadership
        self._relinquish = relinquish
        self.cancel_on_loss = cancel_on_loss
        """Whether a lost term cancels ``take_leadership``."""
        self._scope: anyio.CancelScope | None = None
        self._runner: asyncio.Task[Any] | None = None
        self._background_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def is_active(self) -> bool:
        """Whether a candidacy (campaign or term) is in progress."""
        return not self._idle.is_set()

    async def __aenter__(self) -> LeaderSelector:
        """``async with`` only scopes the selector's life (``aclose()`` on exit); call
        :meth:`start` or :meth:`run` inside to run for election (like the reference's
        ``withLeaderSelector``)."""
        self._check_open()
        return self

    async def _do_start(self) -> None:
        if self.is_active:
            raise AlreadyStartedError(f"{self.exception_context}: a candidacy is in progress")
        self._idle.clear()
        try:
            await self._join()
        except BaseException:
            self._idle.set()
            raise
        self._background_task = self._spawn(self._background(), "candidacy")

    async def run(self) -> LeadershipTerm | None:
        """Campaign in the calling task, lead while ``take_leadership`` runs, then withdraw.

        Returns the term (ended), or ``None`` if ``aclose()`` was called before winning.
        Raises :class:`~etcd_recipes.errors.LeadershipLostError` if the term was lost (with
        ``cancel_on_loss``), or whatever ``take_leadership`` raised. Cancelling it withdraws the
        candidacy (no participant or LEADER key left) and re-raises the cancellation.

        Example::

            from etcd_recipes import LeaderSelector, LeadershipTerm

            async def take_leadership(term: LeadershipTerm) -> None:
                print("leading with token", term.fencing_token)

            async with LeaderSelector(client, f"{prefix}/election", take_leadership) as selector:
                term = await selector.run()  # campaign, lead while take_leadership runs, withdraw
                print(term is not None)  # True
        """
        self._check_open()
        if self.is_active:
            raise AlreadyStartedError(f"{self.exception_context}: a candidacy is in progress")
        self._idle.clear()
        return await self._candidacy()

    async def wait_until_finished(self, timeout: float | None = None) -> bool:
        """Wait until the current candidacy (campaign and term) is over; False on timeout.

        Example::

            from etcd_recipes import LeaderSelector, LeadershipTerm

            async def take_leadership(term: LeadershipTerm) -> None:
                print("leading with token", term.fencing_token)

            async with LeaderSelector(client, f"{prefix}/election", take_leadership) as selector:
                await selector.start()  # the candidacy runs in the background
                assert await selector.wait_until_finished(timeout=10)
        """
        timeout = check_timeout(timeout)
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        return self._idle.is_set()

    async def _background(self) -> None:
        try:
            with contextlib.suppress(LeadershipLostError):  # recorded when the loss was seen
                await self._candidacy()
        finally:
            if self._background_task is asyncio.current_task():
                self._background_task = None

    async def _candidacy(self) -> LeadershipTerm | None:
        term: LeadershipTerm | None = None
        self._runner = asyncio.current_task()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                await self._join()
                term = await self._campaign()
                await self._lead(term)
            return term
        finally:
            self._scope = None
            self._runner = None
            await run_shielded(self._leave, what=f"{self.exception_context}: leave")
            self._idle.set()
            if self._lifecycle == "started":
                self._lifecycle = "new"  # start() may be called again

    async def _lead(self, term: LeadershipTerm) -> None:
        self._begin_term(term)
        try:
            if self.cancel_on_loss:
                async with term._hold.scope():
                    await self._take_leadership(term)
            else:
                await self._take_leadership(term)
        finally:
            self._step_down(term)
            with anyio.CancelScope(shield=True):
                await self._run_relinquish(term)
                await term._hold.release()

    async def _run_relinquish(self, term: LeadershipTerm) -> None:
        if self._relinquish is None:
            return
        with anyio.move_on_after(_RELINQUISH_TIMEOUT) as scope:
            try:
                await self._relinquish(term)
            except Exception as exc:
                self._record_exception(exc, "relinquish")
        if scope.cancelled_caught:
            self._record_exception(
                EtcdTimeoutError(f"relinquish did not finish within {_RELINQUISH_TIMEOUT}s"),
                "relinquish",
            )

    async def _do_close(self) -> None:
        if self._scope is not None:
            self._scope.cancel()  # a run() in some task: it withdraws and returns
        background, self._background_task = self._background_task, None
        if background is not None and background is not asyncio.current_task():
            background.cancel()  # also when it has not started running yet
            await asyncio.wait({background})
        elif self._runner is not None and self._runner is not asyncio.current_task():
            await self._idle.wait()
        await self._leave()
        self._idle.set()
