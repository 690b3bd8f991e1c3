"""Locks: :class:`DistributedMutex`, :class:`DistributedReadWriteLock`, fencing, and
pass-throughs to etcd's own lock service (:func:`server_lock` / :func:`server_unlock`).

:Status: Beta

Key layouts:

* mutex -- the layout of etcd's own lock (``concurrency.Mutex``, ``etcdctl lock``, the v3lock
  service and the JVM library): ``<path>/<lease id in lowercase hex>`` with an empty value,
  created with ``If(create_revision == 0)``; the owner is the key with the **lowest create
  revision** under ``<path>/``. So a Python mutex, ``etcdctl lock <path>``, Go's
  ``concurrency.Mutex`` and JVM processes on the same path exclude each other;
* read-write lock -- ``<path>/read-<client_id>:<7 chars>`` and ``<path>/write-<client_id>:<7
  chars>``, value ``client_id`` (the JVM library's layout). Prefix reads use ``<path>/`` (the
  reference reads ``<path>`` without the slash, so ``/locks/ab`` disturbed ``/locks/a``).

Every key is attached to the instance's **acquisition lease**, granted on first use and kept
for the instance's later holds (like a Go session), so an uncontended acquire + release costs
two raft writes: one transaction, one delete. The lease is never re-granted under a hold: once
lost, the hold is gone.

Guarantees:

* FIFO by create revision; every waiter waits for the deletion of **its nearest conflicting
  predecessor only** (the mutex and writers: the nearest earlier key; readers: the nearest
  earlier writer), with a watch anchored at the revision of the read that found it plus one.
  A release therefore wakes one waiter (or the readers right behind a writer), not the herd;
* after every wake-up the waiter re-reads its predecessors *and its own key* (one range read;
  a reader reads its key separately before claiming): a waiter whose key or lease vanished
  never claims the lock (the Jepsen 3.4.3 bug); it queues again at the tail (recorded in
  ``exceptions``);
* ``async with lock:`` and ``with_lock(timeout=...)`` never run the body without the lock
  (a timeout raises :class:`LockTimeoutError`); when the hold is **lost** (lease expired or
  revoked, key deleted), the lock-lost listeners fire once, ``connection_state`` becomes
  ``LOST``, the body is **cancelled** and the caller gets a
  :class:`~etcd_recipes.errors.LockLostError`; ``release()`` then returns False;
* cancelling an acquisition (task cancel, ``anyio.fail_after``, ``asyncio.timeout``, Ctrl-C in
  the blocking facade) deletes its waiter key and, when the instance holds nothing else,
  revokes its lease, before the cancellation propagates unchanged; the next waiter in line
  is woken by that deletion and is not delayed;
* every hold has a **fencing token** (its key's create revision, larger for every later hold
  on the path) and a compare (:meth:`LockHold.compare`, :meth:`DistributedMutex.is_owner`) so a
  transaction commits only while the hold is current (:meth:`LockHold.guarded_txn`).

Not guaranteed -- read this: a lease-based lock **does not give mutual exclusion on its own**.
A holder that is paused (GC, SIGSTOP, a slow disk) or partitioned for longer than the lease TTL
keeps running while etcd has already handed the lock to the next waiter, and it learns of the
loss only when it runs again (up to a keep-alive interval later). Writes that must not happen
twice must be fenced: inside etcd with :meth:`LockHold.guarded_txn`, elsewhere by a storage
that rejects tokens older than the newest it has seen. ``is_locked()`` is advisory.

Holds belong to **asyncio tasks**: the task that acquired a lock may re-acquire it (counted by
``hold_count``) and must release it; a hold whose task has finished may be released (and
inspected) by any task. One instance queues in etcd once at a time: its tasks take turns
locally before that (the mutex) or queue in etcd with keys of their own (read-write views).
In the blocking facade every call runs in an event-loop task of its own, so ``with`` blocks on
one instance take turns, but nested blocks (and a downgrade) on one instance are not reentrant
there.

Deviations from the reference: holds are per task, not per thread; waiting uses the
client-side algorithm of ``concurrency.Mutex`` rather than the v3lock RPC (which hands over at
most every 100 ms per waiter, because its watches start behind the head revision) -- the key
layout is the same, so they interoperate; the read-write lock reads ``<path>/``; downgrade keeps
the write key until the read is released too (see :class:`DistributedReadWriteLock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
from aetcd import rpc as pb

from ._core.hold import Hold
from ._core.keys import append_to_path, key_bytes, random_token
from ._core.lease import AcquisitionLease, validate_ttl
from ._core.listeners import ListenerSet
from ._core.recipe import Recipe
from ._core.txn import AnyOp, Cmp, Compare, Op
from ._core.waiting import abort_guard, run_shielded, wait_for_change
from .errors import (
    InvalidArgumentError,
    LeaseEventError,
    LeaseNotFoundError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUpgradeError,
    LostError,
    RecipeClosedError,
    UsageError,
)
from .events import LeaseEvent, LeaseExpired, LeaseSuspended, WatchRecoveryEvent
from .types import (
    EventType,
    KeyValue,
    RangeResult,
    SortOrder,
    SortTarget,
    TxnResult,
    WatchEvent,
)

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = [
    "DistributedMutex",
    "DistributedReadWriteLock",
    "LockHold",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUpgradeError",
    "ReadWriteLockView",
    "server_lock",
    "server_unlock",
]

log = logging.getLogger("etcd_recipes.lock")

DEFAULT_TTL = 2
"""Seconds; the reference's ``DEFAULT_TTL_SECS``."""

_REQUEUE_DELAY = 0.25  # before queueing again after losing the waiter key or lease (reference)
_MONITOR_DELAY = 0.02  # a hold's loss monitor starts this long after the acquisition

_M = TypeVar("_M", bound="DistributedMutex")
_T = TypeVar("_T")

LockLostListener = Callable[[BaseException | None], Any]
"""Called with the cause (or ``None``) once per lost hold."""


# --------------------------------------------------------------------------- errors


class _Requeue(Exception):
    """Our waiter key or lease vanished while waiting: queue again at the tail."""

    def __init__(self, message: str, *, delay: float = _REQUEUE_DELAY) -> None:
        super().__init__(message)
        self.delay = delay


# --------------------------------------------------------------------------- helpers


def _deadline_scope(timeout: float | None) -> anyio.CancelScope:
    """A cancel scope that ``aclose()`` can cancel, expiring after ``timeout`` seconds."""
    if timeout is None:
        return anyio.CancelScope()
    return anyio.CancelScope(deadline=anyio.current_time() + timeout)


def _monitor_soon(hold: Hold, seen: int) -> None:
    """Start watching ``hold`` for loss shortly, unless it is released first.

    Anchored at ``seen`` (the read that confirmed the hold), so a loss in between is still
    seen; short holds -- the common case -- then never pay for a watch of their own.
    """

    def start() -> None:
        if not (hold.is_released or hold.is_lost):
            hold.start_monitor(after_revision=seen)

    asyncio.get_running_loop().call_later(_MONITOR_DELAY, start)


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"timeout must be > 0 seconds or None, got {timeout!r}")


def _task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise UsageError("locks are acquired and released from an asyncio task")
    return task


def _cancelling(task: asyncio.Task[Any]) -> int:
    count = getattr(task, "cancelling", None)  # Python >= 3.11
    return int(count()) if count is not None else 0


class _SessionLease(AcquisitionLease):
    """The acquisition lease shared by an instance's successive holds (a Go "session").

    :class:`~etcd_recipes._core.hold.Hold` revokes its lease on release; here a release must
    keep it for the instance's next hold, so :meth:`revoke` is a no-op and :meth:`end` revokes.
    """

    async def revoke(self) -> None:
        """Kept for the instance's next hold (see :meth:`end`)."""

    async def end(self) -> None:
        """Stop keeping the lease alive and revoke it (shielded and bounded)."""
        await super().revoke()


async def _grant_or_revoke(lease: _SessionLease) -> None:
    """Grant ``lease``; if the caller is cancelled meanwhile, the grant may still land on the
    server, so let it finish (shielded, bounded) and revoke it: no lease is left behind."""
    grant = asyncio.ensure_future(lease.grant())
    try:
        await asyncio.shield(grant)
    except asyncio.CancelledError:

        async def undo() -> None:
            with contextlib.suppress(Exception):
                await grant
            await lease.end()

        await run_shielded(undo, what="revoking the lease of a cancelled acquisition")
        raise


class _Session:
    """The instance's acquisition lease: granted on first use, kept across holds, dropped when
    lost (a new one is granted by the next acquisition), revoked when an aborted acquisition
    leaves it unused, and on close."""

    def __init__(self, client: EtcdClient, ttl: int, on_event: Callable[[LeaseEvent], Any]) -> None:
        self._client = client
        self._ttl = ttl
        self._on_event = on_event
        self._lease: _SessionLease | None = None
        self._users = 0  # waiter keys and holds attached to the current lease
        self._granting: asyncio.Lock | None = None
        self._closed = False

    @property
    def lease(self) -> _SessionLease | None:
        return self._lease

    async def join(self) -> _SessionLease:
        """The live lease (granted if needed), counted as used until :meth:`leave`."""
        if self._closed:
            raise RecipeClosedError("the lock was closed")
        if self._granting is None:
            self._granting = asyncio.Lock()
        async with self._granting:
            lease = self._lease
            if lease is None or lease.is_lost:
                lease = _SessionLease(self._client, self._ttl)
                lease.add_listener(self._on_event)
                await _grant_or_revoke(lease)
                if self._closed:
                    await lease.end()
                    raise RecipeClosedError("the lock was closed")
                self._lease, self._users = lease, 0
            self._users += 1
            return lease

    def discard(self, lease: _SessionLease) -> None:
        """etcd no longer knows ``lease`` (revoked out of band before the keep-alive noticed):
        the next acquisition grants a new one."""
        if lease is self._lease:
            self._lease, self._users = None, 0

    def leave(self, lease: _SessionLease) -> None:
        """A hold on ``lease`` was released; the lease stays for the next acquisition."""
        if lease is self._lease:
            self._users = max(0, self._users - 1)

    async def abandon(self, lease: _SessionLease) -> None:
        """An acquisition on ``lease`` was aborted: revoke the lease if nothing else uses it."""
        if lease is not self._lease:
            return
        self._users = max(0, self._users - 1)
        if self._users == 0 and not lease.is_lost:
            self._lease = None
            await lease.end()

    async def close(self) -> None:
        self._closed = True
        lease, self._lease = self._lease, None
        if lease is not None and not lease.is_lost:
            await lease.end()


def _range(result: TxnResult, index: int) -> RangeResult:
    read = result.responses[index]
    assert isinstance(read, RangeResult)
    return read


async def _leased_txn(
    client: EtcdClient,
    session: _Session,
    lease: _SessionLease,
    compare: Sequence[Compare],
    success: Sequence[AnyOp],
    failure: Sequence[AnyOp] = (),
) -> TxnResult:
    """A transaction that writes with ``lease``. If etcd no longer knows the lease (revoked out
    of band, not noticed by the keep-alive yet), the lease is dropped and the acquisition
    queues again at once with a new one."""
    try:
        return await client.txn(compare, success, failure)
    except LeaseNotFoundError as exc:
        session.discard(lease)
        raise _Requeue(f"lease {lease.id:x} no longer exists", delay=0.0) from exc


@dataclass
class _Queue:
    """One read of a wait queue: the keys created before ours (newest first) and ours."""

    earlier: list[KeyValue]
    own: KeyValue | None  # our key, if it still exists (with our create revision)
    revision: int


async def _read_queue(
    client: EtcdClient, prefix: str, key: str, mine: int, *, limit: int = 0
) -> _Queue:
    """Read, in one plain Range, the keys under ``prefix`` created up to revision ``mine``
    (newest first, keys only, ``limit`` of them besides ours) -- our own key ``key`` among them
    when it lies under ``prefix`` and still exists.

    The filter (``max_create_revision``) is not in :meth:`EtcdClient.range` yet, hence the raw
    request. Deliberately not a read-only transaction: etcd 3.5.0 and 3.5.1 panic (and exit)
    when a client cancels a read-only Txn in flight, and waiters are cancelled routinely.
    """
    request = client._range_request(
        prefix,
        prefix=True,
        limit=limit + 1 if limit else 0,
        sort_target=SortTarget.CREATE,
        sort_order=SortOrder.DESCEND,
        keys_only=True,
    )
    request.max_create_revision = mine
    found = client._range_result(await client._call("range", "Range", pb.KVStub, request))
    kvs = list(found.kvs)
    own_key = key.encode()
    own = None
    if kvs and kvs[0].key == own_key and kvs[0].create_revision == mine:
        own = kvs.pop(0)
    earlier = [kv for kv in kvs if kv.create_revision < mine]
    return _Queue(earlier[:limit] if limit else earlier, own, found.revision)


async def _wait_unless_lost(lease: AcquisitionLease, wait: Awaitable[_T]) -> tuple[bool, _T | None]:
    """Await ``wait``; ``(False, None)`` -- with the wait cancelled -- if ``lease`` is lost first.

    Both helper tasks are finished before this returns or raises (cancellation included).
    """
    waiter = asyncio.ensure_future(wait)
    lost = asyncio.ensure_future(lease.wait_lost())
    try:
        await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, lost):
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(waiter, lost, return_exceptions=True)
    if waiter.cancelled():
        return False, None
    return True, waiter.result()


async def _wait_for_deletion(
    client: EtcdClient,
    lease: AcquisitionLease,
    kv: KeyValue,
    after_revision: int,
    on_recovery: Callable[[WatchRecoveryEvent], Any],
) -> None:
    """Wait until ``kv`` (seen at ``after_revision``) is deleted, watching from
    ``after_revision + 1``. Raises :class:`_Requeue` if our ``lease`` is lost meanwhile."""

    async def probe() -> tuple[bool, int]:
        now = await client.range(kv.key, keys_only=True)
        gone = not now.kvs or now.kvs[0].create_revision != kv.create_revision
        return gone, now.revision

    def deleted(event: WatchEvent) -> bool:
        return event.type is EventType.DELETE

    ok, _ = await _wait_unless_lost(
        lease,
        wait_for_change(
            client,
            kv.key,
            after_revision=after_revision,
            trigger=deleted,
            probe=probe,
            no_put=True,
            on_recovery=on_recovery,
        ),
    )
    if not ok:
        raise _Requeue(f"lease {lease.id:x} was lost while waiting")


# --------------------------------------------------------------------------- holds


class LockHold:
    """One acquired lock or permit, with its **fencing token**.

    ``fencing_token`` is the create revision of the hold's key: strictly larger for every later
    hold on the same path. :meth:`compare` is true only while this hold's key exists, so a
    transaction that includes it commits only while the hold is current -- even when this
    process was paused past its lease and does not know yet that the lock moved on.

    Example::

        async with mutex.with_lock() as hold:
            result = await hold.guarded_txn([Op.put("/accounts/42", b"100")])
            if not result.succeeded:
                ...  # the lock was lost: someone else may own the account now
    """

    def __init__(self, hold: Hold) -> None:
        self._hold = hold

    @property
    def key(self) -> bytes:
        """The key that represents this hold in etcd."""
        return key_bytes(self._hold.key)

    @property
    def fencing_token(self) -> int:
        """The hold's key's create revision (monotonic across holds on the same path)."""
        return self._hold.fencing_token

    @property
    def lease_id(self) -> int:
        """The acquisition lease the key is attached to."""
        return self._hold.lease.id

    @property
    def is_lost(self) -> bool:
        """Whether the hold was lost (its lease or key is gone)."""
        return self._hold.is_lost

    @property
    def is_released(self) -> bool:
        """Whether the hold was released (or its instance closed)."""
        return self._hold.is_released

    def compare(self) -> Compare:
        """``create_revision(key) == fencing_token``: add it to a transaction's compares so
        the transaction commits only while this hold is current.

        Example::

            await client.txn([hold.compare()], [Op.put("/config", b"v2")])
        """
        return self._hold.compare()

    async def guarded_txn(
        self,
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp] = (),
        *,
        extra: Sequence[Compare] = (),
    ) -> TxnResult:
        """Run ``success`` only while this hold is current (and every ``extra`` compare
        holds); otherwise ``failure``. ``result.succeeded`` says which.

        Example::

            result = await hold.guarded_txn([Op.put("/jobs/7/state", b"done")])
        """
        return await self._hold.guarded_txn(success, failure, extra=extra)

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else "released" if self.is_released else "held"
        return f"<LockHold {self.key!r} token={self.fencing_token} {state}>"


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


# --------------------------------------------------------------------------- lock surface


class _LockBase(ABC):
    """The lock surface shared by :class:`DistributedMutex` and :class:`ReadWriteLockView`:
    per-task holds and reentrancy, timeouts, scoped bodies cancelled on loss, fencing."""

    def __init__(
        self, recipe: Recipe, session: _Session, name: str, *, serial: bool = False
    ) -> None:
        self._recipe = recipe
        self._session = session
        self._name = name
        self._serial = asyncio.Lock() if serial else None
        self._holds: dict[asyncio.Task[Any], _TaskHold] = {}
        self._entered: dict[asyncio.Task[Any], list[AbstractAsyncContextManager[LockHold]]] = {}
        self._aborts: set[anyio.CancelScope] = set()
        self._lost_listeners = ListenerSet("lock-lost", recipe._record_listener_error)

    # ---------------------------------------------------------------- hooks

    @abstractmethod
    async def _take(self) -> _Held:
        """Queue in etcd and wait until admitted (cleaning up on any exception)."""

    def _reuse(self, task: asyncio.Task[Any]) -> _Held | None:
        """A hold ``task`` already has that this acquisition may share (downgrade)."""
        return None

    # ---------------------------------------------------------------- lookups

    def _mine(self, task: asyncio.Task[Any] | None) -> _TaskHold | None:
        """The task's hold, else the latest hold of a task that has finished."""
        own = self._holds.get(task) if task is not None else None
        if own is not None:
            return own
        orphans = [th for th in self._holds.values() if th.task.done()]
        return orphans[-1] if orphans else None

    def _any(self) -> _TaskHold | None:
        """:meth:`_mine` for the calling task, else the only hold there is."""
        found = self._mine(asyncio.current_task())
        if found is None and len(self._holds) == 1:
            found = next(iter(self._holds.values()))
        return found

    def _caller(self) -> _TaskHold | None:
        # Outside any task (the blocking facade's reads run as loop callbacks) the question
        # is about the instance.
        task = asyncio.current_task()
        return self._mine(task) if task is not None else self._any()

    # ---------------------------------------------------------------- acquire / release

    async def acquire(self, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``timeout`` seconds pass first (nothing is left queued).

        Reentrant per task: if the calling task holds it already, ``hold_count`` grows and this
        returns True at once. Cancellation is safe: the waiter key is deleted (and the lease
        revoked when unused) before the cancellation propagates.

        Example::

            if await lock.acquire(timeout=5):
                try:
                    ...
                finally:
                    await lock.release()
        """
        self._recipe._check_open()
        _check_timeout(timeout)
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
        held: _Held | None = None
        with _deadline_scope(timeout) as abort:
            self._aborts.add(abort)
            try:
                held = await self._admit()
            finally:
                self._aborts.discard(abort)
        if held is not None and self._recipe.is_closed:
            await self._release_held(held)
            held = None
        if held is None:
            if self._recipe.is_closed:
                raise RecipeClosedError(f"{self._name}: the acquisition was aborted by aclose()")
            return False
        self._adopt(task, held)
        metrics = self._recipe._client._resilience.metrics
        metrics.record_latency("lock.acquire", time.monotonic() - started)
        return True

    async def _admit(self) -> _Held:
        if self._serial is not None:
            await self._serial.acquire()
        try:
            held = await self._take()
        except BaseException:
            if self._serial is not None:
                self._serial.release()
            raise
        held.serial = self._serial
        return held

    def _adopt(self, task: asyncio.Task[Any], held: _Held) -> None:
        held.refs += 1
        if self not in held.views:
            held.views.append(self)
        self._holds[task] = _TaskHold(task, held)

    async def release(self) -> bool:
        """Release one hold count of the calling task's hold (or of a finished task's).

        Returns True if the lock was held until now, False if it had been lost (or released by
        ``aclose()``). Raises :class:`LockNotHeldError` if there is nothing to release.

        Example::

            await lock.acquire()
            ...
            if not await lock.release():
                print("we had lost the lock; our writes were fenced off")
        """
        held = self._mine(asyncio.current_task())
        if held is None:
            raise LockNotHeldError(f"{self._name}: the calling task holds no lock to release")
        return await self._release_task_hold(held)

    async def _release_task_hold(self, th: _TaskHold) -> bool:
        if th.count > 1:
            th.count -= 1
            return th.is_valid
        if self._holds.get(th.task) is th:
            del self._holds[th.task]
        return await self._release_held(th.held, view_done=True)

    async def _release_held(self, held: _Held, *, view_done: bool = False) -> bool:
        if view_done:
            held.refs -= 1
            if not any(th.held is held for th in self._holds.values()) and self in held.views:
                held.views.remove(self)
        if held.refs > 0:
            return not (held.hold.is_lost or held.hold.is_released)
        return await held.release()

    # ---------------------------------------------------------------- scoped forms

    @contextlib.asynccontextmanager
    async def with_lock(self, timeout: float | None = None) -> AsyncIterator[LockHold]:
        """``async with lock.with_lock(timeout=5) as hold:`` -- acquire, run the body, release.

        Raises :class:`LockTimeoutError` (a ``TimeoutError``) if not acquired in time: the
        body **never** runs without the lock. If the hold is lost while the body runs, the
        body is cancelled and :class:`~etcd_recipes.errors.LockLostError` raised. The body
        gets the :class:`LockHold` (fencing token, compare, guarded transactions).

        Example::

            async with mutex.with_lock(timeout=5) as hold:
                await hold.guarded_txn([Op.put("/report/owner", "me")])
        """
        if not await self.acquire(timeout):
            raise LockTimeoutError(f"{self._name}: not acquired within {timeout}s")
        th = self._holds[_task()]
        lost = _lost_while_running(self._name, "lock", th.held, LockLostError)
        async with _scoped_body(
            th.held, th.guards, lost, lambda: self._release_task_hold(th)
        ) as hold:
            yield hold

    async def _enter(self) -> None:
        cm = self.with_lock()
        await cm.__aenter__()
        self._entered.setdefault(_task(), []).append(cm)

    async def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = _task()
        stack = self._entered.get(task)
        if not stack:
            raise LockNotHeldError(f"{self._name}: __aexit__ without a matching __aenter__")
        cm = stack.pop()
        if not stack:
            del self._entered[task]
        await cm.__aexit__(exc_type, exc, tb)

    # ---------------------------------------------------------------- state

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

            await client.txn([mutex.is_owner()], [Op.put("/leader-only", b"x")])
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

            result = await mutex.guarded_txn([Op.put("/balance", b"42")])
        """
        hold = self.hold
        if hold is None:
            raise LockNotHeldError(f"{self._name}: not held, so there is nothing to guard with")
        return await hold.guarded_txn(success, failure, extra=extra)

    def add_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Call ``listener(cause)`` once each time a hold of this lock is lost.

        Example::

            mutex.add_lock_lost_listener(lambda cause: log.error("lock lost: %s", cause))
        """
        self._lost_listeners.add(listener)

    def remove_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Stop calling ``listener``."""
        self._lost_listeners.remove(listener)

    # ---------------------------------------------------------------- loss and close

    def _lost(self, held: _Held, cause: BaseException | None) -> None:
        for th in list(self._holds.values()):
            if th.held is held:
                _fire(th.guards)
        err = LockLostError(f"{self._name}: the lock was lost ({cause})")
        err.__cause__ = cause
        self._recipe._record_exception(err, "lock-lost")
        self._recipe._on_recovery_event(LeaseExpired(held.lease.id, cause))
        self._lost_listeners.emit(cause)

    async def _close_view(self) -> None:
        for scope in list(self._aborts):
            scope.cancel()
        current = asyncio.current_task()
        for th in list(self._holds.values()):
            if th.task is not current:
                _fire(th.guards)
        for held in {id(th.held): th.held for th in self._holds.values()}.values():
            await held.release()  # the owners' later release() returns False


def _first_below(kvs: Sequence[KeyValue], revision: int) -> KeyValue | None:
    for kv in kvs:
        if 0 < kv.create_revision < revision:
            return kv
    return None


class _Queued(_LockBase):
    """Waiting by create revision for the nearest conflicting predecessor (mutex, RW views)."""

    _conflicts: str  # the prefix whose earlier keys conflict with ours
    _lost_error: type[LostError] = LockLostError

    @abstractmethod
    def _new_key(self, lease: _SessionLease) -> tuple[str, bytes]:
        """The key (and value) this waiter queues under."""

    async def _take(self) -> _Held:
        while True:
            lease = await self._session.join()
            key, value = self._new_key(lease)
            try:
                return await self._queue(lease, key, value)
            except _Requeue as exc:
                self._recipe._record_exception(exc, "requeue")
                log.info("%s: %s; queueing again", self._name, exc)
                await asyncio.sleep(exc.delay)

    async def _queue(self, lease: _SessionLease, key: str, value: bytes) -> _Held:
        client = self._recipe._client
        created = False

        async def cleanup() -> None:
            if created:
                await client.delete(key)
            await self._session.abandon(lease)

        async with abort_guard(cleanup, what=f"{self._name}: abandoning an acquisition"):
            newest = Op.get(
                self._conflicts,
                prefix=True,
                limit=2,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.DESCEND,
                keys_only=True,
            )
            created = True  # from here on the key may exist, whatever the outcome
            first = await _leased_txn(
                client,
                self._session,
                lease,
                [Cmp.create_revision(key) == 0],
                [Op.put(key, value, lease=lease.id), newest],
                [Op.get(key, keys_only=True)],
            )
            seen = first.revision
            if first.succeeded:
                mine = first.revision
                predecessor = _first_below(_range(first, 1).kvs, mine)
            else:  # our key already exists (a leftover of this lease): find its place
                mine = _range(first, 0).kvs[0].create_revision
                predecessor, seen = await self._below(key, mine)
            while predecessor is not None:
                await _wait_for_deletion(
                    client, lease, predecessor, seen, self._recipe._on_recovery_event
                )
                predecessor, seen = await self._below(key, mine)
            hold = Hold(client, key, lease, mine, self._lost_error, self._name)
            _monitor_soon(hold, seen)
            return _Held(hold, lease, self._session)

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


# --------------------------------------------------------------------------- mutex


class DistributedMutex(_Queued, Recipe):
    """A distributed mutex, compatible with ``etcdctl lock``, Go's ``concurrency.Mutex`` and
    the JVM library on the same path.

    ``async with mutex:`` acquires the lock for the body (this is the lock's context, not the
    recipe's lifecycle: close the instance with ``aclose()``). Holds are per asyncio task and
    reentrant; the instance keeps one acquisition lease across holds.

    Example::

        mutex = DistributedMutex(client, "/locks/orders")
        async with mutex:
            ...  # cancelled, with LockLostError raised, if the lock is lost meanwhile
        async with mutex.with_lock(timeout=5) as hold:
            await hold.guarded_txn([Op.put("/orders/next", b"42")])
        await mutex.aclose()

    :param lease_ttl: seconds; how long the lock outlives this process if it dies holding it.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
    ) -> None:
        Recipe.__init__(self, client, path, client_id=client_id)
        self.lease_ttl = validate_ttl(lease_ttl)
        """The acquisition lease's TTL in whole seconds."""
        self._conflicts = path + "/"
        session = _Session(client, self.lease_ttl, self._on_lease_event)
        _LockBase.__init__(self, self, session, self.exception_context, serial=True)

    def _new_key(self, lease: _SessionLease) -> tuple[str, bytes]:
        return f"{self._conflicts}{lease.id:x}", b""

    async def __aenter__(self: _M) -> _M:
        """Acquire the lock for the body (waits as long as it takes; see :meth:`with_lock`)."""
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._exit(exc_type, exc, tb)

    async def is_locked(self) -> bool:
        """Whether anyone holds (or waits for) the lock: one count-only read, advisory."""
        self._check_open()
        return (await self._client.count(self._conflicts)) > 0

    def _on_lease_event(self, event: LeaseEvent) -> None:
        if isinstance(event, LeaseSuspended):
            self._on_recovery_event(event)
            self._record_exception(LeaseEventError(event), "lease")

    async def _do_close(self) -> None:
        await self._close_view()
        await self._session.close()


# --------------------------------------------------------------------------- read-write lock


class ReadWriteLockView(_Queued):
    """The read or the write side of a :class:`DistributedReadWriteLock`, with the lock
    surface of :class:`DistributedMutex` (``acquire``/``release``, ``async with``,
    ``with_lock``, fencing, lock-lost listeners of its own).

    Example::

        async with rw.read_lock:
            ...  # shared with other readers
        async with rw.write_lock.with_lock(timeout=5) as hold:
            ...  # exclusive
    """

    def __init__(self, lock: DistributedReadWriteLock, mode: str) -> None:
        if mode not in ("read", "write"):
            raise InvalidArgumentError(f"mode must be 'read' or 'write', not {mode!r}")
        _LockBase.__init__(self, lock, lock._session, f"{lock.exception_context}.{mode}_lock")
        self._rw = lock
        self._mode = mode
        base = append_to_path(lock.path, "")
        self._own_prefix = f"{base}{mode}-"
        self._conflicts = base if mode == "write" else f"{base}write-"

    @property
    def mode(self) -> str:
        """``"read"`` or ``"write"``."""
        return self._mode

    def _new_key(self, lease: _SessionLease) -> tuple[str, bytes]:
        token = f"{self._rw.client_id}:{random_token()}"
        return f"{self._own_prefix}{token}", self._rw.client_id.encode()

    def _reuse(self, task: asyncio.Task[Any]) -> _Held | None:
        if self._mode == "write":
            if task in self._rw.read_lock._holds:
                raise LockUpgradeError(
                    f"{self._name}: the task holds the read lock; upgrading is not allowed"
                )
            return None
        write = self._rw.write_lock._holds.get(task)
        if write is not None and write.is_valid:
            return write.held  # downgrade: the read shares the write's key
        return None

    async def __aenter__(self) -> ReadWriteLockView:
        """Acquire this side for the body (waits as long as it takes; see :meth:`with_lock`)."""
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._exit(exc_type, exc, tb)

    async def is_locked(self) -> bool:
        """Whether anyone holds (or waits for) this side: one count-only read, advisory."""
        self._rw._check_open()
        return (await self._rw._client.count(self._own_prefix)) > 0


class DistributedReadWriteLock(Recipe):
    """A distributed read-write lock: many readers or one writer, FIFO by arrival.

    ``read_lock`` and ``write_lock`` are views with the mutex surface. A queued writer blocks
    readers that arrive after it (no writer starvation). A task holding the write lock may
    take the read lock (downgrade): the read then shares the write's key, which stays until
    both are released -- so other readers get in only after that, and no writer can slip in
    between. A task holding the read lock that asks for the write lock gets
    :class:`LockUpgradeError`.

    Example::

        rw = DistributedReadWriteLock(client, "/locks/catalog")
        async with rw.write_lock:
            await rebuild_catalog()
            async with rw.read_lock:      # downgrade
                ...
        await rw.aclose()

    :param lease_ttl: seconds; how long a hold outlives this process if it dies holding it.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
    ) -> None:
        super().__init__(client, path, client_id=client_id)
        self.lease_ttl = validate_ttl(lease_ttl)
        """The acquisition lease's TTL in whole seconds."""
        self._session = _Session(client, self.lease_ttl, self._on_lease_event)
        self.read_lock: ReadWriteLockView = ReadWriteLockView(self, "read")
        """The shared side."""
        self.write_lock: ReadWriteLockView = ReadWriteLockView(self, "write")
        """The exclusive side."""

    def _on_lease_event(self, event: LeaseEvent) -> None:
        if isinstance(event, LeaseSuspended):
            self._on_recovery_event(event)
            self._record_exception(LeaseEventError(event), "lease")

    async def _do_close(self) -> None:
        await self.read_lock._close_view()
        await self.write_lock._close_view()
        await self._session.close()


# --------------------------------------------------------------------------- v3lock service


async def server_lock(
    client: EtcdClient, name: str | bytes, lease_id: int, *, timeout: float | None = None
) -> bytes:
    """Acquire ``name`` through etcd's own lock service (the v3lock ``Lock`` RPC).

    The server queues ``<name>/<lease id in hex>`` and answers once it owns the lock; the key
    returned lives while the lease does. Keep ``lease_id`` alive yourself (for example with
    ``client.lease(ttl)``) and give the key to :func:`server_unlock`. On timeout (or
    cancellation) the waiter key is removed and :class:`LockTimeoutError` raised.

    Prefer :class:`DistributedMutex` (same key layout): the server-side wait hands a contended
    lock over at most about every 100 ms, and loss is not reported.

    Example::

        async with client.lease(10) as lease:
            key = await server_lock(client, "/locks/job", lease.id, timeout=5)
            try:
                ...
            finally:
                await server_unlock(client, key)
    """
    return await client.lock(name, lease_id, timeout=timeout)


async def server_unlock(client: EtcdClient, key: str | bytes) -> None:
    """Release a lock taken with :func:`server_lock` (the v3lock ``Unlock`` RPC: it deletes
    ``key``). Idempotent.

    Example::

        await server_unlock(client, key)
    """
    await client.unlock(key)
