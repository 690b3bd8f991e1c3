"""The consumer lease of a work queue and the sweeper that runs while it is held (not public).

The claim markers of one consumer live on one **self-healing** lease (TTL =
``visibility_timeout``), taken lazily by the first claim: a producer that only enqueues holds
no lease and runs no sweeper. A live consumer keeps renewing, so the TTL bounds crash
detection, not processing time. When the lease is lost its markers go with it -- the lease
heals for *future* claims only (markers made under a dead lease stay dead: another consumer
may already hold their items).

Guaranteed: a receive cancelled while it takes the lease revokes it again (the cleanup is
shielded and bounded); a receive that took the lease and then fails or is cancelled gives it
back unless claims made meanwhile need it. Not guaranteed: that a healing lease is back within
a receive's deadline (the claim then returns nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core.logctx import library_logger
from .._core.shield import abort_guard
from ..client.lease import SelfHealingLease
from ..events import LeaseEvent
from ._take import retrieve

if TYPE_CHECKING:
    from ..client import EtcdClient

log = library_logger("etcd_recipes.work_queue")

LEASE_POLL = 0.05  # while the consumer lease heals, claims wait this long between checks
RECEIVE_CALL: contextvars.ContextVar[object] = contextvars.ContextVar("receive_call")
"""The receive call running in this context (so that the one that took the lease is known)."""


async def _heal_forward(lease_id: int) -> bool:
    # Claim markers made under a dead lease stay dead: their items are reclaimable, and another
    # consumer may already hold them. The healed lease serves future claims only.
    return True


class ConsumerLease:
    """The lease a consumer's claim markers live on, and its sweeper task."""

    __slots__ = (
        "_check_open",
        "_client",
        "_context",
        "_lock",
        "_on_event",
        "_spawn_sweeper",
        "_ttl",
        "lease",
        "sweeper",
        "taken_by",
    )

    def __init__(
        self,
        client: EtcdClient,
        ttl: float,
        *,
        on_event: Callable[[LeaseEvent], Any],
        spawn_sweeper: Callable[[], asyncio.Task[None]],
        check_open: Callable[[], None],
        context: str,
    ) -> None:
        self._client = client
        self._ttl = ttl
        self._on_event = on_event
        self._spawn_sweeper = spawn_sweeper
        self._check_open = check_open
        self._context = context
        self._lock = asyncio.Lock()
        self.lease: SelfHealingLease | None = None
        self.sweeper: asyncio.Task[None] | None = None
        self.taken_by: object = None  # the receive call that took the lease

    @property
    def lease_id(self) -> int:
        return self.lease.current_lease_id if self.lease is not None else 0

    async def acquire(self, deadline: float | None, dead: int = 0) -> int:
        """The lease's id, taken now if needed (never ``dead``); 0 if ``deadline`` passed
        while the lease was healing."""
        while True:
            async with self._lock:
                self._check_open()
                lease = self.lease
                if lease is None or lease.has_failed:
                    if lease is not None:
                        await self.stop()
                    lease = await self._start()
                    self.taken_by = RECEIVE_CALL.get()
            if lease.current_lease_id and lease.current_lease_id != dead:
                return lease.current_lease_id
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            await asyncio.sleep(LEASE_POLL)

    async def _start(self) -> SelfHealingLease:
        lease = self._client.self_healing_lease(self._ttl, _heal_forward)
        lease.add_listener(self._on_event)
        start = asyncio.ensure_future(lease.start())
        start.add_done_callback(retrieve)

        async def give_back() -> None:
            with contextlib.suppress(Exception):
                await start
            await lease.aclose()

        async with abort_guard(give_back, what=f"{self._context}: revoke new lease"):
            await asyncio.shield(start)
        self.lease = lease
        self.sweeper = self._spawn_sweeper()
        log.debug("%s: consumer lease %x taken", self._context, lease.current_lease_id)
        return lease

    async def stop(self) -> None:
        """Stop the sweeper (waiting for it) and revoke the lease."""
        self.taken_by = None
        sweeper, self.sweeper = self.sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sweeper
        await self.revoke()

    def cancel_sweeper(self) -> None:
        sweeper, self.sweeper = self.sweeper, None
        if sweeper is not None:
            sweeper.cancel()

    async def revoke(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.aclose()
