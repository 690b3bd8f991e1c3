""":class:`DistributedMultiLock`: all or nothing over several mutex paths (Curator's
``InterProcessMultiLock``), built on :class:`~etcd_recipes.DistributedMutex`.

Key layout: none of its own -- one mutex per path, in etcd's lock layout
(``<path>/<lease id in hex>``, see :mod:`etcd_recipes.locks`), so every path is also an
ordinary mutex for ``etcdctl lock``, Go and the Kotlin library.

Guarantees:

* **all or nothing**: ``acquire()`` returns True holding every path, or False / raises holding
  none -- a timeout, a cancellation or an error while taking path *k* releases paths 1..k-1
  (and the mutex deletes path *k*'s waiter key) before it returns;
* **no deadlock between multi-locks**: paths are taken in one deterministic order (sorted by
  their text, which is etcd's byte order), whatever order they were given in, so two
  multi-locks over overlapping paths never wait for each other in a cycle;
* one **fencing token per path** (:attr:`~DistributedMultiLock.fencing_tokens`) and the
  compares of all of them (:meth:`~DistributedMultiLock.compares`,
  :meth:`~DistributedMultiLock.guarded_txn`): a transaction that commits only while every
  path is still held;
* the loss of **any** path (its lease expired or revoked, its key deleted) is reported like a
  mutex's: the lock-lost listeners and :meth:`~DistributedMultiLock.lock_lost_events` hear
  it once, ``connection_state`` becomes ``LOST``, a scoped body is cancelled and raises
  :class:`~etcd_recipes.errors.LockLostError`; the other paths are released when it ends.

Not guaranteed: everything :mod:`etcd_recipes.locks` says a lease-based lock does not give
(fence your writes). The paths are taken one after another, so a multi-lock waiting for its
third path already holds the first two (others wait for them meanwhile). Holds belong to the
task that acquired (per thread in the blocking facade), reentrant like a mutex's; a task that
holds one of the paths through another mutex instance of the same client must not take the
multi-lock (it would wait for itself in the client's local line). Paths must not nest
(``/a`` and ``/a/b``): a mutex on ``/a`` would queue behind the keys of ``/a/b``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from typing_extensions import Self

from .._core.listeners import ListenerSet
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import AnyOp, Compare
from .._core.validate import check_path, check_timeout, check_ttl
from .._recipe.recipe import Recipe
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, LockNotHeldError
from ..events import ConnectionState
from ..types import TxnResult
from ._session import _Entered
from .hold import DEFAULT_TTL, LockHold, LockLostListener
from .mutex import DistributedMutex

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedMultiLock"]


def _check_paths(paths: Sequence[str]) -> tuple[str, ...]:
    if isinstance(paths, str) or not isinstance(paths, Sequence):
        raise InvalidArgumentTypeError("paths must be a sequence of lock paths, not one path")
    checked = sorted(check_path(p, what="each path") for p in paths)
    if not checked:
        raise InvalidArgumentError("paths must name at least one lock path")
    bare = [p.rstrip("/") for p in checked]
    for i, path in enumerate(bare):
        for other in bare[i + 1 :]:
            if other == path:
                raise InvalidArgumentError(f"the path {path!r} is given twice")
            if other.startswith(path + "/"):
                raise InvalidArgumentError(f"paths must not nest: {path!r} and {other!r}")
    return tuple(checked)


class DistributedMultiLock(Recipe):
    """Several mutexes taken together, all or nothing, in sorted path order.

    ``async with multi:`` acquires every path for the body (this is the lock's context, not
    the recipe's lifecycle: close the instance with ``aclose()``).

    Example::

        from etcd_recipes import DistributedMultiLock, Op

        accounts = [f"{prefix}/accounts/bob", f"{prefix}/accounts/alice"]
        multi = DistributedMultiLock(client, accounts)
        async with multi.with_lock(timeout=5):
            print(sorted(multi.fencing_tokens) == sorted(accounts))  # True: one per path
            await multi.guarded_txn([Op.put(f"{prefix}/transfer", b"done")])
        print(multi.is_held)  # False: every path was released
        await multi.aclose()

    :param paths: the mutex paths (at least one; no duplicates, none nested in another).
    :param lease_ttl: seconds; how long the locks outlive this process if it dies holding them.
    :param metrics_name: the ``name`` label of its (and its mutexes') metrics.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        paths: Sequence[str],
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        ordered = _check_paths(paths)
        super().__init__(client, ordered[0], client_id=client_id, metrics_name=metrics_name)
        self.paths: tuple[str, ...] = ordered
        """The lock paths, in the order they are taken (sorted)."""
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """The acquisition lease's TTL in whole seconds."""
        self._mutexes = [
            DistributedMutex(
                client, p, lease_ttl=lease_ttl, client_id=self.client_id, metrics_name=metrics_name
            )
            for p in ordered
        ]
        self._lost_listeners = ListenerSet("lock-lost", self._record_listener_error)
        self._lost_events: Broadcast[BaseException | None] = self._broadcast("lock-lost")
        self._entered = _Entered()  # what async with entered, per caller
        self._acquiring = 0
        for mutex in self._mutexes:
            mutex.add_lock_lost_listener(self._on_path_lost)
            mutex.add_connection_state_listener(self._on_path_state)

    # ---------------------------------------------------------------- acquire / release

    async def acquire(self, timeout: float | None = None) -> bool:
        """Acquire every path, in order; False if ``timeout`` seconds (for all of them
        together) pass first -- then none is held and nothing is left queued. ``timeout=0``
        tries each path once without waiting.

        Cancellation is safe: the paths taken so far are released, the waiter key of the one
        being waited for is deleted, then the cancellation propagates. Reentrant per task.

        Example::

            from etcd_recipes import DistributedMultiLock

            multi = DistributedMultiLock(client, [f"{prefix}/a", f"{prefix}/b"])
            if await multi.acquire(timeout=5):
                try:
                    print(multi.is_held)  # True
                finally:
                    await multi.release()
            await multi.aclose()
        """
        self._check_open()
        timeout = check_timeout(timeout, zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: list[DistributedMutex] = []
        self._acquiring += 1
        try:
            for mutex in self._mutexes:
                if not await mutex.acquire(_remaining(deadline)):
                    break
                taken.append(mutex)
            else:
                return True
        except BaseException:
            await self._undo(taken)
            raise
        finally:
            self._acquiring -= 1
        await self._undo(taken)
        return False

    async def _undo(self, taken: list[DistributedMutex]) -> None:
        """Release what an acquisition took, newest first, shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            for mutex in reversed(taken):
                try:
                    await mutex.release()
                except Exception as exc:  # recorded; the other paths are still released
                    self._record_exception(exc, "release")

    async def release(self) -> bool:
        """Release every path (one reentrant level), newest first.

        True if every path was held until now; False if any had been lost. Raises
        :class:`~etcd_recipes.errors.LockNotHeldError` if the calling task holds none.

        Example::

            from etcd_recipes import DistributedMultiLock

            multi = DistributedMultiLock(client, [f"{prefix}/a", f"{prefix}/b"])
            await multi.acquire()
            print(await multi.release())  # True: both were held until now
            await multi.aclose()
        """
        if self._mutexes[0].hold_count == 0:
            raise LockNotHeldError(f"{self.exception_context}: the calling task holds no lock")
        current = True
        with anyio.CancelScope(shield=True):
            for mutex in reversed(self._mutexes):
                try:
                    current = await mutex.release() and current
                except LockNotHeldError:
                    current = False  # released by aclose() or never taken: nothing to do
        return current

    # ---------------------------------------------------------------- scoped forms

    @contextlib.asynccontextmanager
    async def with_lock(self, timeout: float | None = None) -> AsyncIterator[Self]:
        """``async with multi.with_lock(timeout=5):`` -- acquire every path, run the body,
        release them all.

        Raises :class:`~etcd_recipes.errors.LockTimeoutError` if not all were acquired in
        time (none is then held): the body **never** runs without every lock. If any path is
        lost while the body runs, the body is cancelled and
        :class:`~etcd_recipes.errors.LockLostError` raised.

        Example::

            from etcd_recipes import DistributedMultiLock

            multi = DistributedMultiLock(client, [f"{prefix}/x", f"{prefix}/y"])
            async with multi.with_lock(timeout=5) as held:
                print(len(held.compares()))  # 2: one fencing compare per path
            await multi.aclose()
        """
        self._check_open()
        timeout = check_timeout(timeout, zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        stack = contextlib.AsyncExitStack()
        try:
            self._acquiring += 1
            try:
                for mutex in self._mutexes:
                    await stack.enter_async_context(mutex.with_lock(_remaining(deadline)))
            finally:
                self._acquiring -= 1
            yield self
        except BaseException as exc:
            # Every path's scope sees the exception (a lost path turns the cancellation of
            # the body into LockLostError), shielded so that all of them are released.
            with anyio.CancelScope(shield=True):
                if not await stack.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            return
        with anyio.CancelScope(shield=True):
            await stack.aclose()

    async def __aenter__(self) -> Self:
        """Acquire every path for the body (waits as long as it takes; see :meth:`with_lock`)."""
        await self._entered.enter(self.with_lock())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._entered.exit(self.exception_context, exc_type, exc, tb)

    # ---------------------------------------------------------------- state

    @property
    def is_held(self) -> bool:
        """Whether the calling task holds every path (none of them lost)."""
        return all(m.is_held for m in self._mutexes)

    @property
    def fencing_tokens(self) -> dict[str, int]:
        """The fencing token of each path the calling task holds (``{}`` when none)."""
        tokens: dict[str, int] = {}
        for path, mutex in zip(self.paths, self._mutexes):
            token = mutex.fencing_token
            if token is not None:
                tokens[path] = token
        return tokens

    def hold(self, path: str) -> LockHold | None:
        """The hold of one path (see :attr:`DistributedMutex.hold`), or ``None``."""
        for own, mutex in zip(self.paths, self._mutexes):
            if own == path:
                return mutex.hold
        raise InvalidArgumentError(f"{path!r} is not one of this multi-lock's paths")

    def compares(self) -> list[Compare]:
        """One fencing compare per path (see :meth:`LockHold.compare`): a transaction with all
        of them commits only while every path is held. Raises
        :class:`~etcd_recipes.errors.LockNotHeldError` unless every path is held."""
        found = []
        for mutex in self._mutexes:
            hold = mutex.hold
            if hold is None:
                raise LockNotHeldError(f"{self.exception_context}: not held, so no compares")
            found.append(hold.compare())
        return found

    async def guarded_txn(
        self,
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp] = (),
        *,
        extra: Sequence[Compare] = (),
    ) -> TxnResult:
        """Run ``success`` only while every path is held (and every ``extra`` compare holds);
        otherwise ``failure``. ``result.succeeded`` says which.

        Example::

            from etcd_recipes import DistributedMultiLock, Op

            multi = DistributedMultiLock(client, [f"{prefix}/a", f"{prefix}/b"])
            async with multi:
                result = await multi.guarded_txn([Op.put(f"{prefix}/both", b"x")])
                print(result.succeeded)  # True while both are ours
            await multi.aclose()
        """
        return await self._client.txn([*self.compares(), *extra], success, failure)

    def add_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Call ``listener(cause)`` once each time the hold of one of the paths is lost."""
        self._lost_listeners.add(listener)

    def remove_lock_lost_listener(self, listener: LockLostListener) -> None:
        """Stop calling ``listener``."""
        self._lost_listeners.remove(listener)

    def lock_lost_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[BaseException | None]:
        """The cause (or ``None``) of each later loss of a path's hold, as an async iterator
        that ends when the instance is closed (see :class:`~etcd_recipes.EventStream`)."""
        return self._lost_events.stream(maxsize)

    def _on_path_lost(self, cause: BaseException | None) -> None:
        self._lost_listeners.emit(cause)
        self._lost_events.publish(cause)

    def _on_path_state(self, new: ConnectionState, old: ConnectionState) -> None:
        self._set_state(new)  # the paths' mutexes fold their lease and watch events

    def __repr__(self) -> str:
        if self.is_closed:
            state = "closed"
        else:
            held = sum(1 for m in self._mutexes if m.is_held)
            state = f"{held} of {len(self._mutexes)} paths held"
            if self._acquiring:
                state += ", acquiring"
        return f"<{self.exception_context} {state} {self.connection_state.value}>"

    async def _do_close(self) -> None:
        for mutex in reversed(self._mutexes):
            await mutex.aclose()


def _remaining(deadline: float | None) -> float | None:
    """Seconds left before ``deadline`` (at least 0: the last path is then tried once)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
