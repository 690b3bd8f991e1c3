"""Leader election: :class:`LeaderSelector`, :class:`LeaderLatch`, :class:`LeaderObserver`, and
pass-throughs to etcd's own election service.

:Status: Beta

Which one to use:

* :class:`LeaderSelector` -- leadership lasts while your coroutine
  ``take_leadership(term)`` runs; one :meth:`~LeaderSelector.start` (or
  :meth:`~LeaderSelector.run`) is one candidacy of at most one term; reusable afterwards;
* :class:`LeaderLatch` -- holds leadership from winning until ``aclose()`` or loss, and
  contests again by itself after a loss; :meth:`~LeaderLatch.await_leadership` waits for it;
* :class:`LeaderObserver` -- does not run: it reports who leads (``current_leader``,
  listeners, and an async iterator of :class:`Elected` / :class:`Vacated` events).

Key layout (shared with the JVM library, so selectors, latches and observers interoperate, in
Python and JVM processes alike):

* ``<path>/LEADER`` = ``"<client_id>:<7 random chars>"`` on a **per-term lease that is never
  healed**, created with ``If(version == 0)``;
* ``<path>/participants/<client_id>`` = ``client_id`` on a **self-healing** lease, created with
  ``If(version == 0)``, present while an instance is a candidate.

Guarantees:

* at most one LEADER key exists, so at most one term is current in etcd at any revision;
* every term has a **fencing token** (the LEADER key's create revision, strictly increasing
  from term to term) and a compare (:meth:`LeadershipTerm.compare`) that makes a transaction
  commit only while that term is current -- the only protection that survives a paused or
  partitioned leader;
* **lost means lost**: when the term's lease is lost (expired, revoked, renewals stopped past
  the TTL) or its LEADER key is deleted, the leader steps down at once -- ``is_leader`` turns
  False, the ``take_leadership`` task is cancelled (unless ``cancel_on_loss=False``), the
  leadership listeners get ``False``, ``connection_state`` becomes ``LOST`` and the loss is
  recorded as a :class:`~etcd_recipes.errors.LeadershipLostError`; the term is never healed;
* a campaign waits for the LEADER key's deletion with a watch anchored at the read that saw the
  key (revision + 1), and re-checks after every watch recovery, so a hand-over is never missed;
* cancelling a campaign (``run()``, ``await_leadership()``, ``async with``) withdraws the
  candidacy: no participant key and no LEADER key of this instance stays behind;
* the observer re-reads the LEADER key after every watch recovery and ignores events older
  than what it has read, so it never reports a stale leader after a reconnect.

Not guaranteed: leadership is a lease. A leader that is paused or partitioned longer than its
TTL keeps *believing* it leads until it notices (up to a keep-alive interval after it runs
again); use the fencing compare for writes that must not happen after a term ended. A
JVM leader may run its term a little past its lease, like any lease-based leader.

Deviations from the reference: ``take_leadership`` receives the :class:`LeadershipTerm` (not the
selector), so that the blocking facade can pass it to a thread; :meth:`LeaderLatch.await_leadership`
is released by ``aclose()`` (it returns False); the participant list is one consistent read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import anyio

from ._core.hold import Hold
from ._core.keys import TOKEN_LENGTH, append_to_path, key_bytes, random_token
from ._core.lease import AcquisitionLease, SelfHealingLease, validate_ttl
from ._core.listeners import ListenerSet
from ._core.recipe import Recipe
from ._core.txn import AnyOp, Cmp, Compare, Op
from ._core.waiting import abort_guard, run_shielded, wait_for_change
from ._proto_election import MESSAGES
from ._proto_election.calls import stream as _election_stream
from ._proto_election.calls import unary as _election_unary
from .codecs import to_bytes
from .errors import (
    AlreadyStartedError,
    DuplicateParticipantError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdServerError,
    EtcdTimeoutError,
    InvalidArgumentError,
    LeadershipLostError,
    LeaseEventError,
    LeaseNotFoundError,
    RetriesExhaustedError,
    UsageError,
    WatchFailedError,
)
from .events import (
    ConnectionState,
    LeaseEvent,
    LeaseExpired,
    LeaseRestored,
    WatchFailed,
    WatchResubscribed,
)
from .resilience import RetryPolicy
from .types import EventType, KeyValue, RangeResult, SortOrder, SortTarget, TxnResult, WatchEvent

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = [
    "DEFAULT_TTL",
    "DuplicateParticipantError",
    "Elected",
    "ElectionLeaderKey",
    "LeaderLatch",
    "LeaderObserver",
    "LeaderSelector",
    "LeadershipEvent",
    "LeadershipTerm",
    "Participant",
    "Vacated",
    "election_campaign",
    "election_leader",
    "election_observe",
    "election_proclaim",
    "election_resign",
    "get_participants",
    "leadership_events",
]

log = logging.getLogger("etcd_recipes.election")

DEFAULT_TTL = 2
"""Default lease TTL (seconds) of leadership terms and participation keys."""

_SUFFIX = 1 + TOKEN_LENGTH  # ":" + the random token of a LEADER value
_RELINQUISH_TIMEOUT = 5.0
_CAMPAIGN_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.1, max_delay=2.0)
_TRANSIENT = (EtcdConnectionError, EtcdTimeoutError, RetriesExhaustedError)


# --------------------------------------------------------------------------- keys


def _leader_key(path: str) -> str:
    return append_to_path(path, "LEADER")


def _participants_prefix(path: str) -> str:
    return append_to_path(path, "participants/")


def _leader_name(value: bytes) -> str:
    """The client id in a LEADER value ``"<client_id>:<7 chars>"`` (the reference strips 8)."""
    text = value.decode("utf-8", errors="replace")
    if len(text) > _SUFFIX and text[-_SUFFIX] == ":":
        return text[:-_SUFFIX]
    return text


def _is_delete(event: WatchEvent) -> bool:
    return event.type is EventType.DELETE


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Participant:
    """One candidate of an election: its ``client_id`` and whether it currently leads.

    Example::

        for p in await get_participants(client, "/elections/jobs"):
            print(p.client_id, "(leader)" if p.is_leader else "")
    """

    client_id: str
    is_leader: bool


@dataclass(frozen=True)
class Elected:
    """``leader`` (a client id) holds the term whose fencing token is ``fencing_token``.

    Example::

        if isinstance(event, Elected):
            print(event.leader, event.fencing_token)
    """

    leader: str
    fencing_token: int


@dataclass(frozen=True)
class Vacated:
    """Nobody leads (the LEADER key does not exist).

    Example::

        if isinstance(event, Vacated):
            print("no leader")
    """


LeadershipEvent = Union[Elected, Vacated]
"""What a :class:`LeaderObserver` reports: :class:`Elected` or :class:`Vacated`."""


class LeadershipTerm:
    """One leadership term won by a :class:`LeaderSelector` or :class:`LeaderLatch`.

    A plain object (no I/O), usable from any thread: ``take_leadership`` receives it.

    Example::

        async def take_leadership(term: LeadershipTerm) -> None:
            result = await client.txn([term.compare()], [Op.put("/jobs/owner", term.leader_id)])
            if not result.succeeded:
                ...  # the term already ended: someone else may lead now
    """

    def __init__(self, hold: Hold, leader_id: str, value: str, key: str) -> None:
        self._hold = hold
        self.leader_id = leader_id
        """The client id of the leader (this instance)."""
        self.value = value
        """The LEADER key's value, ``"<client_id>:<7 random chars>"``."""
        self.key = key
        """The LEADER key, ``<path>/LEADER``."""
        self.fencing_token = hold.fencing_token
        """The LEADER key's create revision: strictly greater for every later term."""
        self.lease_id = hold.lease.id
        """The id of the term's lease (never re-granted)."""
        self._ended = False
        self._notified = False

    @property
    def is_current(self) -> bool:
        """True until the term ends (its body returned, the recipe closed) or is lost.

        A blocking ``take_leadership`` (sync facade, run in a thread) cannot be cancelled:
        poll this instead.
        """
        return not self._ended and not self._hold.is_lost

    @property
    def is_lost(self) -> bool:
        """Whether the term was lost (lease expired or LEADER key deleted) rather than ended."""
        return self._hold.is_lost

    @property
    def lost_cause(self) -> BaseException | None:
        """Why the term was lost (``None`` if it was not)."""
        return self._hold.lost_cause

    def compare(self) -> Compare:
        """A compare true only while this term's LEADER key exists: include it in a transaction
        to fence writes (``create_revision(LEADER) == fencing_token``)."""
        return self._hold.compare()

    def __repr__(self) -> str:
        state = "current" if self.is_current else ("lost" if self.is_lost else "ended")
        return f"<LeadershipTerm {self.leader_id} token={self.fencing_token} {state}>"


async def get_participants(client: EtcdClient, path: str) -> list[Participant]:
    """The candidates of the election at ``path``, in the order they joined (one consistent
    read of ``<path>/LEADER`` and ``<path>/participants/``; advisory).

    Example::

        names = [p.client_id for p in await get_participants(client, "/elections/jobs")]
    """
    result = await client.txn(
        [],
        [
            Op.get(_leader_key(path)),
            Op.get(
                _participants_prefix(path),
                prefix=True,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.ASCEND,
            ),
        ],
    )
    leader_read, members = result.responses
    assert isinstance(leader_read, RangeResult)
    assert isinstance(members, RangeResult)
    leader = _leader_name(leader_read.kvs[0].value) if leader_read.kvs else None
    out = []
    for kv in members.kvs:
        cid = kv.value.decode("utf-8", errors="replace")
        out.append(Participant(cid, cid == leader))
    return out


# --------------------------------------------------------------------------- candidates


class _Candidate(Recipe):
    """What selectors and latches share: participation, campaigning, terms and step-down."""

    def __init__(
        self, client: EtcdClient, path: str, *, lease_ttl: float, client_id: str | None
    ) -> None:
        super().__init__(client, path, client_id=client_id)
        self.lease_ttl = validate_ttl(lease_ttl)
        """Seconds: the TTL of each term's lease and of the participation key's lease."""
        self._leader = _leader_key(path)
        self._participant = append_to_path(_participants_prefix(path), self.client_id)
        self._participation: SelfHealingLease | None = None
        self._term: LeadershipTerm | None = None
        self._leadership_listeners = ListenerSet("leadership", self._record_listener_error)
        self._changed = asyncio.Event()

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

            r = await selector.guarded_txn([Op.put("/jobs/config", b"v2")])
        """
        self._check_open()
        term = self._term
        if term is None or not term.is_current:
            raise LeadershipLostError(f"{self.exception_context}: not the leader")
        return await self._client.txn([term.compare(), *extra], success, failure)

    def add_leadership_listener(self, listener: Callable[[bool], Any]) -> None:
        """Call ``listener(True)`` when this instance becomes leader and ``listener(False)``
        when it stops (term ended, lost, or closed) -- the reference's ``isLeader()`` /
        ``notLeader()``, in order."""
        self._leadership_listeners.add(listener)

    def remove_leadership_listener(self, listener: Callable[[bool], Any]) -> None:
        """Stop calling ``listener``."""
        self._leadership_listeners.remove(listener)

    # ------------------------------------------------------------------ participation

    async def _join(self) -> None:
        """Create ``participants/<client_id>`` on a self-healing lease (waiting up to twice the
        TTL for a leftover key with our client id to expire)."""
        if self._participation is not None:
            return
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
        if not isinstance(event, LeaseRestored):
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
            trigger=_is_delete,
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
                    term = await self._attempt(lease)
                except (*_TRANSIENT, LeaseNotFoundError) as exc:
                    failures += 1
                    self._record_exception(exc, "campaign")
                    await withdraw()
                    lease = None
                    delay = _CAMPAIGN_BACKOFF.next_delay(failures, time.monotonic() - started)
                    await asyncio.sleep(delay or 1.0)
                    continue
                if term is not None:  # the lease now belongs to the term
                    self._client.resilience.metrics.record_latency(
                        "election.campaign", time.monotonic() - started
                    )
                    return term
                failures = 0

    async def _attempt(self, lease: AcquisitionLease) -> LeadershipTerm | None:
        """One attempt: create LEADER on ``lease``, or wait until the LEADER key is deleted."""
        value = f"{self.client_id}:{random_token()}"
        result = await self._client.txn(
            [Cmp.missing(self._leader)], [Op.put(self._leader, value, lease=lease.id)]
        )
        if result.succeeded:
            hold = Hold(
                self._client,
                self._leader,
                lease,
                result.revision,
                LeadershipLostError,
                self.exception_context,
            )
            hold.start_monitor(after_revision=result.revision)
            return LeadershipTerm(hold, self.client_id, value, self._leader)
        await self._wait_deleted(self._leader, result.revision)
        return None

    def _begin_term(self, term: LeadershipTerm) -> None:
        self._term = term
        term._hold.add_listener(lambda cause: self._step_down(term))
        if self._state is ConnectionState.LOST:
            self._set_state(ConnectionState.RECONNECTED)
        log.info("%s: elected (fencing token %d)", self.exception_context, term.fencing_token)
        self._leadership_listeners.emit(True)
        self._wake()

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
        else:
            log.info("%s: term %d ended", self.exception_context, term.fencing_token)
        self._leadership_listeners.emit(False)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class LeaderSelector(_Candidate):
    """Runs for election; when elected, runs ``take_leadership(term)``. Leadership lasts while
    that coroutine runs.

    Example::

        async def take_leadership(term: LeadershipTerm) -> None:
            print("leading with token", term.fencing_token)
            await do_the_leader_work()  # cancelled on a loss (a blocking body polls is_current)

        selector = LeaderSelector(client, "/elections/jobs", take_leadership)
        await selector.run()                 # campaign, lead, step down; or: start()

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

            with anyio.move_on_after(30):      # give up campaigning after 30 s
                term = await selector.run()
        """
        self._check_open()
        if self.is_active:
            raise AlreadyStartedError(f"{self.exception_context}: a candidacy is in progress")
        self._idle.clear()
        return await self._candidacy()

    async def wait_until_finished(self, timeout: float | None = None) -> bool:
        """Wait until the current candidacy (campaign and term) is over; False on timeout.

        Example::

            await selector.start()
            await selector.wait_until_finished()
        """
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError(f"timeout must be > 0 seconds or None, got {timeout}")
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


class LeaderLatch(_Candidate):
    """Holds leadership from winning until ``aclose()`` or loss, and contests again by itself
    after a loss.

    Example::

        async with LeaderLatch(client, "/elections/jobs") as latch:
            if await latch.await_leadership(timeout=10):
                print("leading with token", latch.fencing_token)

    ``start()`` (or ``async with``) registers the candidacy and returns; the campaign runs in
    the background. ``start()`` and ``aclose()`` are one-shot.
    """

    one_shot = True

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
    ) -> None:
        super().__init__(client, path, lease_ttl=lease_ttl, client_id=client_id)
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

            while not await latch.await_leadership(timeout=5):
                print("still waiting; leader is", (await latch.participants()))
        """
        self._check_started()
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError(f"timeout must be > 0 seconds or None, got {timeout}")
        if self.has_leadership:
            return True
        async with abort_guard(self.aclose, what=f"{self.exception_context}: withdraw"):
            with anyio.move_on_after(timeout):
                while not self.has_leadership and not self.is_closed:
                    await self._changed.wait()
        return self.has_leadership

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
                await asyncio.sleep(_CAMPAIGN_BACKOFF.next_delay(failures, 0.0) or 1.0)
                continue
            failures = 0
            self._begin_term(term)
            try:
                with contextlib.suppress(LeadershipLostError):
                    async with term._hold.scope():
                        await anyio.sleep_forever()
            finally:
                self._step_down(term)
                await term._hold.release()  # shielded and bounded

    async def _do_close(self) -> None:
        task, self._contest_task = self._contest_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task})
        await self._leave()
        self._wake()


# --------------------------------------------------------------------------- observer


class LeaderObserver(Recipe):
    """Reports who leads an election, without running for it.

    Example::

        async with LeaderObserver(client, "/elections/jobs") as observer:
            print("leader now:", observer.current_leader)
            async for event in observer.events():   # Elected(...) / Vacated(), current first
                print(event)

    Listeners (:meth:`add_listener`) get each change, not the state at ``start()``; the
    iterator of :meth:`events` starts with the current state. After any watch recovery
    (reconnect, compaction) the LEADER key is read again, so a change missed while
    disconnected is reported and a stale leader never is.
    """

    one_shot = True

    def __init__(self, client: EtcdClient, path: str) -> None:
        super().__init__(client, path)
        self._leader = _leader_key(path)
        self._current: Elected | None = None
        self._revision = 0
        self._listeners = ListenerSet("leadership-event", self._record_listener_error)
        self._subscribers: set[asyncio.Queue[LeadershipEvent | None]] = set()
        self._failure: BaseException | None = None

    @property
    def current_leader(self) -> str | None:
        """The leader's client id, or ``None`` when nobody leads (as last observed)."""
        return self._current.leader if self._current is not None else None

    @property
    def current(self) -> LeadershipEvent:
        """The current state as an event: :class:`Elected` (with the fencing token) or
        :class:`Vacated`."""
        return self._current if self._current is not None else Vacated()

    def add_listener(self, listener: Callable[[LeadershipEvent], Any]) -> None:
        """Call ``listener(event)`` for every change of leader (not for the initial state)."""
        self._listeners.add(listener)

    def remove_listener(self, listener: Callable[[LeadershipEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._listeners.remove(listener)

    async def events(self) -> AsyncIterator[LeadershipEvent]:
        """The current state, then every change, until the observer is closed.

        Raises :class:`~etcd_recipes.errors.WatchFailedError` if the watch gave up.

        Example::

            async for event in observer.events():
                if isinstance(event, Elected) and event.leader == me:
                    ...
        """
        self._check_started()
        queue: asyncio.Queue[LeadershipEvent | None] = asyncio.Queue()
        queue.put_nowait(self.current)
        if self._failure is not None:
            queue.put_nowait(None)  # the watch already gave up: end after the last state
        self._subscribers.add(queue)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    if self._failure is not None:
                        raise self._failure
                    return
                yield item
        finally:
            self._subscribers.discard(queue)

    async def _do_start(self) -> None:
        read = await self._client.range(self._leader)
        self._apply_read(read, notify=False)
        self._spawn(self._observe(read.revision), "watch")

    async def _observe(self, revision: int) -> None:
        async def resync() -> int:
            read = await self._client.range(self._leader)
            self._apply_read(read)
            return read.revision + 1

        watch = self._client.watch(self._leader, start_revision=revision + 1, resync=resync)
        failure: EtcdRecipeError
        try:
            async with watch:
                async for item in watch:
                    if isinstance(item, WatchEvent):
                        self._apply_event(item)
                        continue
                    self._on_recovery_event(item)
                    if isinstance(item, WatchResubscribed):
                        try:
                            self._apply_read(await self._client.range(self._leader))
                        except EtcdRecipeError as exc:  # the watch's own events still follow
                            self._record_exception(exc, "re-read")
                    elif isinstance(item, WatchFailed):
                        break
            failure = WatchFailedError(f"{self.exception_context}: the watch on LEADER failed")
        except EtcdRecipeError as exc:  # the watch failed for good, or the client was closed
            failure = exc
        if self.is_closed:
            return
        self._failure = failure
        self._record_exception(failure, "watch")
        self._set_state(ConnectionState.LOST)
        self._end_subscribers()

    def _apply_read(self, read: RangeResult, *, notify: bool = True) -> None:
        if read.revision < self._revision:
            return
        self._revision = read.revision
        kv = read.kvs[0] if read.kvs else None
        self._set(Elected(_leader_name(kv.value), kv.create_revision) if kv else None, notify)

    def _apply_event(self, event: WatchEvent) -> None:
        if event.kv.mod_revision <= self._revision:
            return  # already reflected by a later read
        self._revision = event.kv.mod_revision
        if event.type is EventType.PUT:
            self._set(Elected(_leader_name(event.kv.value), event.kv.create_revision))
        else:
            self._set(None)

    def _set(self, new: Elected | None, notify: bool = True) -> None:
        if new == self._current:
            return
        self._current = new
        if not notify:
            return
        event: LeadershipEvent = new if new is not None else Vacated()
        log.info("%s: %s", self.exception_context, event)
        self._listeners.emit(event)
        for queue in self._subscribers:
            queue.put_nowait(event)

    def _end_subscribers(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)

    async def _do_close(self) -> None:
        self._end_subscribers()


async def leadership_events(client: EtcdClient, path: str) -> AsyncIterator[LeadershipEvent]:
    """The leadership events of ``path`` (current state first) from a private
    :class:`LeaderObserver` that lives as long as the iteration (the reference's
    ``leadershipAsFlow``). Close the iterator (``contextlib.aclosing``) to stop early.

    Example::

        async with contextlib.aclosing(leadership_events(client, "/elections/jobs")) as events:
            async for event in events:
                print(event)
    """
    async with LeaderObserver(client, path) as observer:
        async for event in observer.events():
            yield event


# --------------------------------------------------------------------------- etcd's election API


@dataclass(frozen=True)
class ElectionLeaderKey:
    """The leadership returned by :func:`election_campaign` (etcd's ``LeaderKey``): pass it to
    :func:`election_proclaim` and :func:`election_resign`.

    ``key`` is ``<name>/<lease id in hex>``; ``revision`` its create revision (a fencing
    token: guard writes with ``Cmp.create_revision(key) == revision``).

    Example::

        leader = await election_campaign(client, "jobs", "node-1", lease=lease.id)
        print(leader.key, leader.revision)
    """

    name: bytes
    key: bytes
    revision: int
    lease: int


def _leader_key_pb(client: EtcdClient, leader: ElectionLeaderKey) -> Any:
    return MESSAGES["LeaderKey"](
        name=client._k(leader.name),
        key=client._k(leader.key),
        rev=leader.revision,
        lease=leader.lease,
    )


async def election_campaign(
    client: EtcdClient,
    name: bytes | str,
    value: bytes | str,
    *,
    lease: int,
    timeout: float | None = None,
) -> ElectionLeaderKey:
    """Campaign in etcd's election service (``etcdctl elect``, Go's ``concurrency.Election``):
    blocks until this campaign leads ``name``, with ``value`` proclaimed.

    ``lease`` must be a live lease you keep alive (``client.lease(ttl)``); leadership ends when
    it does. ``timeout`` bounds the wait (:class:`~etcd_recipes.errors.EtcdTimeoutError`).
    Cancelled or timed out, the campaign's key ``<name>/<lease hex>`` is deleted.
    Prefer :class:`LeaderSelector` / :class:`LeaderLatch`, which manage leases, loss and fencing.

    Example::

        async with client.lease(10) as lease:
            leader = await election_campaign(client, "jobs", "node-1", lease=lease.id)
            ...
            await election_resign(client, leader)
    """
    if isinstance(lease, bool) or not isinstance(lease, int) or lease <= 0:
        raise InvalidArgumentError(
            "election_campaign needs the id of a live lease (lease=0 would make the server "
            "create an orphaned 60 s lease)"
        )
    raw_name = key_bytes(name)
    own_key = raw_name + b"/" + f"{lease:x}".encode()
    request = MESSAGES["CampaignRequest"](
        name=client._k(raw_name), lease=lease, value=to_bytes(value)
    )

    async def withdraw() -> None:
        await client.txn([Cmp.lease(own_key) == lease], [Op.delete(own_key)])

    async with abort_guard(withdraw, what=f"election_campaign({raw_name!r}): withdraw"):
        try:
            resp = await _election_unary(
                client, "Campaign", request, op="election_campaign", retry=False, timeout=timeout
            )
        except EtcdServerError as exc:
            if "deadline exceeded" in exc.details.lower():
                raise EtcdTimeoutError(
                    f"election_campaign({raw_name!r}): not elected within {timeout}s"
                ) from exc
            raise
    leader = resp.leader
    return ElectionLeaderKey(
        client._strip(bytes(leader.name)),
        client._strip(bytes(leader.key)),
        int(leader.rev),
        int(leader.lease),
    )


async def election_proclaim(
    client: EtcdClient, leader: ElectionLeaderKey, value: bytes | str
) -> None:
    """Publish a new ``value`` for a leadership won with :func:`election_campaign`.

    Raises :class:`~etcd_recipes.errors.NotLeaderError` if that leadership is over.

    Example::

        await election_proclaim(client, leader, "node-1 (draining)")
    """
    request = MESSAGES["ProclaimRequest"](
        leader=_leader_key_pb(client, leader), value=to_bytes(value)
    )
    await _election_unary(client, "Proclaim", request, op="election_proclaim")


async def election_leader(client: EtcdClient, name: bytes | str) -> KeyValue | None:
    """The current leader's key and proclaimed value for ``name``, or ``None`` without one.

    Example::

        kv = await election_leader(client, "jobs")
        print(kv.text if kv else "no leader")
    """
    request = MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    try:
        resp = await _election_unary(client, "Leader", request, op="election_leader")
    except EtcdServerError as exc:
        if "election: no leader" in exc.details:
            return None
        raise
    return client._kv(resp.kv)


async def election_observe(client: EtcdClient, name: bytes | str) -> AsyncIterator[KeyValue]:
    """The leader of ``name`` (when there is one) and every later proclamation or new leader.

    etcd's ``Observe`` never reports that an election became vacant -- use
    :class:`LeaderObserver` for that. The stream is cancelled when the iteration stops.

    Example::

        async for kv in election_observe(client, "jobs"):
            print(kv.key, kv.text)
    """
    request = MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    async for resp in _election_stream(client, "Observe", request, op="election_observe"):
        yield client._kv(resp.kv)


async def election_resign(client: EtcdClient, leader: ElectionLeaderKey) -> None:
    """Give up a leadership won with :func:`election_campaign` (deletes its key; the next
    campaigner, if any, is elected). Resigning an ended leadership is a no-op.

    Example::

        await election_resign(client, leader)
    """
    request = MESSAGES["ResignRequest"](leader=_leader_key_pb(client, leader))
    await _election_unary(client, "Resign", request, op="election_resign")
