"""How the queues report to the metrics hook (not public): one ``queue_operation`` event and
at most one span per call, through the recipe's meter (``Recipe._meter``).

Guaranteed, for every metered call (``enqueue``, ``enqueue_all``, ``dequeue``/``try_dequeue``/
``poll``, ``receive``/``try_receive``, ``ack``, ``requeue``, ``dead_letter``):

* exactly **one** :meth:`~etcd_recipes.EtcdMetrics.queue_operation` event, timed from the call
  to its end (waits on an empty queue included), with one outcome: ``ok``; ``empty`` (a try,
  or a wait of ``0``, found nothing); ``timeout`` (a wait with a time limit found nothing);
  ``cancelled`` (the caller was cancelled, or the queue closed under a waiting call);
  ``stale`` (a settle that returned ``False``: the claim was gone or already settled);
  ``full`` (a bounded work queue's ``try_enqueue`` found no room);
  ``error`` (anything raised);
* a span (``queue.enqueue``, ``queue.receive``, ``queue.settle``) with the OpenTelemetry
  messaging attributes ``messaging.system = "etcd"``, ``messaging.operation.type``
  (``send``/``receive``/``settle``), ``messaging.operation.name`` (the operation) and
  ``messaging.destination.name`` (the queue path: a span attribute, **never** a label),
  ended with the same outcome and the exception, if any;
* the work queue's consumer-lease loss is one ``lease_lost`` event; items a sweep returns
  after their claim expired are one ``queue_redelivered(count)`` per sweep, and orphans it
  dead-letters (their last allowed delivery) one ``dead_letter`` operation each.

Trace propagation (opt-in, ``trace_propagation=`` on a work queue, a
:class:`~etcd_recipes.queues.item.TracePropagation`): an enqueue stores what its ``inject``
returns for its span beside each item, and a consumer that also has one passes the stored
bytes to its ``link`` with the ``queue.receive`` and ``queue.settle`` spans. A propagation
that raises or returns something unusable is logged once and ignored: the item is enqueued
or received all the same.

Not guaranteed: a call refused before it starts (bad input, a closed queue) reports nothing;
events are delivered by the dispatcher's thread (``_core/metering.py``), so a stuck sink may
drop them; spans are switched off for a sink whose tracer is slow.
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import TypeVar

from .._core.logctx import library_logger
from .._core.metering import RecipeMeter, SpanHandle
from .._recipe.outcomes import lease_lost_kind
from ..errors import InvalidArgumentError, RecipeClosedError
from ..events import LeaseEvent
from .item import TracePropagation

__all__ = [
    "MAX_CONTEXT_BYTES",
    "Metered",
    "batch_size",
    "check_propagation",
    "outcome_of",
    "report_lease_loss",
]

log = library_logger("etcd_recipes.work_queue")

MAX_CONTEXT_BYTES = 4096
"""A trace context a propagation's ``inject`` returns is stored only up to this size."""

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


def check_propagation(propagation: object) -> TracePropagation | None:
    """``propagation`` as a queue takes it: ``None`` or an object with ``inject``/``link``."""
    if propagation is None or isinstance(propagation, TracePropagation):
        return propagation
    raise InvalidArgumentError(
        f"trace_propagation must have inject(span) and link(span, context): {propagation!r}"
    )


_warned: set[tuple[int, str]] = set()


def _failed(propagation: TracePropagation, where: str, exc: Exception) -> None:
    if (id(type(propagation)), where) not in _warned:
        _warned.add((id(type(propagation)), where))
        log.warning(
            "trace propagation %s.%s raised %s: %s (ignored: the item carries on without it)",
            type(propagation).__name__,
            where,
            type(exc).__name__,
            exc,
        )


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

    def inject(self, propagation: TracePropagation | None) -> bytes | None:
        """The trace context to store with the items enqueued in this call (``None``: none)."""
        if propagation is None:
            return None
        try:
            context = propagation.inject(self._span.span)
        except Exception as exc:
            _failed(propagation, "inject", exc)
            return None
        if context is not None and not isinstance(context, bytes):
            _failed(propagation, "inject", TypeError(f"returned {type(context).__name__}"))
            return None
        if context is not None and len(context) > MAX_CONTEXT_BYTES:
            _failed(propagation, "inject", ValueError(f"{len(context)} bytes: too large"))
            return None
        return context or None

    def link(self, propagation: TracePropagation | None, context: bytes | None) -> None:
        """Relate this call's span to a producer's stored ``context`` (if both exist)."""
        span = self._span.span
        if propagation is None or context is None or span is None:
            return
        try:
            propagation.link(span, context)
        except Exception as exc:
            _failed(propagation, "link", exc)

    def settled(self, result: bool) -> bool:
        """``result`` of a settle; ``False`` is ``stale``."""
        if not result:
            self.outcome = "stale"
        return result
