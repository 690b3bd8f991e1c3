"""Barriers. :class:`DistributedBarrier` is a gate: while it is set, waiters block; removing it
releases them all.

:Status: Beta

Key layout (shared with the Kotlin library): the key ``<path>`` holds ``"<client_id>:<token>"`` on a
**self-healing** lease of ``lease_ttl`` seconds, created with a compare-and-swap
(``If(version == 0)``) so that two setters never both win.

Guarantees:

* ``wait_on_barrier()`` returns True once the barrier is removed (or its setter's lease
  expired), False on timeout; it reads the state and watches from that read's revision + 1, so
  a removal between the read and the watch is never missed, and it re-checks after every watch
  recovery (server restart, compaction);
* a cancelled ``wait_on_barrier()`` leaves nothing behind (waiters hold no keys or leases);
* only the instance that set the barrier removes it (``remove_barrier(force=True)`` overrides),
  and an instance can set the barrier again after removing it.

Not guaranteed -- the **spurious-lift window**: if the setter's lease expires (a long pause, a
partition), etcd deletes the key and every waiter is released; the lease then heals and the
barrier is set again for *future* waiters. Released waiters are not re-blocked. Treat the gate
as an optimisation for coordination, not as a safety property.

Deviations from the Kotlin library (which this port fixes): an instance that never set the barrier
could delete another client's barrier, and an instance could never re-arm after removal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.keys import random_token
from .._core.txn import Cmp, Op
from .._core.validate import check_timeout, check_ttl
from .._recipe.recipe import Recipe
from .._recipe.waiting import wait_for_change
from ..client.lease import SelfHealingLease
from ..events import LeaseEvent
from ..types import EventType, WatchEvent
from ._common import metered_wait, report_lease_event

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DEFAULT_TTL", "DistributedBarrier"]

DEFAULT_TTL = 2
"""Default TTL (seconds) of the leases of the keys the barrier recipes set."""


class DistributedBarrier(Recipe):
    """A gate barrier on one key.

    Example::

        from etcd_recipes import DistributedBarrier

        async with DistributedBarrier(client, f"{prefix}/deploy") as gate:
            assert await gate.set_barrier()
            path = f"{prefix}/deploy"
            async with DistributedBarrier(client, path, wait_on_missing_barriers=False) as waiter:
                assert not await waiter.wait_on_barrier(timeout=0.5)  # blocked: the gate is set
                await gate.remove_barrier()  # releases every waiter
                assert await waiter.wait_on_barrier(timeout=5)

    :param wait_on_missing_barriers: if True (the default), a waiter on a barrier that is not
        set blocks until it is set **and then removed**; if False it returns at once.
    :param lease_ttl: seconds; the setter's key disappears this long after its process dies.
    :param metrics_name: the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        wait_on_missing_barriers: bool = True,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.wait_on_missing_barriers: bool = wait_on_missing_barriers
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        self._lease: SelfHealingLease | None = None
        self._token = ""

    async def set_barrier(self) -> bool:
        """Set the barrier; False if it is already set (by anyone, this instance included)."""
        self._check_open()
        if self._lease is not None and self._lease.is_healthy:
            return False
        if await self.is_barrier_set():
            return False
        token = f"{self.client_id}:{random_token()}"

        async def establish(lease_id: int) -> bool:
            result = await self._client.txn(
                [Cmp.missing(self.path)], [Op.put(self.path, token, lease=lease_id)]
            )
            return result.succeeded

        lease = self._client.self_healing_lease(self.lease_ttl, establish)
        lease.add_listener(self._on_lease_event)
        if not await lease.start():
            return False
        self._lease, self._token = lease, token
        return True

    async def remove_barrier(self, *, force: bool = False) -> bool:
        """Remove the barrier this instance set, releasing every waiter.

        Returns False if this instance did not set it (or it is already gone). With
        ``force=True`` the key is deleted whoever set it.
        """
        self._check_open()
        lease, token = self._lease, self._token
        self._lease, self._token = None, ""
        removed = False
        if lease is not None:
            await lease.aclose()  # revokes: the key goes with the lease
            # Should the revoke have failed, delete the key -- but only if it is still ours.
            await self._client.txn([Cmp.value(self.path) == token], [Op.delete(self.path)])
            removed = True
        if force:
            removed = (await self._client.delete(self.path)).deleted > 0 or removed
        return removed

    async def is_barrier_set(self) -> bool:
        """Whether the barrier key exists (advisory: it may change right after)."""
        self._check_open()
        return (await self._client.range(self.path, count_only=True)).count > 0

    async def wait_on_barrier(self, timeout: float | None = None) -> bool:
        """Wait until the barrier is removed; False if ``timeout`` seconds pass first.

        Cancellation is safe: the wait holds nothing in etcd, and the caller's cancellation
        propagates unchanged.
        """
        self._check_open()
        return await metered_wait(self, self._wait(check_timeout(timeout)))

    async def _wait(self, timeout: float | None) -> bool:
        snapshot = await self._client.range(self.path, count_only=True)
        present_at_start = snapshot.count > 0
        if not present_at_start and not self.wait_on_missing_barriers:
            return True

        async def probe() -> tuple[bool, int]:
            now = await self._client.range(self.path, count_only=True)
            present = now.count > 0
            done = not present and (present_at_start or not self.wait_on_missing_barriers)
            return done, now.revision

        def removed(event: WatchEvent) -> bool:
            return event.type is EventType.DELETE

        return await wait_for_change(
            self._client,
            self.path,
            after_revision=snapshot.revision,
            trigger=removed,
            probe=probe,
            no_put=True,
            timeout=timeout,
            on_recovery=self._on_recovery_event,
        )

    def _on_lease_event(self, event: LeaseEvent) -> None:
        report_lease_event(self, event)

    async def _do_close(self) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            await lease.aclose()
