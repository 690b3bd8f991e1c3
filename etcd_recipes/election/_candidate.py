"""What :class:`~etcd_recipes.LeaderSelector` and :class:`~etcd_recipes.LeaderLatch` share:
participation, campaigning, terms and step-down (private to the election family).

A candidate joins with ``<path>/participants/<client_id>`` on a self-healing lease, then
campaigns: it creates ``<path>/LEADER`` on a fresh term lease with ``If(version == 0)``, or waits
for that key's deletion on one watch per campaign (opened from "now", a read covering the gap
since the failed create) and tries again from the watch loop on each deletion. A won term is a
:class:`~etcd_recipes._recipe.hold.Hold` (``scope()`` cancels the body on a loss, ``release()``
deletes the key and revokes the lease); the term lease is never healed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._core.keys import append_to_path, random_token
from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.shield import abort_guard
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import AnyOp, Cmp, Compare, Op
from .._core.validate import check_ttl
from .._recipe.hold import Hold
from .._recipe.outcomes import failure_outcome, hold_loss_kind
from .._recipe.recipe import Recipe
from .._recipe.waiting import wait_for_change
from ..client.lease import AcquisitionLease, SelfHealingLease
from ..client.watch import Watch
from ..codecs import to_bytes
from ..errors import (
    DuplicateParticipantError,
    EtcdConnectionError,
    EtcdTimeoutError,
    LeadershipLostError,
    LeaseEventError,
    LeaseNotFoundError,
    RetriesExhaustedError,
    WatchFailedError,
)
from ..events import (
    ConnectionState,
    LeaseEvent,
    LeaseExpired,
    LeaseRestored,
    LeaseResumed,
    WatchFailed,
    WatchResubscribed,
    WatchResynced,
)
from ..resilience import RetryPolicy
from ..types import TxnResult, WatchEvent
from ._keys import is_delete, leader_key, participants_prefix, proclaimed_key
from .terms import LeadershipTerm, Participant, get_participants

if TYPE_CHECKING:
    from ..client import EtcdClient

log = library_logger("etcd_recipes.election")

CAMPAIGN_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.1, max_delay=2.0)
TRANSIENT = (EtcdConnectionError, EtcdTimeoutError, RetriesExhaustedError)


class _Candidate(Recipe):
    """What selectors and latches share: participation, campaigning, terms and step-down."""

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float,
        client_id: str | None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """Seconds: the TTL of each term's lease and of the participation key's lease."""
        self._leader = leader_key(path)
        self._proclaimed = proclaimed_key(path)
        self._participant = append_to_path(participants_prefix(path), self.client_id)
        self._participation: SelfHealingLease | None = None
        self._term: LeadershipTerm | None = None
        self._leadership_listeners = ListenerSet("leadership", self._record_listener_error)
        self._announced = False  # what the leadership listeners were told last
        self._leadership_events: Broadcast[bool] = self._broadcast(
            "leadership", current=lambda: self._announced
        )
        self._changed = asyncio.Event()
        self._spent_watch: Watch | None = None  # the campaign's watch, until the win is out

    # ------------------------------------------------------------------ public surface

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads right now (False at once when the term is lost)."""
        return self._term is not None and self._term.is_current

    @property
    def term(self) -> LeadershipTerm | None:
        """The current term, or the most recent one (check ``term.is_current``); ``None``
        before the first win."""
        return self._term

    @property
    def lease_id(self) -> int | None:
        """The lease of the current term, or ``None`` when not leading."""
        term = self._term
        return term.lease_id if term is not None and term.is_current else None

    @property
    def fencing_token(self) -> int | None:
        """The current term's fencing token, or ``None`` when not leading."""
        term = self._term
        return term.fencing_token if term is not None and term.is_current else None

    async def participants(self) -> list[Participant]:
        """The candidates of this election in joining order (see :func:`get_participants`)."""
        return await get_participants(self._client, self.path)

    async def guarded_txn(
        self,
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp] = (),
        *,
        extra: Sequence[Compare] = (),
    ) -> TxnResult:
        """Run ``success`` only while the current term is current in etcd (plus ``extra``).

        Raises :class:`~etcd_recipes.errors.LeadershipLostError` when this instance does not
        lead; a False ``succeeded`` means the term ended between the check and the commit.

        Example::

            from etcd_recipes import LeaderLatch, Op

            async with LeaderLatch(client, f"{prefix}/election") as latch:
                assert await latch.await_leadership(timeout=10)
                result = await latch.guarded_txn([Op.put(f"{prefix}/config", "v2")])
                assert result.succeeded  # committed while this latch's term was current
        """
        self._check_open()
        term = self._term
        if term is None or not term.is_current:
            raise LeadershipLostError(f"{self.exception_context}: not the leader")
        return await self._client.txn([term.compare(), *extra], success, failure)

    async def proclaim(self, value: bytes | str) -> int:
        """Announce ``value`` for the current term without a new term (Go's
        ``Election.Proclaim``): observers report it as ``Elected.value``, with the same leader
        and fencing token. Returns the revision of the write.

        A guarded put: it commits only while this term's LEADER key exists with its fencing
        token and its lease, so a deposed leader cannot proclaim -- it raises
        :class:`~etcd_recipes.errors.LeadershipLostError` then (also when this instance does
        not lead), and nothing is written. The value lives on the term's lease: it goes with
        the term.

        Example::

            from etcd_recipes import Elected, LeaderLatch, LeaderObserver

            async with LeaderLatch(client, f"{prefix}/election") as latch:
                assert await latch.await_leadership(timeout=10)
                async with LeaderObserver(client, f"{prefix}/election") as observer:
                    events = observer.events()
                    assert (await anext(events)).value is None  # nothing proclaimed yet
                    await latch.proclaim("10.0.0.7:8080")
                    event = await anext(events)
                    assert isinstance(event, Elected) and event.value == b"10.0.0.7:8080"
                    assert event.fencing_token == latch.fencing_token  # the same term
        """
        data = to_bytes(value)
        self._check_open()
        term = self._term
        if term is None or not term.is_current:
            raise LeadershipLostError(f"{self.exception_context}: not the leader; not proclaimed")
        result = await self._client.txn(
            [term.compare(), Cmp.lease(self._leader) == term.lease_id],
            [Op.put(self._proclaimed, data, lease=term.lease_id)],
        )
        if not result.succeeded:
            raise LeadershipLostError(
                f"{self.exception_context}: the term {term.fencing_token} is over in etcd; "
                "not proclaimed"
            )
        return result.revision

    def add_leadership_listener(self, listener: Callable[[bool], Any]) -> None:
        """Call ``listener(True)`` when this instance becomes leader and ``listener(False)``
        when it stops (term ended, lost, or closed) -- the Kotlin library's ``isLeader()`` /
        ``notLeader()``, in order."""
        self._leadership_listeners.add(listener)

    def remove_leadership_listener(self, listener: Callable[[bool], Any]) -> None:
        """Stop calling ``listener``."""
        self._leadership_listeners.remove(listener)

    def leadership_events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[bool]:
        """Whether this instance leads now, then each change -- a plain ``bool``, ``True`` on
        winning a term and ``False`` on stepping down, exactly what the leadership listeners
        get -- as an async iterator that ends when the instance is closed.

        Not conflated (every term shows as a ``True`` then a ``False``), bounded by ``maxsize``
        (see :class:`~etcd_recipes.EventStream`). Breaking out of the loop unregisters it.

        Example::

            from etcd_recipes import LeaderLatch

            latch = LeaderLatch(client, f"{prefix}/election")
            leading = latch.leadership_events()
            assert await anext(leading) is False  # not started: not leading
            await latch.start()
            assert await anext(leading) is True  # won the term
            await latch.aclose()  # steps down: the last item is False, then the stream ends
            assert [item async for item in leading] == [False]
        """
        return self._leadership_events.stream(maxsize)

    # ------------------------------------------------------------------ participation

    async def _join(self) -> None:
        """Create ``participants/<client_id>`` on a self-healing lease (waiting up to twice the
        TTL for a leftover key with our client id to expire)."""
        if self._participation is not None:
            return
        # The step-down path (Hold.release, the selector's scopes) uses anyio, whose first call
        # in a process imports its asyncio backend (20-100 ms of CPU): pay it here, not in the
        # middle of a hand-over.
        anyio.CancelScope()
        key, cid = self._participant, self.client_id

        async def establish(lease_id: int) -> bool:
            result = await self._client.txn([Cmp.missing(key)], [Op.put(key, cid, lease=lease_id)])
            return result.succeeded

        lease = self._client.self_healing_lease(self.lease_ttl, establish)
        lease.add_listener(self._on_participation_event)
        deadline = time.monotonic() + 2 * self.lease_ttl + 1
        while not await lease.start():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DuplicateParticipantError(
                    f"{self.exception_context}: another candidate uses client_id {cid!r} "
                    f"({key} exists); give each instance its own client_id"
                )
            read = await self._client.range(key, count_only=True)
            if read.count:
                await self._wait_deleted(key, read.revision, timeout=remaining)
        self._participation = lease

    async def _leave(self) -> None:
        lease, self._participation = self._participation, None
        if lease is not None:
            await lease.aclose()  # revokes: the participation key goes with it

    def _on_participation_event(self, event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        if not isinstance(event, (LeaseRestored, LeaseResumed)):
            self._record_exception(LeaseEventError(event), "participation")

    # ------------------------------------------------------------------ campaigning

    async def _wait_deleted(self, key: str, revision: int, *, timeout: float | None = None) -> bool:
        async def probe() -> tuple[bool, int]:
            read = await self._client.range(key, count_only=True)
            return read.count == 0, read.revision

        return await wait_for_change(
            self._client,
            key,
            after_revision=revision,
            trigger=is_delete,
            probe=probe,
            no_put=True,
            timeout=timeout,
            on_recovery=self._on_recovery_event,
        )

    async def _campaign(self) -> LeadershipTerm:
        """Contest until this instance wins a term; transient failures are recorded and
        retried with backoff. Cancellation leaves no LEADER key or lease of ours behind.

        The term lease is granted before the first attempt and kept (alive, holding no key)
        while waiting, so a hand-over costs the successor one transaction, and nothing runs
        between the read that saw the LEADER key and the watch anchored on it."""
        started = time.monotonic()
        span = self._meter.span("election.campaign", self.path)  # ends elected/cancelled/error
        try:
            term = await self._campaign_until_won(started)
        except BaseException as exc:
            span.end(failure_outcome(exc), exc)
            raise
        span.end("elected")
        return term

    async def _campaign_until_won(self, started: float) -> LeadershipTerm:
        """:meth:`_campaign`'s loop (``started``: when the campaign began)."""
        failures = 0
        lease: AcquisitionLease | None = None

        async def withdraw() -> None:
            # A LEADER key created by a commit whose answer we never saw goes with the lease.
            if lease is not None:
                await lease.revoke()

        async with abort_guard(withdraw, what=f"{self.exception_context}: withdraw"):
            while True:
                try:
                    if lease is None or lease.is_lost:
                        await withdraw()
                        lease = None
                        lease = await self._client.lease(self.lease_ttl).grant()
                    term = await self._contend(lease)
                except (*TRANSIENT, LeaseNotFoundError) as exc:
                    failures += 1
                    self._record_exception(exc, "campaign")
                    await withdraw()
                    lease = None
                    delay = CAMPAIGN_BACKOFF.next_delay(failures, time.monotonic() - started)
                    await asyncio.sleep(delay or 1.0)
                    continue
                if term is not None:  # the lease now belongs to the term
                    self._record_latency("election.campaign", started)
                    return term
                failures = 0

    async def _contend(self, lease: AcquisitionLease) -> LeadershipTerm | None:
        """Create LEADER on ``lease``; while another term holds it, watch it and try again on
        each of its deletions. ``None``: ``lease`` was lost meanwhile (or the watch ended).

        One watch serves the whole wait, however many hand-overs this candidate loses: it is
        opened from "now" (so etcd serves it live, never from its 100 ms catch-up loop for
        watches that replay history), a read covers what fell between the failed claim and
        the watch, and on a deletion the claim is sent from the watch loop at once -- the
        watch is closed only after it has been answered.
        """
        term, seen = await self._claim(lease)
        if term is not None:
            return term
        vacant = False  # what the resync hook's read found

        async def resync() -> int:
            nonlocal vacant
            gone, revision = await self._leader_vacant()
            vacant = vacant or gone
            return revision + 1

        watch = self._client.watch(self._leader, no_put=True, resync=resync)
        await watch.start()
        items = watch.items()
        try:
            # The watch covers every change after the revision its creation reported.
            contend = watch.resume_revision - 1 > seen and (await self._leader_vacant())[0]
            while True:
                if contend:
                    if lease.is_lost:
                        return None
                    term, _ = await self._claim(lease)
                    if term is not None:
                        self._spent_watch = watch  # closed once the win is announced
                        return term
                item = await anext(items, None)
                if item is None:  # closed under us: the caller tries again (or fails)
                    return None
                if isinstance(item, WatchEvent):
                    contend = is_delete(item)
                    continue
                self._on_recovery_event(item)
                if isinstance(item, WatchResynced):
                    contend, vacant = vacant, False
                elif isinstance(item, WatchResubscribed):
                    contend = (await self._leader_vacant())[0]
                elif isinstance(item, WatchFailed):
                    raise WatchFailedError(
                        f"the watch on {item.key!r} failed while campaigning: {item.cause}"
                    ) from item.cause
                else:
                    contend = False
        finally:
            if isinstance(items, AsyncGenerator):
                await items.aclose()  # now, not from a finalizer task at garbage collection
            if self._spent_watch is not watch:
                await watch.aclose()

    async def _leader_vacant(self) -> tuple[bool, int]:
        """Whether no LEADER key exists, and the revision of the read."""
        read = await self._client.range(self._leader, count_only=True)
        return read.count == 0, read.revision

    async def _claim(self, lease: AcquisitionLease) -> tuple[LeadershipTerm | None, int]:
        """Create LEADER on ``lease`` if it does not exist: the won term (its loss monitor is
        started by :meth:`_begin_term`), or ``None``; and the revision of the transaction."""
        value = f"{self.client_id}:{random_token()}"
        result = await self._client.txn(
            [Cmp.missing(self._leader)], [Op.put(self._leader, value, lease=lease.id)]
        )
        if not result.succeeded:
            return None, result.revision
        hold = Hold(
            self._client,
            self._leader,
            lease,
            result.revision,
            LeadershipLostError,
            self.exception_context,
        )
        return LeadershipTerm(hold, self.client_id, value, self._leader), result.revision

    async def _begin_term(self, term: LeadershipTerm) -> None:
        """Start the won term (never suspends: the campaign's watch closes without waiting)."""
        self._term = term
        term._hold.add_listener(lambda cause: self._step_down(term))
        if self._state is ConnectionState.LOST:
            self._set_state(ConnectionState.RECONNECTED)
        self._meter.leadership("acquired")
        log.info(
            "%s: %s elected (fencing token %d)",
            self.exception_context,
            self.client_id,
            term.fencing_token,
        )
        self._announce(True)
        # After the announcement (the listeners are scheduled first): the monitor watches
        # from the term's creation on, so nothing is missed by starting it now.
        term._hold.start_monitor(after_revision=term.fencing_token)
        self._wake()
        spent, self._spent_watch = self._spent_watch, None
        if spent is not None:  # after the announcement: its cancel is queued behind it
            await spent.aclose()

    def _step_down(self, term: LeadershipTerm) -> None:
        """Mark the term over and tell the listeners, once; a lost term is also recorded and
        drives ``connection_state`` to LOST."""
        term._ended = True
        if term._notified:
            return
        term._notified = True
        if term.is_lost:
            cause = term.lost_cause
            err = LeadershipLostError(
                f"{self.exception_context}: leadership lost ({cause}); stepped down"
            )
            err.__cause__ = cause
            self._record_exception(err, "leadership")
            self._on_recovery_event(LeaseExpired(term.lease_id, cause))
            self._meter.leadership("lost")
            self._meter.lease_lost(hold_loss_kind(term._hold.lease))
        else:
            self._meter.leadership("relinquished")
            log.info(
                "%s: %s's term %d ended", self.exception_context, self.client_id, term.fencing_token
            )
        self._announce(False)
        self._wake()

    def _announce(self, leading: bool) -> None:
        self._announced = leading
        self._leadership_listeners.emit(leading)
        self._leadership_events.publish(leading)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
