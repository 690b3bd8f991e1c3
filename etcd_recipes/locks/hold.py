""":class:`LockHold`: one acquired lock or permit as the user sees it (its key, fencing token,
compare and guarded transactions), and the locks family's public defaults. Holds are made by
the lock recipes, never by users.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.keys import key_bytes
from .._core.txn import AnyOp, Compare
from .._recipe.hold import Hold
from ..types import TxnResult

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_TTL", "LockHold", "LockLostListener", "LockParticipant"]

DEFAULT_TTL = 2
"""Seconds: the lock recipes' acquisition lease TTL (the Kotlin library's ``DEFAULT_TTL_SECS``)."""

LockLostListener = Callable[[BaseException | None], Any]
"""Called with the cause (or ``None``) once per lost hold (or permit)."""


@dataclass(frozen=True)
class LockParticipant:
    """One key queued on a lock, semaphore or read-write lock, as ``contenders()`` and
    ``holders()`` list them (oldest first): its ``key``, ``lease_id``, ``create_revision``
    (its place in line, and its fencing token once it holds), ``value`` (the owner's client id
    for the read-write lock and the semaphore; empty for the mutex) and whether it holds the
    lock now (``is_holder``) -- as of one read, so advisory.

    Example::

        from etcd_recipes import DistributedMutex

        mutex = DistributedMutex(client, f"{prefix}/jobs-lock")
        async with mutex:
            (me,) = await mutex.holders()
            print(me.is_holder, me.lease_id == mutex.hold.lease_id)  # True True
        await mutex.aclose()
    """

    key: bytes
    lease_id: int
    create_revision: int
    is_holder: bool
    value: bytes = b""


class LockHold:
    """One acquired lock or permit, with its **fencing token**.

    ``fencing_token`` is the create revision of the hold's key: strictly larger for every later
    hold on the same path. :meth:`compare` is true only while this hold's key exists, so a
    transaction that includes it commits only while the hold is current -- even when this
    process was paused past its lease and does not know yet that the lock moved on.

    Example::

        from etcd_recipes import DistributedMutex, Op

        mutex = DistributedMutex(client, f"{prefix}/accounts-lock")
        async with mutex.with_lock() as hold:
            result = await hold.guarded_txn([Op.put(f"{prefix}/accounts/42", b"100")])
            if not result.succeeded:
                print("the lock was lost: someone else may own the account now")
            print(hold.fencing_token > 0)  # True
        await mutex.aclose()
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

            from etcd_recipes import DistributedMutex, Op

            mutex = DistributedMutex(client, f"{prefix}/lock")
            async with mutex.with_lock() as hold:
                await client.txn([hold.compare()], [Op.put(f"{prefix}/config", b"v2")])
            await mutex.aclose()
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

            from etcd_recipes import DistributedMutex, Op

            mutex = DistributedMutex(client, f"{prefix}/lock")
            async with mutex.with_lock() as hold:
                result = await hold.guarded_txn([Op.put(f"{prefix}/jobs/7/state", b"done")])
                print(result.succeeded)  # True while the hold is current
            await mutex.aclose()
        """
        return await self._hold.guarded_txn(success, failure, extra=extra)

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else "released" if self.is_released else "held"
        return f"<LockHold {self.key!r} token={self.fencing_token} {state}>"
