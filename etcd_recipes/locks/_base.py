"""The lock surface shared by the mutex and the read-write lock's views: per-task holds and
reentrancy, timeouts, scoped bodies cancelled on loss, fencing, and waiting by create revision
for the nearest conflicting predecessor. Package-private.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from .._core.caller import Caller, caller_or_none
from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.shield import run_shielded
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import AnyOp, Compare
from .._core.validate import check_timeout
from .._recipe.hold import Hold
from .._recipe.recipe import Recipe
from ..client.convert import EnqueueTxn
from ..client.lease_pool import LeaseCheckout, PooledLease
from ..errors import (
    LeaseNotFoundError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LostError,
    RecipeClosedError,
)
from ..events import LeaseExpired
from ..types import KeyValue, TxnResult
from ._holds import _Acquisition, _Held, _lost_while_running, _scoped_body, _TaskHold
from ._line import _BOUNDED, _Abort, _Aborted, _Bounded, _Line
from ._session import (
    _abandon,
    _Busy,
    _deadline_scope,
    _Entered,
    _monitor_soon,
    _Requeue,
    _Session,
    _task,
)
from ._waiters import _read_queue, _wait_for_deletion
from .hold import LockHold, LockLostListener

if TYPE_CHECKING:
    pass

log = library_logger("etcd_recipes.lock")


class _LockBase(ABC):
    """The lock surface shared by :class:`DistributedMutex` and :class:`ReadWriteLockView`:
    per-task holds and reentrancy, timeouts, scoped bodies cancelled on loss, fencing."""

    def __init__(
        self,
        recipe: Recipe,
        session: _Session,
        name: str,
        *,
        line: _Line | None = None,
    ) -> None:
        self._recipe = recipe
        self._session = session
        self._name = name
        self._line = line  # the turn taken before queueing in etcd (see _local_line)
        self._holds: dict[Caller, _TaskHold] = {}  # by owner: a task, or a facade thread
        self._entered = _Entered()  # what async with entered, per caller
        self._aborts: set[anyio.CancelScope | _Abort] = set()
        self._lost_listeners = ListenerSet("lock-lost", recipe._record_listener_error)
        self._lost_events: Broadcast[BaseException | None] = recipe._broadcast("lock-lost")

    # ---------------------------------------------------------------- hooks

    @abstractmethod
    async def _take(self, wait: bool, abort: _Abort | _Bounded) -> _Held:
        """Queue in etcd and wait (through ``abort.wait``) until admitted, cleaning up on any
        exception; without ``wait``, raise :class:`_Busy` instead of waiting."""

    def _reuse(self, task: Caller) -> _Held | None:
        """A hold ``task`` already has that this acquisition may share (downgrade)."""
        return None

    # ---------------------------------------------------------------- lookups

    def _mine(self, task: Caller | None) -> _TaskHold | None:
        """The task's hold, else the latest hold of a task that has finished."""
        own = self._holds.get(task) if task is not None else None
        if own is not None:
            return own
        orphans = [th for th in self._holds.values() if th.task.done()]
        return orphans[-1] if orphans else None

    def _any(self) -> _TaskHold | None:
        """:meth:`_mine` for the calling task, else the only hold there is."""
        found = self._mine(caller_or_none())
        if found is None and len(self._holds) == 1:
            found = next(iter(self._holds.values()))
        return found

    def _caller(self) -> _TaskHold | None:
        # Outside any task and facade call the question is about the instance.
        task = caller_or_none()
        return self._mine(task) if task is not None else self._any()

    # ---------------------------------------------------------------- acquire / release

    async def acquire(self, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``timeout`` seconds pass first (nothing is left queued).
        ``timeout=0`` tries once and does not wait.

        Cancellation is safe: the waiter key is deleted (and the lease revoked when unused)
        before the cancellation propagates.
        Reentrant per task (``hold_count`` counts it).

        Example::

            from etcd_recipes import DistributedMutex

            lock = DistributedMutex(client, f"{prefix}/job")
            if await lock.acquire(timeout=5):
                try:
                    print("held:", lock.is_held)
                finally:
                    await lock.release()
            await lock.aclose()
        """
        self._recipe._check_open()
        timeout = check_timeout(timeout, zero=True)
        task = _task()
        mine = self._holds.get(task)
        if mine is not None:
            if not mine.is_valid:
                raise LockLostError(
                    f"{self._name}: this task's hold was lost; release() it before acquiring"
                )
            mine.count += 1
            return True
        shared = self._reuse(task)
        if shared is not None:
            self._adopt(task, shared)
            return True
        started = time.monotonic()
        recipe = self._recipe
        # metered_acquisition, inlined (one coroutine frame less on the hot path).
        metric = _Acquisition(recipe._meter, recipe.path)
        try:
            held = await self._acquire_new(timeout)
        except BaseException as exc:
            metric.failed(exc)
            raise
        if held is None:
            metric.end("timeout")
            return False
        metric.end("acquired")
        self._adopt(task, held.metered(recipe._meter))
        recipe._record_latency("lock.acquire", started)
        return True

    async def _acquire_new(self, timeout: float | None) -> _Held | None:
        held: _Held | None = None
        if timeout is None:  # no cancel scope unless it waits (see _Abort)
            abort = _Abort()
            self._aborts.add(abort)
            try:
                held = await self._admit(True, abort)
            except _Aborted:
                held = None
            finally:
                self._aborts.discard(abort)
        else:
            with _deadline_scope(timeout) as scope:
                self._aborts.add(scope)
                try:
                    held = await self._admit(timeout != 0, _BOUNDED)
                except _Busy:
                    held = None
                finally:
                    self._aborts.discard(scope)
        if held is not None and self._recipe.is_closed:
            await self._release_held(held)
            held = None
        if held is None and self._recipe.is_closed:
            raise RecipeClosedError(f"{self._name}: the acquisition was aborted by aclose()")
        return held

    async def _admit(self, wait: bool, abort: _Abort | _Bounded) -> _Held:
        line = self._line
        if line is not None and not line.take():
            if not wait:
                raise _Busy("another task of this process holds or is taking the lock")
            await line.wait(abort)
        try:
            held = await self._take(wait, abort)
        except BaseException:
            if line is not None:
                line.release()
            raise
        held.line = line
        return held

    def _adopt(self, task: Caller, held: _Held) -> None:
        held.refs += 1
        if self not in held.views:
            held.views.append(self)
        self._holds[task] = _TaskHold(task, held)

    async def release(self) -> bool:
        """Release one hold count of the calling task's hold (or of a finished task's).

        Returns True if the lock was held until now, False if it had been lost (or released by
        ``aclose()``). Raises :class:`LockNotHeldError` if there is nothing to release.

        Example::

            from etcd_recipes import DistributedMutex

            lock = DistributedMutex(client, f"{prefix}/job")
            await lock.acquire()
            if not await lock.release():
                print("we had lost the lock; our writes were fenced off")
            await lock.aclose()
        """
        th = self._mine(caller_or_none())
        if th is None:
            raise LockNotHeldError(f"{self._name}: the calling task holds no lock to release")
        # Not through _release_task_hold: one coroutine frame less on the hot path.
        held = self._unwind(th)
        if held is None:
            return th.is_valid
        return await self._release_held(held, view_done=True)

    async def _release_task_hold(self, th: _TaskHold) -> bool:
        held = self._unwind(th)
        if held is None:
            return th.is_valid
        return await self._release_held(held, view_done=True)

    def _unwind(self, th: _TaskHold) -> _Held | None:
        """One level of ``th``'s reentrancy undone: ``None`` while the task still holds it,
        else the hold to release (no longer the task's)."""
        if th.count > 1:
            th.count -= 1
            return None
        if self._holds.get(th.task) is th:
            del self._holds[th.task]
        return th.held

    async def _release_held(self, held: _Held, *, view_done: bool = False) -> bool:
        drop = False
        if view_done:
            held.refs -= 1
            drop = not any(th.held is held for th in self._holds.values()) and self in held.views
        if held.refs > 0:
            if drop:
                held.views.remove(self)
            return not (held.hold.is_lost or held.hold.is_released)
        try:
            return await held.release()  # a loss found by the release reaches our listeners
        finally:
            if drop and self in held.views:
                held.views.remove(self)

    # ---------------------------------------------------------------- scoped forms

    @contextlib.asynccontextmanager
    async def with_lock(self, timeout: float | None = None) -> AsyncIterator[LockHold]:
        """``async with lock.with_lock(timeout=5) as hold:`` -- acquire, run the body, release.

        Raises :class:`LockTimeoutError` (a ``TimeoutError``) if not acquired in time: the
        body **never** runs without the lock. If the hold is lost while the body runs, the
        body is cancelled and :class:`~etcd_recipes.errors.LockLostError` raised. The body
        gets the :class:`LockHold` (fencing token, compare, guarded transactions).

        Example::

            from etcd_recipes import DistributedMutex, Op

            mutex = DistributedMutex(client, f"{prefix}/report-lock")
            async with mutex.with_lock(timeout=5) as hold:
                await hold.guarded_txn([Op.put(f"{prefix}/report/owner", "me")])
            await mutex.aclose()
        """
        if not await self.acquire(timeout):
            raise LockTimeoutError(f"{self._name}: not acquired within {timeout}s")
        th = self._holds[_task()]
        lost = _lost_while_running(self._name, "lock", th.held, LockLostError)
        async with _scoped_body(th.held, lost, lambda: self._release_task_hold(th)) as hold:
            yield hold

    async def _enter(self) -> None:
        await self._entered.enter(self.with_lock())

    async def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._entered.exit(self._name, exc_type, exc, tb)

    # ---------------------------------------------------------------- state

    def _describe(self) -> str:
        """The instance's state for ``repr`` (any caller, any thread: no I/O, no task)."""
        if self._recipe.is_closed:
            return "closed"
        try:
            holds = list(self._holds.values())
        except RuntimeError:  # changed meanwhile (a facade repr runs in the caller's thread)
            holds = []
        live = [th for th in holds if th.is_valid]
        waiting = ", acquiring" if self._aborts else ""
        if live:
            hold = live[-1].held.hold
            count = f"{len(live)} holders, " if len(live) > 1 else ""
            return f"held ({count}token {hold.fencing_token}, lease {hold.lease.id:x}){waiting}"
        if any(th.held.hold.is_lost for th in holds):
            return f"lost (release() it){waiting}"
        return "acquiring" if waiting else "not held"

    @property
    def is_held(self) -> bool:
        """Whether the calling task holds the lock (and the hold is not lost).

        From outside any task (the blocking facade) it tells whether the instance holds it.
        """
        th = self._caller()
        return th is not None and th.is_valid

    @property
    def hold_count(self) -> int:
        """The calling task's reentrant hold count (0 when not held)."""
        th = self._caller()
        return th.count if th is not None else 0

    @property
    def hold(self) -> LockHold | None:
        """The calling task's hold; if it has none, the only hold of this lock (so the
        blocking facade, where every call runs in its own task, sees it); else ``None``."""
        th = self._any()
        return th.held.public if th is not None else None

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of :attr:`hold`, or ``None``."""
        hold = self.hold
        return hold.fencing_token if hold is not None else None

    def is_owner(self) -> Compare:
        """The compare of :attr:`hold` (see :meth:`LockHold.compare`).

        Raises :class:`LockNotHeldError` when there is no hold.

        Example::

            from etcd_recipes import DistributedMutex, Op

            mutex = DistributedMutex(client, f"{prefix}/lock")
            async with mutex:
                await client.txn([mutex.is_owner()], [Op.put(f"{prefix}/leader-only", b"x")])
            await mutex.aclose()
        """
        hold = self.hold
        if hold is None:
            raise LockNotHeldError(f"{self._name}: not held, so there is no compare")
        return hold.compare()

    async def guarded_txn(
        self,
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp] = (),
        *,
        extra: Sequence[Compare] = (),
    ) -> TxnResult:
        """:meth:`LockHold.guarded_txn` on :attr:`hold`.

        Example::

            from etcd_recipes import DistributedMutex, Op

            mutex = DistributedMutex(client, f"{prefix}/lock")
            async with mutex:
                result = await mutex.guarded_txn([Op.put(f"{prefix}/balance", b"42")])
                print(result.succeeded)  # True while the lock is ours
            await mutex.aclose()
        """
        hold = self.hold
        if hold is None:
            raise LockNotHeldError(f"{self._name}: not held, so there is nothing to guard with")
        return await hold.guarded_txn(success, failure, extra=extra)

    def add_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Call ``listener(cause)`` once each time a hold of this lock is lost.

        Example::

            import logging

            from etcd_recipes import DistributedMutex

            mutex = DistributedMutex(client, f"{prefix}/lock")
            mutex.add_lock_lost_listener(lambda cause: logging.error("lock lost: %s", cause))
            await mutex.aclose()
        """
        self._lost_listeners.add(listener)

    def remove_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Stop calling ``listener``."""
        self._lost_listeners.remove(listener)

    def lock_lost_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[BaseException | None]:
        """The cause (or ``None``) of each later loss of a hold of this lock -- what the
        lock-lost listeners get -- as an async iterator that ends when the instance is closed;
        bounded by ``maxsize`` (see :class:`~etcd_recipes.EventStream`).

        Example::

            from etcd_recipes import DistributedMutex

            mutex = DistributedMutex(client, f"{prefix}/lock")
            losses = mutex.lock_lost_events()
            await mutex.acquire()
            await client.lease_revoke(mutex.hold.lease_id)  # out of band: the hold is lost
            print("lost:", await anext(losses))  # the cause, e.g. a LeaseNotFoundError
            await mutex.release()  # False: it had been lost
            await mutex.aclose()
        """
        return self._lost_events.stream(maxsize)

    # ---------------------------------------------------------------- loss and close

    def _lost(self, held: _Held, cause: BaseException | None) -> None:
        # The hold has cancelled its scoped bodies already (Hold.scope, one mechanism).
        err = LockLostError(f"{self._name}: the lock was lost ({cause})")
        err.__cause__ = cause
        self._recipe._record_exception(err, "lock-lost")
        self._recipe._on_recovery_event(LeaseExpired(held.lease.id, cause))
        self._lost_listeners.emit(cause)
        self._lost_events.publish(cause)

    async def _close_view(self) -> None:
        for scope in list(self._aborts):
            scope.cancel()
        current = asyncio.current_task()
        for th in list(self._holds.values()):
            th.held.hold.cancel_bodies(sparing=current)
        for held in {id(th.held): th.held for th in self._holds.values()}.values():
            await held.release()  # the owners' later release() returns False


class _Queued(_LockBase):
    """Waiting by create revision for the nearest conflicting predecessor (mutex, RW views)."""

    _conflicts: str  # the prefix whose earlier keys conflict with ours
    _prepared: tuple[tuple[str, bytes, int], EnqueueTxn] | None = None
    _lost_error: type[LostError] = LockLostError

    @abstractmethod
    def _new_key(self, lease_id: int) -> tuple[str, bytes]:
        """The key (and value) this waiter queues under."""

    async def _take(self, wait: bool, abort: _Abort | _Bounded) -> _Held:
        while True:
            checkout = await self._session.join()
            key, value = self._new_key(checkout.lease.id)
            try:
                return await self._queue(checkout, key, value, wait, abort)
            except _Requeue as exc:
                self._recipe._record_exception(exc, "requeue")
                log.info("%s: %s; queueing again", self._name, exc)
                await abort.wait(asyncio.sleep(exc.delay))

    def _queue_txn(self, key: str, value: bytes, lease_id: int) -> EnqueueTxn:
        """The queueing transaction for ``key`` on ``lease_id`` (see :class:`EnqueueTxn`),
        encoded once per key and lease (the pool hands an instance the same lease again)."""
        cached = self._prepared
        if cached is not None and cached[0] == (key, value, lease_id):
            return cached[1]
        txn = EnqueueTxn(self._recipe._client, key, value, lease_id, self._conflicts)
        self._prepared = ((key, value, lease_id), txn)
        return txn

    async def _queue(
        self,
        checkout: LeaseCheckout,
        key: str,
        value: bytes,
        wait: bool,
        abort: _Abort | _Bounded,
    ) -> _Held:
        client = self._recipe._client
        lease = checkout.lease
        created = False
        # abort_guard, inlined (the hottest path of the lock recipes): on any exception --
        # cancellation, timeout, error -- the cleanup runs shielded and bounded, then the
        # exception propagates unchanged.
        try:
            txn = self._queue_txn(key, value, lease.id)
            created = True  # from here on the key may exist, whatever the outcome
            try:
                # Settled: a cancellation waits for the create's answer, so the cleanup's
                # delete comes after it (etcd may apply a write whose RPC was cancelled).
                fresh, seen, mine, predecessor = await txn.enqueue()
            except LeaseNotFoundError as exc:  # etcd forgot the lease: requeue with another
                self._session.discard(checkout, exc)
                raise _Requeue(f"lease {lease.id:x} no longer exists", delay=0.0) from exc
            if not fresh:  # our key already exists (a leftover of this lease): find its place
                predecessor, seen = await self._below(key, mine)
            if predecessor is not None:
                if not wait:
                    raise _Busy(f"{self._name}: held by another (timeout=0: not waiting)")
                seen = await abort.wait(self._wait_turn(lease, key, mine, predecessor, seen))
            hold = Hold(client, key, lease, mine, self._lost_error, self._name)
            _monitor_soon(hold, seen)
            return _Held(hold, checkout, self._session)
        except BaseException:

            async def cleanup() -> None:
                await _abandon(client, self._session, checkout, key if created else None)

            await run_shielded(cleanup, what=f"{self._name}: abandoning an acquisition")
            raise

    async def _wait_turn(
        self, lease: PooledLease, key: str, mine: int, predecessor: KeyValue | None, seen: int
    ) -> int:
        """Wait until no conflicting key precedes ours; the revision of the last read."""
        while predecessor is not None:
            await _wait_for_deletion(
                self._recipe._client, lease, predecessor, seen, self._recipe._on_recovery_event
            )
            predecessor, seen = await self._below(key, mine)
        return seen

    async def _below(self, key: str, mine: int) -> tuple[KeyValue | None, int]:
        """The nearest conflicting predecessor, and the revision of the read; checks that our
        own key still exists (the Jepsen check: a waiter whose key or lease vanished must
        never claim the lock)."""
        client = self._recipe._client
        queue = await _read_queue(client, self._conflicts, key, mine, limit=1)
        predecessor = queue.earlier[0] if queue.earlier else None
        if key.startswith(self._conflicts):
            if queue.own is None:
                raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
        elif predecessor is None:  # a reader: our key is not under the conflict prefix
            own = await client.range(key, keys_only=True)
            if not own.kvs or own.kvs[0].create_revision != mine:
                raise _Requeue(f"the waiter key {key} disappeared (lease expired or deleted)")
            return None, own.revision
        return predecessor, queue.revision
