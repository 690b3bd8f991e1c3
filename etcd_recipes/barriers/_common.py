"""What the barrier recipes share (private to the barriers family): how a lease event of a
key they set is reported.
"""

from __future__ import annotations

from .._core.recipe import Recipe
from ..errors import LeaseEventError
from ..events import LeaseEvent, LeaseRestored, LeaseResumed


def report_lease_event(recipe: Recipe, event: LeaseEvent) -> None:
    """Feed a self-healing lease's event into ``recipe``'s connection state, and record every
    event but a recovery (restored, resumed) as a :class:`~etcd_recipes.errors.LeaseEventError`."""
    recipe._on_recovery_event(event)
    if not isinstance(event, (LeaseRestored, LeaseResumed)):
        recipe._record_exception(LeaseEventError(event), "lease")
