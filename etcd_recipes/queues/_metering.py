"""How the queues report to the metrics hook (not public): one ``queue_operation`` event and
at most one span per call, through the recipe's meter (``Recipe._meter``).

Guaranteed, for every metered call (``enqueue``, ``enqueue_all``, ``dequeue``/``try_dequeue``/
``poll``, ``receive``/``try_receive``, ``ack``, ``requeue``, ``dead_letter``):

* exactly **one** :meth:`~etcd_recipes.EtcdMetrics.queue_operation` event, timed from the call
  to its end (waits on an empty queue included), with one outcome: ``ok``; ``empty`` (a try,
  or a wait of ``0``, found nothing); ``timeout`` (a wait with a time limit found nothing);
  ``cancelled`` (the caller was cancelled, or the queue closed under a waiting call);
  ``stale`` (a settle that returned ``False``: the claim was gone or already settled);
  ``error`` (anything raised);
* a span (``queue.enqueue``, ``queue.receive``, ``queue.settle``) with the OpenTelemetry
  messaging attributes ``messaging.system = "etcd"``, ``messaging.operation.type``
  (``send``/``receive``/``settle``), ``messaging.operation.name`` (the operation) and
  ``messaging.destination.name`` (the queue path: a span attribute, **never** a label),
  ended with the same outcome and the exception, if any;
* the work queue's consumer-lease loss is one ``lease_lost`` event; items a sweep returns
  after their claim expired are one ``queue_redelivered(count)`` per sweep, and orphans it
  dead-letters (their last allowed delivery) one ``dead_letter`` operation each.

Not guaranteed: a call refused before it starts (bad input, a closed queue) reports nothing;
events are delivered by the dispatcher's thread (``_core/metering.py``), so a stuck sink may
drop them; spans are switched off for a sink whose tracer is slow.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import TypeVar

from .._core.metering import RecipeMeter, SpanHandle
from .._core.outcomes import lease_lost_kind
from ..errors import RecipeClosedError
from ..events import LeaseEvent

__all__ = ["Metered", "batch_size", "outcome_of", "report_lease_loss"]

T = TypeVar("T")

_SPANS = {
    "enqueue": ("queue.enqueue", "send"),
    "dequeue": ("queue.receive", "receive"),
    "receive": ("queue.receive", "receive"),
    "ack": ("queue.settle", "settle"),
    "requeue": ("queue.settle", "settle"),
    "dead_letter": ("queue.settle", "settle"),
}


def outcome_of(exc: BaseException) -> str:
    """The outcome of a call that raised ``exc``: ``cancelled`` or ``error``."""
    if isinstance(exc, (asyncio.CancelledError, RecipeClosedError)):
        return "cancelled"
    return "error"


def batch_size(count: int) -> dict[str, object]:
    """The span attribute of a batch enqueue (OpenTelemetry's batch message count)."""
    return {"messaging.batch.message_count": count}


def report_lease_loss(meter: RecipeMeter, event: LeaseEvent) -> None:
    """One ``lease_lost`` event if ``event`` is the loss of the lease (see
    :func:`lease_lost_kind`)."""
    kind = lease_lost_kind(event)
    if kind is not None:
        meter.lease_lost(kind)


class Metered:
    """One metered queue call: ``with Metered(meter, "ack", path) as op:``; set
    :attr:`outcome` (or use :meth:`taken` / :meth:`settled`) before leaving the block.

    For instance ``with Metered(queue._meter, "dequeue", queue.path) as op:`` then
    ``value = op.taken(await take(), waited=True)`` (``None`` reports ``"timeout"``).
    """

    __slots__ = ("_meter", "_operation", "_span", "_started", "outcome")

    def __init__(self, meter: RecipeMeter, operation: str, path: str, **attributes: object) -> None:
        span, kind = _SPANS[operation]
        self._meter = meter
        self._operation = operation
        self.outcome = "ok"
        """The outcome reported if the block ends without an exception."""
        self._span: SpanHandle = meter.span(
            span,
            path,
            **{
                "messaging.system": "etcd",
                "messaging.operation.type": kind,
                "messaging.operation.name": operation,
                "messaging.destination.name": path,
            },
            **attributes,
        )
        self._started = time.monotonic()

    def __enter__(self) -> Metered:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome = self.outcome if exc is None else outcome_of(exc)
        self._meter.queue_op(self._operation, time.monotonic() - self._started, outcome)
        self._span.end(outcome, exc)

    def taken(self, result: T | None, *, waited: bool) -> T | None:
        """``result`` of a take or receive; ``None`` (nothing came) is ``timeout`` after a
        wait with a time limit, ``empty`` after a try."""
        if result is None:
            self.outcome = "timeout" if waited else "empty"
        return result

    def settled(self, result: bool) -> bool:
        """``result`` of a settle; ``False`` is ``stale``."""
        if not result:
            self.outcome = "stale"
        return result
