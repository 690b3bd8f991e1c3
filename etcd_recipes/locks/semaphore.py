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
  *rank*), so grants are FIFO by create revision.

Guarantees:

* never more than ``permits`` admitted holders at any revision: a key's rank only shrinks while
  it lives, and a waiter re-reads its rank *and its own key* before it claims a permit;
* waiting is **herd-free**: only the first waiter watches the holders (for deletions); every
  other waiter watches just its predecessor, which touches its own key (one extra write, same
  create revision) when it is admitted after waiting. A release wakes one waiter;
* permits belong to the **instance**, not to a task: any task may ``release()`` (LIFO among the
  instance's permits, like ``java.util.concurrent.Semaphore``), and ``async with semaphore:`` /
  ``with_permit()`` release exactly the permit they took;
* a lost permit (lease expired or revoked, key deleted) is reported once to the permit-lost
  listeners, ``connection_state`` becomes ``LOST``, a scoped body is cancelled with
  :class:`~etcd_recipes.errors.PermitLostError`, and the ``release()`` that would have
  returned it returns False;
* a cancelled or timed-out acquisition deletes its waiter key (and gives its lease back to the
  pool, which revokes it once idle) before the cancellation propagates;
* every permit has a fencing token and a compare (:class:`~etcd_recipes.lock.LockHold`).

Not guaranteed: like every lease-based lock, a holder paused or partitioned past its TTL may
still run while its permit is already someone else's -- fence writes with the permit's compare.
``available_permits()`` is advisory (waiters count as holders, as in the Kotlin library). A JVM
waiter does not touch its key when admitted, so a Python waiter queued right behind it waits
until it releases (correct, just later).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from typing_extensions import Self

from .._core.caller import Caller
from .._core.keys import append_to_path, random_token
from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.shield import abort_guard, settled
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Op
from .._core.validate import check_timeout, check_ttl
from .._recipe.hold import Hold
from .._recipe.recipe import Recipe
from .._recipe.waiting import wait_for_change
from ..client.lease_pool import LeaseCheckout, PooledLease
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
from ..types import EventType, KeyValue, WatchEvent
from ._holds import _Held, _lost_while_running, _scoped_body, metered_acquisition
from ._session import (
    _abandon,
    _Busy,
    _deadline_scope,
    _leased_txn,
    _monitor_soon,
    _range,
    _Requeue,
    _Session,
    _task,
)
from ._waiters import _participants, _read_queue, _wait_unless_lost
from .hold import DEFAULT_TTL, LockHold, LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedSemaphore"]

log = library_logger("etcd_recipes.semaphore")

PermitLostListener = Callable[[BaseException | None], Any]
"""Called with the cause (or ``None``) once per lost permit."""


class _Permit:
    __slots__ = ("counted", "held")

    def __init__(self, held: _Held) -> None:
        self.held = held
        self.counted = False  # counted in the dispossessed tally


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
        self._entered: dict[Caller, list[AbstractAsyncContextManager[LockHold]]] = {}
        self._aborts: set[anyio.CancelScope] = set()
        self._lost_listeners = ListenerSet("permit-lost", self._record_listener_error)
        self._lost_events: Broadcast[BaseException | None] = self._broadcast("permit-lost")

    # ---------------------------------------------------------------- state

    @property
    def held_permits(self) -> int:
        """How many permits this instance holds now (lost ones excluded)."""
        return sum(1 for p in (*self._stack, *self._scoped) if not p.held.hold.is_lost)

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
        """Every holder key, waiters included, in line order (one read, advisory): the first
        ``permits`` of them hold a permit (``is_holder``); ``value`` is the owner's client id.

        Example::

            from etcd_recipes import DistributedSemaphore

            semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
            async with semaphore:
                (me,) = await semaphore.contenders()
                print(me.is_holder, me.value == semaphore.client_id.encode())  # True True
            await semaphore.aclose()
        """
        self._check_open()
        return await _participants(
            self._client, self._holders, lambda rank, kv: rank < self.permits
        )

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

    async def acquire(self, timeout: float | None = None) -> bool:
        """Take a permit; False if ``timeout`` seconds pass first (nothing is left queued).
        ``timeout=0`` tries once and does not wait.

        The permit belongs to the instance: release it with :meth:`release`, from any task.
        Raises :class:`SemaphorePermitMismatchError` on a count mismatch.

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
        permit = await self._acquire_permit(timeout)
        if permit is None:
            return False
        self._stack.append(permit)
        return True

    async def release(self) -> bool:
        """Return the most recently acquired permit (from any task).

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
            return await self._stack.pop().held.release()
        if self._lost_permits:
            permit = self._lost_permits.pop()
            permit.counted = False
            await permit.held.release()
            return False
        raise LockNotHeldError(f"{self.exception_context}: no permit to release")

    async def _acquire_permit(self, timeout: float | None) -> _Permit | None:
        self._check_open()
        timeout = check_timeout(timeout, zero=True)
        started = time.monotonic()
        held = await metered_acquisition(self._meter, self.path, self._admit(timeout))
        if held is None:
            return None
        held.views.append(self)
        self._record_latency("semaphore.acquire", started)
        return _Permit(held)

    async def _admit(self, timeout: float | None) -> _Held | None:
        held: _Held | None = None
        with _deadline_scope(timeout) as abort:
            self._aborts.add(abort)
            try:
                await self._validate()
                held = await self._take(wait=timeout != 0)
            except _Busy:
                held = None
            finally:
                self._aborts.discard(abort)
        if held is not None and self.is_closed:
            await held.release()
            held = None
        if held is None and self.is_closed:
            raise RecipeClosedError(f"{self.exception_context}: aborted by aclose()")
        return held

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

    async def _take(self, wait: bool = True) -> _Held:
        while True:
            checkout = await self._session.join()
            key = f"{self._holders}{self.client_id}:{random_token()}"
            try:
                return await self._queue(checkout, key, wait)
            except _Requeue as exc:
                self._record_exception(exc, "requeue")
                log.info("%s: %s; queueing again", self.exception_context, exc)
                await asyncio.sleep(exc.delay)

    async def _queue(self, checkout: LeaseCheckout, key: str, wait: bool) -> _Held:
        client = self._client
        lease = checkout.lease
        value = self.client_id.encode()
        created = False

        async def cleanup() -> None:
            await _abandon(client, self._session, checkout, key if created else None)

        async with abort_guard(cleanup, what=f"{self.exception_context}: abandoning a waiter"):
            created = True
            first = await settled(
                _leased_txn(
                    client,
                    self._session,
                    checkout,
                    [Cmp.create_revision(key) == 0],
                    [
                        Op.put(key, value, lease=lease.id),
                        Op.get(self._holders, prefix=True, count_only=True),
                    ],
                ),
                what=f"{self.exception_context}: answering a cancelled acquisition",
            )
            if not first.succeeded:
                created = False
                raise _Requeue(f"the random waiter key {key} exists already")
            mine, seen = first.revision, first.revision
            rank = _range(first, 1).count - 1  # every other holder key is older than ours
            waited = False
            while rank >= self.permits:
                if not wait:
                    raise _Busy(f"{self.exception_context}: no permit free (timeout=0)")
                waited = True
                queue = await _read_queue(client, self._holders, key, mine)
                if queue.own is None:
                    raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
                rank, seen = len(queue.earlier), queue.revision
                if rank < self.permits:
                    break
                if rank == self.permits:
                    await self._wait_first(lease, key, mine, queue.earlier, seen)
                else:
                    await self._wait_behind(lease, queue.earlier[0], seen)
            if waited:
                # Admitted after waiting: whoever queued right behind us watches our key, and
                # our admission is its cue to move up (a touch that keeps the create revision).
                touch = await _leased_txn(
                    client,
                    self._session,
                    checkout,
                    [Cmp.create_revision(key) == mine],
                    [Op.put(key, value, lease=lease.id)],
                )
                if not touch.succeeded:
                    raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
                seen = touch.revision
            hold = Hold(client, key, lease, mine, PermitLostError, self.exception_context)
            _monitor_soon(hold, seen)
            return _Held(hold, checkout, self._session)

    async def _wait_first(
        self, lease: PooledLease, key: str, mine: int, earlier: list[KeyValue], seen: int
    ) -> None:
        """First in line: wait for any of the ``permits`` older holder keys to go."""
        client = self._client
        pending = {kv.key for kv in earlier}
        own = key.encode()

        def freed(event: WatchEvent) -> bool:
            pending.discard(event.kv.key)
            return len(pending) < self.permits or event.kv.key == own

        async def probe() -> tuple[bool, int]:
            queue = await _read_queue(client, self._holders, key, mine)
            return len(queue.earlier) < self.permits or queue.own is None, queue.revision

        ok, _ = await _wait_unless_lost(
            lease,
            wait_for_change(
                client,
                self._holders,
                prefix=True,
                after_revision=seen,
                trigger=freed,
                probe=probe,
                no_put=True,
                on_recovery=self._on_recovery_event,
            ),
        )
        if not ok:
            raise _Requeue(f"lease {lease.id:x} was lost while waiting")

    async def _wait_behind(self, lease: PooledLease, predecessor: KeyValue, seen: int) -> None:
        """Further back: wait until the waiter ahead is admitted (it touches its key) or
        leaves (its key is deleted)."""
        client = self._client

        async def probe() -> tuple[bool, int]:
            now = await client.range(predecessor.key, keys_only=True)
            changed = not now.kvs or now.kvs[0].mod_revision != predecessor.mod_revision
            return changed, now.revision

        def moved(event: WatchEvent) -> bool:
            return event.type in (EventType.PUT, EventType.DELETE)

        ok, _ = await _wait_unless_lost(
            lease,
            wait_for_change(
                client,
                predecessor.key,
                after_revision=seen,
                trigger=moved,
                probe=probe,
                on_recovery=self._on_recovery_event,
            ),
        )
        if not ok:
            raise _Requeue(f"lease {lease.id:x} was lost while waiting")

    # ---------------------------------------------------------------- scoped forms

    @contextlib.asynccontextmanager
    async def with_permit(self, timeout: float | None = None) -> AsyncIterator[LockHold]:
        """``async with semaphore.with_permit(timeout=5) as permit:`` -- take a permit for
        the body and return it afterwards.

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
        permit = await self._acquire_permit(timeout)
        if permit is None:
            raise LockTimeoutError(f"{self.exception_context}: no permit within {timeout}s")
        self._scoped.append(permit)
        lost = _lost_while_running(self.exception_context, "permit", permit.held, PermitLostError)
        async with _scoped_body(permit.held, lost, lambda: self._release_scoped(permit)) as hold:
            yield hold

    async def _release_scoped(self, permit: _Permit) -> None:
        with contextlib.suppress(ValueError):
            self._scoped.remove(permit)
        await permit.held.release()

    async def __aenter__(self) -> Self:
        """Take a permit for the body (waits as long as it takes; see :meth:`with_permit`)."""
        cm = self.with_permit()
        await cm.__aenter__()
        self._entered.setdefault(_task(), []).append(cm)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = _task()
        stack = self._entered.get(task)
        if not stack:
            raise LockNotHeldError(f"{self.exception_context}: __aexit__ without __aenter__")
        cm = stack.pop()
        if not stack:
            del self._entered[task]
        await cm.__aexit__(exc_type, exc, tb)

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
            await permit.held.release()
        for permit in self._stack:
            permit.counted = True
        self._lost_permits.extend(self._stack)  # their release() now returns False
        self._stack.clear()
        await self._session.close()
