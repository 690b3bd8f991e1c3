"""A counting semaphore: at most ``permits`` holders across every process on a path.

:Status: Beta

Key layout (shared with the Kotlin library):

* ``<path>/permits`` -- the canonical permit count as a **4-byte big-endian int**, written once
  by the first instance (``If(version == 0)``) and never leased; an instance whose ``permits``
  differs raises :class:`SemaphorePermitMismatchError` on first use;
* ``<path>/holders/<client_id>:<7 chars>`` -- one key per acquisition, **waiters included**,
  value ``client_id``, on an acquisition lease from the client's pool (one not used on this
  path by another permit or waiter of this process; never re-granted under a permit). An
  acquisition is admitted when fewer than ``permits`` holder keys are older than its own (its
  *rank*), so grants are FIFO by create revision;
* ``acquire(permits=n)`` -- **n permits are n holder keys** created in one transaction (one
  create revision, one lease): ``<path>/holders/<client_id>:<7 chars>`` and the same name with
  ``.2`` ... ``.n``. The acquisition is admitted when its rank plus ``n`` is at most
  ``permits``, all its keys at once. Readers that count keys (``available_permits()``,
  ``semaphore show``, the Kotlin library, earlier versions of this one) count it as ``n``,
  so the limit holds across all of them.

Guarantees:

* never more than ``permits`` admitted holders at any revision: a key's rank only shrinks while
  it lives, and a waiter re-reads its rank *and its own key* before it claims a permit;
* waiting is **herd-free** for one-permit waiters: only the first waiter watches the holders
  (for deletions); every other waiter watches just its predecessor, which touches its own key
  (one extra write, same create revision) when it is admitted after waiting. A release wakes
  one waiter -- and every waiter for several permits, which watches the holders' deletions;
* all or nothing: an acquisition of ``n`` permits holds all of them or none, and it keeps its
  place in line (a later one-permit waiter does not overtake it);
* permits belong to the **instance**, not to a task: any task may ``release()`` (LIFO among the
  instance's permits, like ``java.util.concurrent.Semaphore``), and ``async with semaphore:`` /
  ``with_permit()`` release exactly the permit they took;
* a lost permit (lease expired or revoked, key deleted) is reported once to the permit-lost
  listeners, ``connection_state`` becomes ``LOST``, a scoped body is cancelled with
  :class:`~etcd_recipes.errors.PermitLostError`, and the ``release()`` that would have
  returned it returns False;
* a cancelled or timed-out acquisition deletes its waiter key (and gives its lease back to the
  pool, which revokes it once idle) before the cancellation propagates;
* every acquisition has a fencing token and a compare (:class:`~etcd_recipes.lock.LockHold`,
  on its first key).

Not guaranteed: the loss of an acquisition of several permits is watched on its first key
and its lease: a ``.2`` ... ``.n`` key deleted out of band is not noticed (the permits it
stood for are free for others meanwhile). Like every lease-based lock, a holder paused or
partitioned past its TTL may still run while its permit is already someone else's -- fence
writes with the permit's compare.
``available_permits()`` is advisory (waiters count as holders, as in the Kotlin library). A JVM
waiter does not touch its key when admitted, so a Python waiter queued right behind it waits
until it releases (correct, just later).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from typing_extensions import Self

from .._core.keys import append_to_path
from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Op
from .._core.validate import check_int_range, check_timeout, check_ttl
from .._recipe.recipe import Recipe
from ..codecs import INT32
from ..errors import (
    InvalidArgumentError,
    LeaseEventError,
    LockNotHeldError,
    LockTimeoutError,
    PermitLostError,
    RecipeClosedError,
    SemaphorePermitMismatchError,
)
from ..events import LeaseEvent, LeaseExpired, LeaseResumed, LeaseSuspended
from ._holds import _Held, _lost_while_running, _scoped_body, metered_acquisition
from ._permits import _delete_group, _participants, _take
from ._session import _Busy, _deadline_scope, _Entered, _range, _Session
from .hold import DEFAULT_TTL, LockHold, LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedSemaphore"]

log = library_logger("etcd_recipes.semaphore")

PermitLostListener = Callable[[BaseException | None], Any]
"""Called with the cause (or ``None``) once per lost permit."""


class _Permit:
    """One acquisition: ``n`` permits, the hold of its lead key and its other keys."""

    __slots__ = ("counted", "extras", "held", "n")

    def __init__(self, held: _Held, extras: tuple[str, ...]) -> None:
        self.held = held
        self.extras = extras
        self.n = 1 + len(extras)
        self.counted = False  # counted in the dispossessed tally

    async def release(self, client: EtcdClient) -> bool:
        """Delete the other keys (if still ours), then release the lead key's hold."""
        try:
            await _delete_group(client, self.extras, self.held.hold.fencing_token)
        except Exception as exc:  # they go with the lease (revoked once idle); not fatal here
            log.warning("deleting the other keys of %d permits failed: %r", self.n, exc)
        finally:
            self.extras = ()
        return await self.held.release()


class DistributedSemaphore(Recipe):
    """A distributed counting semaphore with ``permits`` permits.

    Example::

        from etcd_recipes import DistributedSemaphore

        semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=3)
        async with semaphore.with_permit(timeout=10) as permit:
            print("token", permit.fencing_token)  # at most 3 of these run cluster-wide
        await semaphore.acquire()  # the split form: any task may release
        await semaphore.release()
        await semaphore.aclose()

    ``async with semaphore:`` takes a permit for the body (it is not the recipe's lifecycle:
    close the instance with ``aclose()``). Not reentrant: every acquisition takes a permit.

    :param permits: at least 1; must match the count stored by the first instance.
    :param lease_ttl: seconds; how long a permit outlives this process if it dies holding it.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        permits: int,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits < 2**31:
            raise InvalidArgumentError(f"permits must be an int >= 1, not {permits!r}")
        self.permits: int = permits
        """The number of permits (the canonical count on the path must match)."""
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """The acquisition lease's TTL in whole seconds."""
        self._permits_key = append_to_path(path, "permits")
        self._holders = append_to_path(path, "holders") + "/"
        self._session = _Session(client, self.lease_ttl, self.path, self._on_lease_event)
        self._validated = False
        self._stack: list[_Permit] = []  # permits taken with acquire(), oldest first
        self._scoped: list[_Permit] = []  # permits of async-with blocks
        self._lost_permits: list[_Permit] = []  # lost acquire() permits not released yet
        self._entered = _Entered()  # what async with entered, per caller
        self._aborts: set[anyio.CancelScope] = set()
        self._lost_listeners = ListenerSet("permit-lost", self._record_listener_error)
        self._lost_events: Broadcast[BaseException | None] = self._broadcast("permit-lost")

    # ---------------------------------------------------------------- state

    @property
    def held_permits(self) -> int:
        """How many permits this instance holds now (lost ones excluded)."""
        return sum(p.n for p in (*self._stack, *self._scoped) if not p.held.hold.is_lost)

    @property
    def hold(self) -> LockHold | None:
        """The most recently acquired live permit of this instance (fencing token and
        compare), or ``None``."""
        for permit in reversed([*self._stack, *self._scoped]):
            if not permit.held.hold.is_lost:
                return permit.held.public
        return None

    async def available_permits(self) -> int:
        """``permits`` minus the holder keys (waiters included): one read, advisory."""
        self._check_open()
        return max(0, self.permits - await self._client.count(self._holders))

    async def contenders(self) -> list[LockParticipant]:
        """Every holder key, waiters included, in line order (one read, advisory): one key per
        permit (an acquisition of ``n`` permits has ``n`` keys, ``is_holder`` on all of them
        or on none); ``value`` is the owner's client id.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
            async with semaphore:
                (me,) = await semaphore.contenders()
                print(me.is_holder, me.value == semaphore.client_id.encode())  # True True
            await semaphore.aclose()
        """
        self._check_open()
        return await _participants(self._client, self._holders, self.permits)

    async def holders(self) -> list[LockParticipant]:
        """The participants that hold a permit now (at most ``permits``); one read, advisory.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
            print(await semaphore.holders())  # []
            await semaphore.aclose()
        """
        return [p for p in await self.contenders() if p.is_holder]

    def __repr__(self) -> str:
        if self.is_closed:
            state = "closed"
        else:
            state = f"{self.held_permits} of {self.permits} permits held"
            if self._lost_permits:
                state += f", {len(self._lost_permits)} lost (release() them)"
            if self._aborts:
                state += ", acquiring"
        return f"<{self.exception_context} {state} {self.connection_state.value}>"

    def add_permit_lost_listener(self, listener: PermitLostListener) -> None:
        """Call ``listener(cause)`` once each time a permit of this instance is lost.

        Example::

            import logging

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=3)
            semaphore.add_permit_lost_listener(lambda cause: logging.error("lost: %s", cause))
            await semaphore.aclose()
        """
        self._lost_listeners.add(listener)

    def remove_permit_lost_listener(self, listener: PermitLostListener) -> None:
        """Stop calling ``listener``."""
        self._lost_listeners.remove(listener)

    def permit_lost_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[BaseException | None]:
        """The cause (or ``None``) of each later loss of a permit of this instance -- what the
        permit-lost listeners get -- as an async iterator that ends when the instance is
        closed; bounded by ``maxsize`` (see :class:`~etcd_recipes.EventStream`).

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
            losses = semaphore.permit_lost_events()
            await semaphore.acquire()
            await client.lease_revoke(semaphore.hold.lease_id)  # out of band: the permit goes
            print("lost:", await anext(losses))  # the cause, e.g. a LeaseNotFoundError
            await semaphore.aclose()
        """
        return self._lost_events.stream(maxsize)

    # ---------------------------------------------------------------- acquire / release

    async def acquire(self, timeout: float | None = None, *, permits: int = 1) -> bool:
        """Take ``permits`` permits (all of them or none); False if ``timeout`` seconds pass
        first (nothing is left queued). ``timeout=0`` tries once and does not wait.

        The permits belong to the instance: release them with :meth:`release`, from any task
        (one ``release()`` returns all the permits of one acquisition). Several permits are as
        many holder keys created in one transaction (see :mod:`etcd_recipes.locks.semaphore`);
        the acquisition is FIFO with the one-permit ones. Raises
        :class:`SemaphorePermitMismatchError` on a count mismatch and
        :class:`~etcd_recipes.errors.InvalidArgumentError` for ``permits`` outside
        ``1..self.permits``.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/slots", permits=2)
            if await semaphore.acquire(timeout=5):
                try:
                    print(semaphore.held_permits)  # 1
                finally:
                    await semaphore.release()
            await semaphore.aclose()
        """
        permit = await self._acquire_permit(timeout, permits)
        if permit is None:
            return False
        self._stack.append(permit)
        return True

    async def try_acquire(self, *, permits: int = 1) -> bool:
        """Take ``permits`` permits if they are free now, without waiting: ``acquire(timeout=0,
        permits=permits)``.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/slots", permits=3)
            print(await semaphore.try_acquire(permits=2))  # True: two of three
            print(await semaphore.try_acquire(permits=2))  # False: one is left
            print(semaphore.held_permits)  # 2
            await semaphore.release()  # both permits of that acquisition
            await semaphore.aclose()
        """
        return await self.acquire(0, permits=permits)

    async def release(self) -> bool:
        """Return the most recently acquired permit (from any task) -- all the permits of
        that acquisition.

        True if it was still held; False if it had been lost (or released by ``aclose()``).
        Raises :class:`~etcd_recipes.lock.LockNotHeldError` when nothing is left to release.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/slots", permits=2)
            await semaphore.acquire()
            print(await semaphore.release())  # True: the permit was held until now
            await semaphore.aclose()
        """
        if self._stack:
            return await self._stack.pop().release(self._client)
        if self._lost_permits:
            permit = self._lost_permits.pop()
            permit.counted = False
            await permit.release(self._client)
            return False
        raise LockNotHeldError(f"{self.exception_context}: no permit to release")

    async def _acquire_permit(self, timeout: float | None, permits: int = 1) -> _Permit | None:
        self._check_open()
        timeout = check_timeout(timeout, zero=True)
        n = check_int_range(permits, what="permits", minimum=1, maximum=self.permits)
        started = time.monotonic()
        extras: list[tuple[str, ...]] = []
        held = await metered_acquisition(self._meter, self.path, self._admit(timeout, n, extras))
        if held is None:
            return None
        held.views.append(self)
        self._record_latency("semaphore.acquire", started)
        return _Permit(held, extras[0])

    async def _admit(
        self, timeout: float | None, n: int, extras: list[tuple[str, ...]]
    ) -> _Held | None:
        permit: _Permit | None = None
        with _deadline_scope(timeout) as abort:
            self._aborts.add(abort)
            try:
                await self._validate()
                permit = _Permit(*await _take(self, n, wait=timeout != 0))
            except _Busy:
                permit = None
            finally:
                self._aborts.discard(abort)
        if permit is not None and self.is_closed:
            await permit.release(self._client)
            permit = None
        if permit is None and self.is_closed:
            raise RecipeClosedError(f"{self.exception_context}: aborted by aclose()")
        if permit is None:
            return None
        extras.append(permit.extras)
        return permit.held

    async def _validate(self) -> None:
        if self._validated:
            return
        key, wanted = self._permits_key, INT32.encode(self.permits)
        while True:
            result = await self._client.txn(
                [Cmp.create_revision(key) == 0], [Op.put(key, wanted)], [Op.get(key)]
            )
            if result.succeeded:
                break
            kvs = _range(result, 0).kvs
            if not kvs:
                continue  # deleted in between: try to create it again
            canonical = INT32.decode(kvs[0].value)
            if canonical != self.permits:
                raise SemaphorePermitMismatchError(
                    f"{self.exception_context}: this instance has {self.permits} permits but "
                    f"the semaphore was created with {canonical}",
                    path=self.path,
                    requested=self.permits,
                    canonical=canonical,
                )
            break
        self._validated = True

    # ---------------------------------------------------------------- scoped forms

    @contextlib.asynccontextmanager
    async def with_permit(
        self, timeout: float | None = None, *, permits: int = 1
    ) -> AsyncIterator[LockHold]:
        """``async with semaphore.with_permit(timeout=5) as permit:`` -- take a permit (or
        ``permits`` of them, all or none) for the body and return them afterwards.

        Raises :class:`~etcd_recipes.lock.LockTimeoutError` (a ``TimeoutError``) if no permit
        came in time: the body **never** runs without one. If the permit is lost meanwhile,
        the body is cancelled and :class:`~etcd_recipes.errors.PermitLostError` raised.

        Example::

            from etcd_recipes import DistributedSemaphore, Op

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=1)
            async with semaphore.with_permit(timeout=5) as permit:
                await permit.guarded_txn([Op.put(f"{prefix}/slot", b"busy")])
            await semaphore.aclose()
        """
        permit = await self._acquire_permit(timeout, permits)
        if permit is None:
            raise LockTimeoutError(f"{self.exception_context}: no permit within {timeout}s")
        self._scoped.append(permit)
        lost = _lost_while_running(self.exception_context, "permit", permit.held, PermitLostError)
        async with _scoped_body(permit.held, lost, lambda: self._release_scoped(permit)) as hold:
            yield hold

    async def _release_scoped(self, permit: _Permit) -> None:
        with contextlib.suppress(ValueError):
            self._scoped.remove(permit)
        await permit.release(self._client)

    async def __aenter__(self) -> Self:
        """Take a permit for the body (waits as long as it takes; see :meth:`with_permit`)."""
        await self._entered.enter(self.with_permit())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._entered.exit(self.exception_context, exc_type, exc, tb)

    # ---------------------------------------------------------------- loss and close

    def _lost(self, held: _Held, cause: BaseException | None) -> None:
        # The hold has cancelled a scoped body already (Hold.scope, one mechanism).
        for permit in [*self._stack, *self._scoped]:
            if permit.held is held and permit in self._stack:
                self._stack.remove(permit)
                permit.counted = True
                self._lost_permits.append(permit)
        err = PermitLostError(f"{self.exception_context}: a permit was lost ({cause})")
        err.__cause__ = cause
        self._record_exception(err, "permit-lost")
        self._on_recovery_event(LeaseExpired(held.lease.id, cause))
        self._lost_listeners.emit(cause)
        self._lost_events.publish(cause)

    def _on_lease_event(self, event: LeaseEvent) -> None:
        if isinstance(event, LeaseSuspended):
            self._on_recovery_event(event)
            self._record_exception(LeaseEventError(event), "lease")
        elif isinstance(event, LeaseResumed):
            self._on_recovery_event(event)  # keep-alives answered again: out of SUSPENDED

    async def _do_close(self) -> None:
        for scope in list(self._aborts):
            scope.cancel()
        current = asyncio.current_task()
        for permit in self._scoped:
            permit.held.hold.cancel_bodies(sparing=current)
        for permit in [*self._stack, *self._scoped]:
            await permit.release(self._client)
        for permit in self._stack:
            permit.counted = True
        self._lost_permits.extend(self._stack)  # their release() now returns False
        self._stack.clear()
        await self._session.close()
