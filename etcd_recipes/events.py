"""Recovery and lease events, and the connection state they drive.

Watches report :class:`WatchSuspended`, :class:`WatchResubscribed`, :class:`WatchResynced` and
:class:`WatchFailed`; leases report :class:`LeaseSuspended`, :class:`LeaseResumed`,
:class:`LeaseExpired`, :class:`LeaseRestored` and :class:`LeaseFailed`. Recipes fold them into a
:class:`ConnectionState` (architecture §3.7)::

    async with client.watch("/config/", prefix=True) as watch:
        async for item in watch.items():
            if isinstance(item, WatchResynced):
                ...  # history between item.compact_revision and now is gone: re-read
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

__all__ = [
    "ConnectionState",
    "LeaseEvent",
    "LeaseExpired",
    "LeaseFailed",
    "LeaseRestored",
    "LeaseResumed",
    "LeaseSuspended",
    "WatchFailed",
    "WatchRecoveryEvent",
    "WatchResubscribed",
    "WatchResynced",
    "WatchSuspended",
    "state_after",
]


class ConnectionState(enum.Enum):
    """A recipe's view of its connection. It starts at ``CONNECTED``; after any recovery it is
    ``RECONNECTED``; ``LOST`` means a hold or watch is gone for good (or until healed)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    RECONNECTED = "RECONNECTED"
    LOST = "LOST"


@dataclass(frozen=True)
class WatchSuspended:
    """The watch's stream failed; it is trying to resubscribe."""

    key: bytes
    cause: BaseException | None = None


@dataclass(frozen=True)
class WatchResubscribed:
    """The watch is live again from ``resume_revision`` (``0``: from "now", a possible gap)."""

    key: bytes
    resume_revision: int


@dataclass(frozen=True)
class WatchResynced:
    """History up to ``compact_revision`` was compacted away; the resync hook re-read the state
    and the watch continues from ``anchor_revision``."""

    key: bytes
    compact_revision: int
    anchor_revision: int


@dataclass(frozen=True)
class WatchFailed:
    """The watch gave up recovering; no more events will come."""

    key: bytes
    cause: BaseException | None = None


WatchRecoveryEvent = Union[WatchSuspended, WatchResubscribed, WatchResynced, WatchFailed]


@dataclass(frozen=True)
class LeaseSuspended:
    """Keep-alives are failing; the lease may still be valid on the server."""

    lease_id: int
    cause: BaseException | None = None


@dataclass(frozen=True)
class LeaseResumed:
    """Keep-alives are answered again after a :class:`LeaseSuspended`: the same lease is still
    valid (it was never lost), so nothing had to be re-granted."""

    lease_id: int


@dataclass(frozen=True)
class LeaseExpired:
    """The lease is gone (TTL reached, revoked, or renewals stopped past the TTL)."""

    lease_id: int
    cause: BaseException | None = None


@dataclass(frozen=True)
class LeaseRestored:
    """A self-healing lease was re-granted and its keys re-established."""

    old_lease_id: int
    new_lease_id: int


@dataclass(frozen=True)
class LeaseFailed:
    """A self-healing lease gave up (retries exhausted, or re-establishing was declined)."""

    lease_id: int
    cause: BaseException | None = None


LeaseEvent = Union[LeaseSuspended, LeaseResumed, LeaseExpired, LeaseRestored, LeaseFailed]


def state_after(event: WatchRecoveryEvent | LeaseEvent) -> ConnectionState:
    """The connection state an event leads to (architecture §3.7).

    >>> state_after(LeaseExpired(7))
    <ConnectionState.LOST: 'LOST'>
    """
    if isinstance(event, (WatchSuspended, LeaseSuspended)):
        return ConnectionState.SUSPENDED
    if isinstance(event, (WatchResubscribed, WatchResynced, LeaseResumed, LeaseRestored)):
        return ConnectionState.RECONNECTED
    return ConnectionState.LOST
