"""A received work-queue item: :class:`WorkItem` (public as ``etcd_recipes.WorkItem``; made by
``receive()``, never directly).

Guaranteed: an item settles once -- :meth:`WorkItem.ack` or :meth:`WorkItem.requeue` runs its
transaction only while the claim marker is still this consumer's (value and create revision)
and returns ``False`` otherwise, or when the item was already settled. Not guaranteed: that
the work was done only once (delivery is at least once; key side effects on
:attr:`WorkItem.id`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .work import DistributedWorkQueue

__all__ = ["WorkItem"]


class _Claim:
    """What a :class:`WorkItem` needs to settle its claim."""

    __slots__ = ("data", "queue", "revision", "settled")

    def __init__(self, queue: DistributedWorkQueue[Any], data: bytes, revision: int) -> None:
        self.queue = queue
        self.data = data
        self.revision = revision  # the claim transaction's revision = the marker's create rev
        self.settled = False


class WorkItem:
    """A received item, claimed by this consumer until :meth:`ack` or :meth:`requeue`.

    ``value`` is the decoded payload (``bytes`` without a codec), ``attempt`` the delivery
    number (1 the first time; a redelivery after a crash has ``attempt + 1``).

    Example::

        from etcd_recipes import DistributedWorkQueue

        async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
            await queue.enqueue(b"job")
            item = await queue.receive()
            try:
                print(item.value.decode())   # handle it: idempotently (at least once)
            except Exception:
                await item.requeue()         # back at once, attempt count kept
            else:
                await item.ack()
            assert item.is_settled and item.attempt == 1
    """

    def __init__(self, id: str, value: Any, attempt: int, *, claim: _Claim) -> None:
        self.id: str = id
        """The item's name (``<millis%019d>-<r3>``), stable across redeliveries."""
        self.value: Any = value
        """The decoded payload."""
        self.attempt: int = attempt
        """Which delivery this is (1 for the first)."""
        self._claim = claim

    @property
    def is_settled(self) -> bool:
        """Whether :meth:`ack` or :meth:`requeue` already ran (successfully or not)."""
        return self._claim.settled

    async def ack(self) -> bool:
        """Complete the item: delete it for good. ``False`` if the claim was lost (the item may
        be delivered again, or was already) or the item was already settled.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")
                item = await queue.receive()
                if not await item.ack():
                    print("the claim was lost: the job may run twice")
                assert await item.ack() is False     # already settled
        """
        return await self._claim.queue._settle(self, requeue=False)

    async def requeue(self) -> bool:
        """Hand the item back at once, to its original place, keeping its attempt count.
        ``False`` if the claim was lost or the item was already settled.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")
                item = await queue.receive()
                await item.requeue()   # a transient failure: let any consumer retry now
                again = await queue.receive()
                assert (again.id, again.attempt) == (item.id, 2)
                await again.ack()
        """
        return await self._claim.queue._settle(self, requeue=True)

    def __repr__(self) -> str:
        state = "settled" if self._claim.settled else "claimed"
        return f"<WorkItem {self.id} attempt={self.attempt} {state}>"
