"""The client's lease calls: grant, revoke, time-to-live, one renewal --
:class:`LeaseCalls`, a base of :class:`~etcd_recipes.EtcdClient`. Not public itself.

Grants go through the funnel like every unary call; a revoke is best-effort (``False``, logged,
instead of raising: the lease expires at its TTL). Renewals of kept-alive leases are the
keeper's (:mod:`etcd_recipes.client.lease_keeper`).
"""

from __future__ import annotations

from aetcd import rpc as pb

from .._core import validate
from .._core.logctx import library_logger
from .._core.validate import check_lease_id, check_ttl
from ..errors import EtcdRecipeError
from ..types import LeaseGrant, LeaseInfo
from .kv import KVCalls
from .lifecycle import keep_alive_once
from .rpc import UNSET

__all__ = ["LeaseCalls"]

log = library_logger("etcd_recipes.client")


class LeaseCalls(KVCalls):
    """The lease calls and lease handles of :class:`~etcd_recipes.EtcdClient` (its base)."""

    # ------------------------------------------------------------------ leases

    async def lease_grant(self, ttl: float, *, timeout: float | None = UNSET) -> LeaseGrant:
        """Grant a lease of ``ttl`` whole seconds (the server may grant more).

        Prefer :meth:`lease` (kept alive, revoked on exit) for anything but one-off keys.
        """
        return await self._grant_lease(check_ttl(ttl), timeout=timeout)

    async def _grant_lease(self, ttl: int, *, timeout: float | None = UNSET) -> LeaseGrant:
        """:meth:`lease_grant` for a TTL its caller checked already (the lease handles)."""
        req = pb.LeaseGrantRequest(TTL=ttl)
        resp = await self._call("lease_grant", "LeaseGrant", pb.LeaseStub, req, timeout=timeout)
        return LeaseGrant(id=int(resp.ID), ttl=int(resp.TTL))

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = UNSET) -> bool:
        """Revoke a lease, deleting its keys. Best-effort: False (logged) instead of raising."""
        req = pb.LeaseRevokeRequest(ID=validate.check_lease_id(lease_id))
        timeout = validate.check_rpc_timeout(timeout)  # a bad argument is no "False"
        try:
            await self._call(
                "lease_revoke", "LeaseRevoke", pb.LeaseStub, req, retry=False, timeout=timeout
            )
            return True
        except EtcdRecipeError as exc:
            log.info("revoking lease %x failed (it will expire at its TTL): %s", lease_id, exc)
            return False

    async def lease_time_to_live(
        self, lease_id: int, *, keys: bool = False, timeout: float | None = UNSET
    ) -> LeaseInfo:
        """A lease's remaining TTL (``-1`` when it does not exist) and, optionally, its keys."""
        req = pb.LeaseTimeToLiveRequest(ID=validate.check_lease_id(lease_id), keys=keys)
        resp = await self._call(
            "lease_time_to_live", "LeaseTimeToLive", pb.LeaseStub, req, timeout=timeout
        )
        return self._conv.lease_info(resp)

    # ------------------------------------------------------------------ lease handles

    async def lease_keep_alive_once(self, lease_id: int) -> int:
        """Renew a lease once on the shared stream's schedule-free path; returns the new TTL
        (``0`` when the lease no longer exists)."""
        check_lease_id(lease_id)
        self._check()
        return await keep_alive_once(self._wire, lease_id)
