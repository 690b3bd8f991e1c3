"""The metric vocabularies every recipe family reports with (private to the library): how an
exception, a lease event or a lost hold maps onto an outcome or a ``lease_lost`` kind.

Lives once here so the locks, election, barriers, queues and discovery families report a loss
the same way (see :class:`~etcd_recipes.EtcdMetrics` for the vocabularies themselves).
"""

from __future__ import annotations

import asyncio

from ..client.lease import AcquisitionLease
from ..errors import LeaseNotFoundError, LostError, RecipeClosedError
from ..events import LeaseEvent, LeaseExpired

__all__ = ["failure_outcome", "hold_loss_kind", "lease_lost_kind"]


def failure_outcome(exc: BaseException) -> str:
    """The wait outcome of an acquisition, campaign or barrier wait that raised ``exc``:
    ``cancelled`` (cancelled, or its recipe closed), ``lost`` (its lease was lost while
    waiting), ``timeout`` or ``error``."""
    if isinstance(exc, (asyncio.CancelledError, RecipeClosedError)):
        return "cancelled"
    if isinstance(exc, (LostError, LeaseNotFoundError)):
        return "lost"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "error"


def lease_lost_kind(event: LeaseEvent) -> str | None:
    """The ``lease_lost`` kind of a self-healing lease's event (``None``: not a loss).

    Only :class:`~etcd_recipes.LeaseExpired` is a loss (a later ``LeaseFailed`` is the heal
    giving up on the same loss): ``keep_alive_failed`` when renewals did not reach etcd within
    the TTL, ``expired`` when etcd answered that the lease is gone (expired or revoked: the
    keep-alive answer does not tell them apart)."""
    if not isinstance(event, LeaseExpired):
        return None
    cause = event.cause
    if isinstance(cause, LeaseNotFoundError) and "no renewal" in str(cause):
        return "keep_alive_failed"
    return "expired"


def hold_loss_kind(lease: AcquisitionLease) -> str:
    """The ``lease_lost`` kind of a lost hold (lock, permit, leadership term) on ``lease``:
    the lease's own loss kind when the lease was lost, else ``revoked`` (its key was deleted
    by someone else, for instance ``etcd-recipes lock break``)."""
    if lease.is_lost and lease.loss_kind:
        return lease.loss_kind
    return "revoked"
