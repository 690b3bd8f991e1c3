"""Endpoint sync: the client's endpoints follow the cluster's members (Go's
``clientv3.Config.AutoSyncInterval``). Not public itself; see
:meth:`~etcd_recipes.EtcdClient.sync_endpoints` and ``connect(endpoint_sync_interval=...)``.

One ``MemberList`` gives the voting members' client URLs (learners serve no writes and no
linearizable reads, so they are left out, as when the client opens). When that set differs
from the client's endpoints, the client dials the new set on a new channel: calls made from
then on use it, calls in flight on the old one may finish for :data:`CHANNEL_GRACE` seconds,
and the watch and keep-alive streams move when the old channel closes -- every watch resumes
at its last revision + 1, every lease is renewed at once on the new stream.

Not guaranteed: members whose advertised client URLs the client cannot reach (a proxy, a
container network) -- keep the sync off there (the default) and give reachable endpoints.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from aetcd import rpc as pb

from .._core.logctx import library_logger
from ..errors import EtcdRecipeError
from .endpoints import ChannelSpec, parse_endpoints

if TYPE_CHECKING:
    from .base import ClientBase

__all__ = ["CHANNEL_GRACE", "synced_spec"]

log = library_logger("etcd_recipes.client")

CHANNEL_GRACE = 5.0
"""Seconds calls in flight on the channel of the old endpoints may finish before it closes."""


async def synced_spec(client: ClientBase) -> ChannelSpec | None:
    """The client's channel settings with the voting members' client URLs as endpoints, or
    ``None`` when they are the endpoints already (or no member advertises a URL)."""
    resp = await client._call("member_list", "MemberList", pb.ClusterStub, pb.MemberListRequest())
    urls = [str(u) for m in resp.members if not m.isLearner for u in m.clientURLs]
    if not urls:
        return None
    spec = client._spec
    try:
        found = parse_endpoints(urls)
    except EtcdRecipeError as exc:
        log.warning("endpoint sync: a member advertises an unusable client URL: %s", exc)
        return None
    if any(e.secure is not None and e.secure != spec.secure for e in found):
        log.warning("endpoint sync skipped: the members' URLs and the client differ on TLS")
        return None
    known = {(e.host, e.port) for e in spec.endpoints}
    if {(e.host, e.port) for e in found} == known:
        return None
    ordered = tuple(sorted(found, key=lambda e: (e.host, e.port)))
    return dataclasses.replace(spec, endpoints=ordered)
