"""Double barriers. :class:`DistributedDoubleBarrier` is two rendezvous of N members:
:meth:`~DistributedDoubleBarrier.enter` (everyone starts together) and
:meth:`~DistributedDoubleBarrier.leave` (everyone finishes together).

:Status: Beta

Key layout (shared with the Kotlin library): two counted barriers, at ``<path>/enter`` and
``<path>/leave``, with this recipe's client id and TTL. Their guarantees, and what they do not
guarantee, are those of :class:`~etcd_recipes.DistributedBarrierWithCount` (``counted.py``),
for each phase.

Deviation from the Kotlin library (which this port fixes): the double barrier did not pass its
client id and TTL to its two barriers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.keys import append_to_path
from .._core.validate import check_timeout
from .._recipe.recipe import Recipe
from ..events import ConnectionState
from ._common import metered_wait
from .barrier import DEFAULT_TTL
from .counted import DistributedBarrierWithCount

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedDoubleBarrier"]


class DistributedDoubleBarrier(Recipe):
    """Two rendezvous of ``member_count`` members: :meth:`enter` (everyone starts together)
    and :meth:`leave` (everyone finishes together).

    Example::

        from etcd_recipes import DistributedDoubleBarrier

        # Every member (usually one per process) runs this with the same path and member count;
        # a count of 1 keeps the example to one process.
        async with DistributedDoubleBarrier(client, f"{prefix}/phase-1", 1) as barrier:
            assert await barrier.enter(timeout=10)
            print("working")  # every member works at the same time
            assert await barrier.leave(timeout=10)

    Built on two :class:`DistributedBarrierWithCount` at ``<path>/enter`` and
    ``<path>/leave`` (the Kotlin library's layout), with this recipe's client id and TTL.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        member_count: int,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self._enter = DistributedBarrierWithCount(
            client,
            append_to_path(path, "enter"),
            member_count,
            lease_ttl=lease_ttl,
            client_id=self.client_id,
            metrics_name=self.metrics_name,
        )
        self._leave = DistributedBarrierWithCount(
            client,
            append_to_path(path, "leave"),
            member_count,
            lease_ttl=lease_ttl,
            client_id=self.client_id,
            metrics_name=self.metrics_name,
        )
        self.member_count: int = member_count
        """How many members each phase waits for."""
        self.lease_ttl: int = self._enter.lease_ttl
        """Seconds: the TTL of each waiting key's lease."""
        for inner in (self._enter, self._leave):
            inner.add_connection_state_listener(self._on_inner_state)
            inner.add_exception_listener(self._on_inner_exception)

    async def enter(self, timeout: float | None = None) -> bool:
        """Wait until ``member_count`` members have entered; False on timeout or close.

        Example::

            from etcd_recipes import DistributedDoubleBarrier

            async with DistributedDoubleBarrier(client, f"{prefix}/phase-1", 2) as barrier:
                if not await barrier.enter(timeout=0.5):
                    print("the other member did not show up")  # here, it never started
        """
        self._check_open()
        self._enter._check_open()
        wait = self._enter._wait(check_timeout(timeout))
        return await metered_wait(self, wait, **{"barrier.phase": "enter"})

    async def leave(self, timeout: float | None = None) -> bool:
        """Wait until ``member_count`` members have left; False on timeout or close.

        Example::

            from etcd_recipes import DistributedDoubleBarrier

            async with DistributedDoubleBarrier(client, f"{prefix}/phase-1", 1) as barrier:
                assert await barrier.enter(timeout=5)  # a barrier of one waits for nobody
                assert await barrier.leave(timeout=5)
        """
        self._check_open()
        self._leave._check_open()
        wait = self._leave._wait(check_timeout(timeout))
        return await metered_wait(self, wait, **{"barrier.phase": "leave"})

    async def enter_waiter_count(self) -> int:
        """How many members wait in :meth:`enter` now (advisory)."""
        return await self._enter.waiter_count()

    async def leave_waiter_count(self) -> int:
        """How many members wait in :meth:`leave` now (advisory)."""
        return await self._leave.waiter_count()

    def _on_inner_state(self, new: ConnectionState, old: ConnectionState) -> None:
        self._set_state(new)

    def _on_inner_exception(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context)

    async def _do_close(self) -> None:
        try:
            await self._enter.aclose()
        finally:
            await self._leave.aclose()
