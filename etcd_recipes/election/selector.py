"""Leader election around a body: :class:`LeaderSelector` leads while its coroutine
``take_leadership(selector, term)`` runs; one candidacy is one term, or -- with
``auto_requeue=True`` -- a term after another until ``aclose()``.

The family's guarantees (one LEADER key, fencing, lost means lost, withdrawal on
cancellation) are stated in :mod:`etcd_recipes.election`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._core.shield import run_shielded
from .._core.validate import check_timeout
from ..errors import (
    AlreadyStartedError,
    EtcdTimeoutError,
    InvalidArgumentError,
    LeadershipLostError,
)
from ._candidate import CAMPAIGN_BACKOFF, _Candidate
from ._keys import leader_key
from .terms import DEFAULT_TTL, LeadershipTerm, get_participants

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["LeaderSelector"]

_RELINQUISH_TIMEOUT = 5.0

Hook = Callable[..., Awaitable[None]]


def _takes_selector(hook: Callable[..., Any]) -> bool:
    """Whether ``hook`` takes two positional arguments, ``(selector, term)`` (the Kotlin library's
    ``takeLeadership(selector)`` plus the term), rather than the older ``(term)``."""
    try:
        inspect.signature(hook).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


class LeaderSelector(_Candidate):
    """Runs for election; when elected, runs ``take_leadership(selector, term)``. Leadership
    lasts while that coroutine runs.

    Example::

        from etcd_recipes import LeaderSelector, LeadershipTerm

        async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
            # The leader's work: cancelled on a loss (a blocking body polls term.is_current).
            print(selector.client_id, "leading with token", term.fencing_token)

        async with LeaderSelector(client, f"{prefix}/election", take_leadership) as selector:
            term = await selector.run()  # campaign, lead, step down; or: start()
            assert term is not None and not term.is_current

    :param take_leadership: ``async def take_leadership(selector, term) -> None`` -- what the
        reference passes (the selector) plus the term; a hook of one parameter gets only the
        term (the earlier form, still accepted). The term ends when it returns (or raises).
        With ``cancel_on_loss=True`` (the default) it is cancelled when the term is lost, and
        the caller of :meth:`run` gets :class:`~etcd_recipes.errors.LeadershipLostError`.
    :param relinquish: ``async def relinquish(selector, term) -> None`` (or ``(term)``), always
        called after a term (returned, raised, lost or closed), before the LEADER key is
        deleted; bounded to 5 s.
    :param lease_ttl: seconds; a crashed leader's term ends this long after its last renewal.
    :param cancel_on_loss: set False to let ``take_leadership`` run on after a loss (it should
        then watch ``term.is_current``).
    :param auto_requeue: campaign again after each term (Curator's ``autoRequeue``): one
        candidacy then lasts until ``aclose()``; a term that failed or was lost is recorded
        (``exceptions``) instead of raised, and the next campaign waits, when other candidates
        exist, until one of them has won (at most ``lease_ttl``), so the leadership rotates.
    :param metrics_name: the ``name`` label of its metrics (low-cardinality; ``""``: none).

    One candidacy (``start()`` or ``run()``) is at most one term unless ``auto_requeue``;
    afterwards ``start()`` or ``run()`` may be called again. ``aclose()`` ends a candidacy: a
    campaign is withdrawn, a running term is cancelled, relinquished and released.
    ``async with`` does not start a candidacy, unlike :class:`LeaderLatch`'s: a selector's
    candidacy is a call you make inside the block (``run()`` in the calling task, or
    ``start()``), and ``run()`` could not be called in a block that had already started one.
    The block scopes the selector's life (``aclose()`` on exit), like the Kotlin library's
    ``withLeaderSelector``.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        take_leadership: Hook,
        *,
        relinquish: Hook | None = None,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        cancel_on_loss: bool = True,
        auto_requeue: bool = False,
        metrics_name: str = "",
    ) -> None:
        super().__init__(
            client, path, lease_ttl=lease_ttl, client_id=client_id, metrics_name=metrics_name
        )
        if not callable(take_leadership):
            raise InvalidArgumentError(
                "take_leadership must be an async function of (selector, term) or of the term"
            )
        if relinquish is not None and not callable(relinquish):
            raise InvalidArgumentError(
                "relinquish must be an async function of (selector, term) or of the term"
            )
        if not isinstance(auto_requeue, bool):
            raise InvalidArgumentError(f"auto_requeue must be a bool, not {auto_requeue!r}")
        self._take_leadership = take_leadership
        self._take_gets_selector = _takes_selector(take_leadership)
        self._relinquish = relinquish
        self._relinquish_gets_selector = relinquish is not None and _takes_selector(relinquish)
        self.cancel_on_loss: bool = cancel_on_loss
        """Whether a lost term cancels ``take_leadership``."""
        self.auto_requeue: bool = auto_requeue
        """Whether a candidacy campaigns again after each term (until ``aclose()``)."""
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
        :meth:`start` or :meth:`run` inside to run for election (like the Kotlin library's
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
        ``cancel_on_loss``), or whatever ``take_leadership`` raised. With ``auto_requeue`` it
        leads term after term and returns (the last term) only once ``aclose()`` is called;
        failed or lost terms are recorded instead. Cancelling it withdraws the candidacy (no
        participant or LEADER key left) and re-raises the cancellation.

        Example::

            from etcd_recipes import LeaderSelector, LeadershipTerm

            async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
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

            async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
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
                failures = 0
                while True:
                    term = await self._campaign()
                    try:
                        await self._lead(term)
                        failures = 0
                    except Exception as exc:
                        if not self.auto_requeue:
                            raise
                        if not isinstance(exc, LeadershipLostError):  # a loss is recorded
                            self._record_exception(exc, "take_leadership")
                        failures += 1
                    if not self.auto_requeue:
                        break
                    await self._requeue(term, failures)
            return term
        finally:
            self._scope = None
            self._runner = None
            await run_shielded(self._leave, what=f"{self.exception_context}: leave")
            self._idle.set()
            if self._lifecycle == "started":
                self._lifecycle = "new"  # start() may be called again

    async def _requeue(self, term: LeadershipTerm, failures: int) -> None:
        """Between two terms of an auto-requeued candidacy: back off after failed terms, and
        let another candidate win first when there is one (bounded by the TTL)."""
        if failures:
            await asyncio.sleep(CAMPAIGN_BACKOFF.next_delay(failures, 0.0) or 1.0)
        participants = await get_participants(self._client, self.path)
        if all(p.client_id == self.client_id for p in participants):
            return
        deadline = time.monotonic() + self.lease_ttl
        while time.monotonic() < deadline:
            kv = await self._client.get(leader_key(self.path))
            if kv is not None and kv.create_revision > term.fencing_token:
                return  # someone else won the next term: campaign behind it
            await asyncio.sleep(0.05)

    async def _lead(self, term: LeadershipTerm) -> None:
        await self._begin_term(term)
        try:
            if self.cancel_on_loss:
                async with term._hold.scope():
                    await self._call(self._take_leadership, self._take_gets_selector, term)
            else:
                await self._call(self._take_leadership, self._take_gets_selector, term)
        finally:
            self._step_down(term)
            with anyio.CancelScope(shield=True):
                await self._run_relinquish(term)
                await term._hold.release()

    async def _call(self, hook: Hook, with_selector: bool, term: LeadershipTerm) -> None:
        if with_selector:
            await hook(self, term)
        else:
            await hook(term)

    async def _run_relinquish(self, term: LeadershipTerm) -> None:
        if self._relinquish is None:
            return
        with anyio.move_on_after(_RELINQUISH_TIMEOUT) as scope:
            try:
                await self._call(self._relinquish, self._relinquish_gets_selector, term)
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
