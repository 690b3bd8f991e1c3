"""A received work-queue item: :class:`WorkItem` (public as ``etcd_recipes.WorkItem``; made by
``receive()``, never directly).

Guaranteed: an item settles once -- :meth:`WorkItem.ack`, :meth:`WorkItem.requeue` or
:meth:`WorkItem.dead_letter` runs its transaction only while the claim marker is still this
consumer's (value and create revision) and returns ``False`` otherwise, or when the item was
already settled; a settle rides out a server restart or connection loss of up to the queue's
``visibility_timeout`` (the outcome of an attempt the outage hid is found out, not guessed).
Not guaranteed: that the work was done only once (delivery is at least once; key side effects
on :attr:`WorkItem.id`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, runtime_checkable

from .._core.validate import check_delay, check_reason
from ..codecs import ValueT
from ..metrics import MetricsSpan

if TYPE_CHECKING:
    from ._claims import Claimed

__all__ = ["ItemState", "TracePropagation", "WorkItem"]

ItemState = Literal["ready", "delayed", "in_flight", "dead"]
"""Where a work item is (``DistributedWorkQueue.status(id)``): waiting (``ready``), out of sight
until its time (``delayed``), claimed by a consumer (``in_flight``, an orphan of a dead consumer
included) or dead-lettered (``dead``)."""


@runtime_checkable
class TracePropagation(Protocol):
    """How a work queue carries trace context from producer to consumer (off by default).

    The library treats the context as opaque bytes and imports no tracing package; an
    implementation such as :class:`etcd_recipes.contrib.otel.TraceContextPropagation` (W3C
    ``traceparent``/``tracestate``) turns spans into bytes and back. Both methods may raise or
    return junk: the queue logs it once and carries on without a context.

    Example::

        from etcd_recipes import DistributedWorkQueue

        class Tagged:                       # a toy propagation: the producer's host name
            def inject(self, span):
                return b"host-a"
            def link(self, span, context):
                print("produced on", context.decode())

        tagged = Tagged()
        async with DistributedWorkQueue(client, f"{prefix}/jobs", trace_propagation=tagged) as q:
            await q.enqueue(b"job")                 # stores b"host-a" beside the item
            item = await q.receive()
            assert item.trace_context == b"host-a"  # link() needs a sink that makes spans
            await item.ack()
    """

    def inject(self, span: MetricsSpan | None) -> bytes | None:
        """The context to store with an item being enqueued: that of ``span`` (the sink's
        ``queue.enqueue`` span; ``None`` when the sink makes no spans: use the current one), or
        ``None`` to store nothing."""

    def link(self, span: MetricsSpan, context: bytes) -> None:
        """Relate the consumer's ``span`` (``queue.receive`` or ``queue.settle``) to the
        producer's stored ``context`` (bytes from another process: validate them)."""


class Settle(Protocol):
    """How a claim is settled: the work queue's ``ack``/``requeue``/``dead`` transaction for
    ``item`` (``how``), True if it was still this consumer's."""

    def __call__(
        self, item: Any, how: str, *, delay: float = ..., reason: str | None = ...
    ) -> Awaitable[bool]: ...


class _Claim:
    """What a :class:`WorkItem` needs to settle its claim."""

    __slots__ = ("context", "data", "lease_id", "revision", "settle", "settled")

    def __init__(
        self,
        settle: Settle,
        claimed: Claimed,
        lease_id: int,
    ) -> None:
        self.settle = settle  # the queue's settle call: the item never names its queue
        self.data = claimed.head.value
        self.revision = claimed.revision  # the claim transaction's = the marker's create rev
        self.lease_id = lease_id  # the lease the marker lives on
        self.settled = False
        self.context = claimed.context  # the producer's trace context (tracing on), or None


class WorkItem(Generic[ValueT]):
    """A received item, claimed by this consumer until :meth:`ack`, :meth:`requeue` or
    :meth:`dead_letter`.

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

    def __init__(self, id: str, value: ValueT, attempt: int, *, claim: _Claim) -> None:
        self.id: str = id
        """The item's name (``<millis%019d>-<r3>``), stable across redeliveries."""
        self.value: ValueT = value
        """The decoded payload."""
        self.attempt: int = attempt
        """Which delivery this is (1 for the first)."""
        self._claim = claim

    @property
    def trace_context(self) -> bytes | None:
        """The trace context the producer stored with the item, as its queue's
        ``trace_propagation`` wrote it (W3C headers as JSON for
        :class:`etcd_recipes.contrib.otel.TraceContextPropagation`); ``None`` when the producer
        or this consumer has propagation off. Untrusted bytes from another process.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")
                item = await queue.receive()
                assert item.trace_context is None    # propagation is off by default
                await item.ack()
        """
        return self._claim.context

    @property
    def is_settled(self) -> bool:
        """Whether :meth:`ack`, :meth:`requeue` or :meth:`dead_letter` already ran
        (successfully or not)."""
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
        return await self._claim.settle(self, "ack")

    async def requeue(self, delay: float | None = None) -> bool:
        """Hand the item back, keeping its id and attempt count: at once to its original place,
        or -- ``delay`` seconds > 0 -- out of sight until then (a retry backoff), back at its
        original place when it matures. ``False`` if the claim was lost or the item was already
        settled. It never dead-letters (see :meth:`dead_letter`).

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")
                item = await queue.receive()
                await item.requeue()   # a transient failure: let any consumer retry now
                again = await queue.receive()
                assert (again.id, again.attempt) == (item.id, 2)
                await again.requeue(delay=60)       # or: retry in a minute
                assert await queue.try_receive() is None
        """
        wait = check_delay(delay)
        return await self._claim.settle(self, "requeue", delay=wait)

    async def dead_letter(self, reason: str) -> bool:
        """Give up on the item: move it to the dead letters at once, with ``reason`` stored
        beside it (shown by ``dead_letters()``) and its attempt count kept. ``False`` if the
        claim was lost or the item was already settled.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"not-an-image")
                item = await queue.receive()
                assert await item.dead_letter("unsupported format") is True
                (dead,) = await queue.dead_letters()
                assert (dead.id, dead.reason, dead.attempts) == (item.id, "unsupported format", 1)
        """
        text = check_reason(reason)
        return await self._claim.settle(self, "dead", reason=text)

    def __repr__(self) -> str:
        state = "settled" if self._claim.settled else "claimed"
        return f"<WorkItem {self.id} attempt={self.attempt} {state}>"
