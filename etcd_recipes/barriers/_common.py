"""What the barrier recipes share (private to the barriers family): how a lease event of a
key they set is reported, and how a wait is metered.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable

from .._recipe.outcomes import failure_outcome, lease_lost_kind
from .._recipe.recipe import Recipe
from ..errors import LeaseEventError
from ..events import LeaseEvent, LeaseRestored, LeaseResumed


def report_lease_event(recipe: Recipe, event: LeaseEvent) -> None:
    """Feed a self-healing lease's event into ``recipe``'s connection state, record every
    event but a recovery (restored, resumed) as a :class:`~etcd_recipes.errors.LeaseEventError`,
    and report a loss as ``lease_lost``."""
    recipe._on_recovery_event(event)
    kind = lease_lost_kind(event)
    if kind is not None:
        recipe._meter.lease_lost(kind)
    if not isinstance(event, (LeaseRestored, LeaseResumed)):
        recipe._record_exception(LeaseEventError(event), "lease")


async def metered_wait(recipe: Recipe, wait: Awaitable[bool], **attributes: object) -> bool:
    """Await ``wait`` (a barrier wait: True when released) as one ``barrier_wait_finished``
    event and one ``barrier.wait`` span of ``recipe``: ``passed``; ``timeout`` (it returned
    False); ``cancelled`` (cancelled, or it returned False because the recipe was closed);
    ``error`` (it raised anything else)."""
    meter = recipe._meter
    started = time.monotonic()
    span = meter.span("barrier.wait", recipe.path, **attributes)
    try:
        passed = await wait
    except BaseException as exc:
        outcome = failure_outcome(exc)
        outcome = outcome if outcome in ("cancelled", "timeout") else "error"
        meter.barrier_wait(time.monotonic() - started, outcome)
        span.end(outcome, exc)
        raise
    outcome = "passed" if passed else "cancelled" if recipe.is_closed else "timeout"
    meter.barrier_wait(time.monotonic() - started, outcome)
    span.end(outcome)
    return passed
