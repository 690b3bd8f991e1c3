"""Leader election as a state: :class:`LeaderLatch` holds leadership from winning until
``aclose()`` or a loss, and contests again by itself after a loss.

The family's guarantees (one LEADER key, fencing, lost means lost, withdrawal on
cancellation) are stated in :mod:`etcd_recipes.election`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import anyio

from .._core.logctx import recipe_context
from .._core.shield import abort_guard
from .._core.validate import check_timeout
from ..errors import EtcdRecipeError, LeadershipLostError, UsageError
from ._candidate import CAMPAIGN_BACKOFF, _Candidate
from .terms import DEFAULT_TTL

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["LeaderLatch"]


class LeaderLatch(_Candidate):
    """Holds leadership from winning until ``aclose()`` or loss, and contests again by itself
    after a loss.

    Example::

        from etcd_recipes import LeaderLatch

        async with LeaderLatch(client, f"{prefix}/election") as latch:
            if await latch.await_leadership(timeout=10):
                print("leading with token", latch.fencing_token)

    ``start()`` (or ``async with``) registers the candidacy and returns; the campaign runs in
    the background. ``start()`` and ``aclose()`` are one-shot. ``async with`` starts the
    candidacy, unlike :class:`LeaderSelector`'s: a latch's whole life is one candidacy, while
    a selector's candidacies are calls (``run()``, ``start()``) made inside its block.
    ``metrics_name`` is the ``name`` label of its metrics (``leadership_changed``, the
    ``election.campaign`` span; low-cardinality, ``""``: none).
    """

    one_shot = True

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(
            client, path, lease_ttl=lease_ttl, client_id=client_id, metrics_name=metrics_name
        )
        self._contest_task: asyncio.Task[None] | None = None

    @property
    def has_leadership(self) -> bool:
        """Whether this latch leads right now (False at once when the term is lost)."""
        return self.is_leader

    async def await_leadership(self, timeout: float | None = None) -> bool:
        """Wait until this latch leads: True; False on ``timeout`` or when the latch is closed.

        Cancelling it (task cancel, ``anyio.fail_after``, ``asyncio.timeout``, Ctrl-C in the
        sync facade) **withdraws the candidacy** -- the latch is closed, leaving no participant
        or LEADER key -- and re-raises the cancellation. A ``timeout`` does not withdraw.

        Example::

            from etcd_recipes import LeaderLatch

            async with LeaderLatch(client, f"{prefix}/election", client_id="first") as first:
                assert await first.await_leadership(timeout=10)
                async with LeaderLatch(client, f"{prefix}/election", client_id="second") as second:
                    assert not await second.await_leadership(timeout=0.5)  # "first" leads
                    await first.aclose()  # steps down: "second" wins the next term
                    assert await second.await_leadership(timeout=10)
        """
        timeout = check_timeout(timeout)
        self._check_started()
        if self.has_leadership:
            return True
        async with abort_guard(self.aclose, what=f"{self.exception_context}: withdraw"):
            with anyio.move_on_after(timeout):
                while not self.has_leadership and not self.is_closed:
                    await self._changed.wait()
        return self.has_leadership

    async def aclose(self) -> None:
        """Step down and close: the LEADER key (when leading) is deleted first, then the
        participant key and the leases go; nothing of this latch stays in etcd.

        Idempotent; runs to completion even if the caller is being cancelled (shielded and
        bounded), then re-raises the cancellation.

        Example::

            from etcd_recipes import LeaderLatch

            latch = LeaderLatch(client, f"{prefix}/election")
            await latch.start()
            assert await latch.await_leadership(timeout=10)
            await latch.aclose()  # the next candidate may win at once
            assert not latch.has_leadership and latch.is_closed
        """
        term = self._term
        if self._lifecycle != "closed" and term is not None and term.is_current:
            # The hand-over goes first, before the shielded close task is even created: the
            # next candidate waits on this delete. The release is cancellation-safe (a
            # cancel waits for etcd's answer); the contest's own step-down and release then
            # find the term over (both are idempotent).
            try:
                with recipe_context(self.exception_context, self._log_fields):
                    self._step_down(term)  # its "term ended" record carries the fields
                    await term._hold.release()
            finally:
                await super().aclose()
            return
        await super().aclose()

    async def _do_start(self) -> None:
        await self._join()
        self._contest_task = self._spawn(self._contest(), "contest")

    async def _contest(self) -> None:
        failures = 0
        while True:
            try:
                term = await self._campaign()
            except EtcdRecipeError as exc:  # e.g. a watch that gave up: contest again
                if isinstance(exc, UsageError):
                    raise
                failures += 1
                self._record_exception(exc, "contest")
                await asyncio.sleep(CAMPAIGN_BACKOFF.next_delay(failures, 0.0) or 1.0)
                continue
            failures = 0
            await self._begin_term(term)
            try:
                with contextlib.suppress(LeadershipLostError):
                    async with term._hold.scope():
                        # A bare future, not anyio.sleep_forever(): the campaign uses no anyio,
                        # and anyio's first call in a process imports its backend (~0.1 s),
                        # which would fall between the win and the leadership listeners.
                        await asyncio.get_running_loop().create_future()
            finally:
                self._step_down(term)
                await term._hold.release()  # shielded and bounded

    async def _do_close(self) -> None:
        term = self._term
        if term is not None and term.is_current:
            # Hand over first: the next candidate waits on this delete, and nothing of the
            # rest (stopping the contest task, leaving) must come before it. The contest's
            # own step-down and release then find the term over (both are idempotent).
            self._step_down(term)
            await term._hold.release()
        task, self._contest_task = self._contest_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task})
        await self._leave()
        self._wake()
