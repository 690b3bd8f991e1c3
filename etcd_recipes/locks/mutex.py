""":class:`DistributedMutex`: a distributed mutex in etcd's own lock layout
(``<path>/<lease id in hex>``), so it excludes ``etcdctl lock``, Go's ``concurrency.Mutex`` and
the Kotlin library on the same path. What it guarantees and what it does not: see
:mod:`etcd_recipes.locks`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from typing_extensions import Self

from .._core.caller import Caller
from .._core.listeners import ListenerSet
from .._core.validate import check_ttl
from .._recipe.recipe import Recipe
from ..errors import LeaseEventError
from ..events import LeaseEvent, LeaseResumed, LeaseSuspended
from ._base import _LockBase, _Queued
from ._holds import _Held
from ._line import _local_line
from ._revoke import REVOKE_VALUE, _watch_for_revocation
from ._session import _Session
from ._waiters import _participants
from .hold import DEFAULT_TTL, LockParticipant

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedMutex", "RevocationListener"]

RevocationListener = Callable[[LockParticipant], Any]
"""Called with the holder (its key, lease and fencing token) once a revocation is requested."""


class DistributedMutex(_Queued, Recipe):
    """A distributed mutex, compatible with ``etcdctl lock``, Go's ``concurrency.Mutex`` and
    the Kotlin library on the same path.

    ``async with mutex:`` acquires the lock for the body (this is the lock's context, not the
    recipe's lifecycle: close the instance with ``aclose()``). Its leases come from the
    client's pool, so an instance per request is cheap (no lease of its own).
    Holds are per asyncio task and reentrant. The mutexes of one client on one path take
    turns locally, first come first served, behind one waiter key in etcd (the local line,
    see :mod:`etcd_recipes.locks`).

    Example::

        from etcd_recipes import DistributedMutex, Op

        mutex = DistributedMutex(client, f"{prefix}/orders-lock")
        async with mutex:
            print("held:", mutex.is_held)  # cancelled, with LockLostError, if the lock is lost
        async with mutex.with_lock(timeout=5) as hold:
            await hold.guarded_txn([Op.put(f"{prefix}/orders/next", b"42")])
        await mutex.aclose()

    :param lease_ttl: seconds; how long the lock outlives this process if it dies holding it.
    :param metrics_name: the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        Recipe.__init__(self, client, path, client_id=client_id, metrics_name=metrics_name)
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """The acquisition lease's TTL in whole seconds."""
        self._conflicts = path + "/"
        session = _Session(client, self.lease_ttl, self.path, self._on_lease_event)
        line = _local_line(client, self.path)
        _LockBase.__init__(self, self, session, self.exception_context, line=line)
        self._revocation_listeners = ListenerSet("revocation", self._record_listener_error)
        self._revoked: weakref.WeakSet[_Held] = weakref.WeakSet()

    def _new_key(self, lease_id: int) -> tuple[str, bytes]:
        return f"{self._conflicts}{lease_id:x}", b""

    async def __aenter__(self) -> Self:
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

    async def contenders(self) -> list[LockParticipant]:
        """Everyone holding or waiting for the lock in etcd, in line order (one read,
        advisory): the first one holds it (``is_holder``). Other clients' keys count too
        (``etcdctl lock``, Go, the Kotlin library). A client has one key here at a time: its
        other waiters wait in its local line (see :mod:`etcd_recipes.locks`).

        Example::

            from etcd_recipes import DistributedMutex

            mutex = DistributedMutex(client, f"{prefix}/report-lock")
            async with mutex:
                (first,) = await mutex.contenders()
                print(first.key == mutex.hold.key, first.is_holder)  # True True
            print(await mutex.contenders())  # []
            await mutex.aclose()
        """
        self._check_open()
        return await _participants(self._client, self._conflicts, lambda rank, kv: rank == 0)

    async def holders(self) -> list[LockParticipant]:
        """The holder, as a one-item list (empty when the lock is free); one read, advisory.

        Example::

            from etcd_recipes import DistributedMutex

            mutex = DistributedMutex(client, f"{prefix}/report-lock")
            print(await mutex.holders())  # []
            await mutex.aclose()
        """
        return [p for p in await self.contenders() if p.is_holder]

    def __repr__(self) -> str:
        return f"<{self.exception_context} {self._describe()} {self.connection_state.value}>"

    # ---------------------------------------------------------------- cooperative revocation

    def add_revocation_listener(self, listener: RevocationListener) -> None:
        """Make this mutex's later holds revocable (Curator's ``makeRevocable``): when
        :func:`~etcd_recipes.locks.revocation.request_revoke` (or ``etcd-recipes lock
        revoke``) asks the holder to give the lock back, ``listener(holder)`` is called once
        for that hold, from a background task (the listener thread in the blocking facade).
        Nothing is released: the holder decides when -- ``release()`` from the task that
        holds it, or the end of its ``async with`` block. Register it **before** acquiring:
        each hold acquired while a listener is registered watches its key for requests.

        Example::

            import asyncio

            from etcd_recipes import DistributedMutex

            mutex = DistributedMutex(client, f"{prefix}/lock")
            asked = asyncio.Event()
            mutex.add_revocation_listener(lambda holder: asked.set())
            await mutex.aclose()
        """
        self._revocation_listeners.add(listener)

    def remove_revocation_listener(self, listener: RevocationListener) -> None:
        """Stop calling ``listener`` (holds acquired from now on are not watched for requests
        once no listener is left)."""
        self._revocation_listeners.remove(listener)

    @property
    def revocation_requested(self) -> bool:
        """Whether a revocation was requested of the calling task's hold (see
        :meth:`add_revocation_listener`); False when it holds none or was not asked."""
        th = self._any()
        return th is not None and th.held in self._revoked

    def _adopt(self, task: Caller, held: _Held) -> None:
        fresh = held.refs == 0
        super()._adopt(task, held)
        if fresh and len(self._revocation_listeners):

            def asked() -> None:
                self._revoked.add(held)
                hold = held.hold
                holder = LockParticipant(
                    held.public.key, hold.lease.id, hold.fencing_token, True, REVOKE_VALUE
                )
                self._revocation_listeners.emit(holder)

            watch = _watch_for_revocation(self._client, held, asked, self._on_recovery_event)
            self._spawn(watch, "revocation")

    def _on_lease_event(self, event: LeaseEvent) -> None:
        if isinstance(event, LeaseSuspended):
            self._on_recovery_event(event)
            self._record_exception(LeaseEventError(event), "lease")
        elif isinstance(event, LeaseResumed):
            self._on_recovery_event(event)  # keep-alives answered again: out of SUSPENDED

    async def _do_close(self) -> None:
        await self._close_view()
        await self._session.close()
