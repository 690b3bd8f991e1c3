"""etcd's election service (``v3electionpb.Election``): a minimal, wire-compatible layout and
its five RPCs.

Package, message names and field numbers are those of etcd's
``server/etcdserver/api/v3election/v3electionpb/v3election.proto``; ``ResponseHeader`` and
``KeyValue`` are local, wire-compatible copies of ``etcdserverpb.ResponseHeader`` and
``mvccpb.KeyValue``.
"""

from __future__ import annotations

from typing import Any

from . import Layout, Method, T, build

__all__ = ["CAMPAIGN", "LEADER", "MESSAGES", "OBSERVE", "PROCLAIM", "RESIGN"]

PACKAGE = "v3electionpb"
SERVICE = f"/{PACKAGE}.Election"

_BYTES, _INT64, _UINT64, _MESSAGE = T.TYPE_BYTES, T.TYPE_INT64, T.TYPE_UINT64, T.TYPE_MESSAGE

FIELDS: Layout = {
    "ResponseHeader": [
        ("cluster_id", 1, _UINT64, ""),
        ("member_id", 2, _UINT64, ""),
        ("revision", 3, _INT64, ""),
        ("raft_term", 4, _UINT64, ""),
    ],
    "KeyValue": [
        ("key", 1, _BYTES, ""),
        ("create_revision", 2, _INT64, ""),
        ("mod_revision", 3, _INT64, ""),
        ("version", 4, _INT64, ""),
        ("value", 5, _BYTES, ""),
        ("lease", 6, _INT64, ""),
    ],
    "CampaignRequest": [
        ("name", 1, _BYTES, ""),
        ("lease", 2, _INT64, ""),
        ("value", 3, _BYTES, ""),
    ],
    "CampaignResponse": [
        ("header", 1, _MESSAGE, "ResponseHeader"),
        ("leader", 2, _MESSAGE, "LeaderKey"),
    ],
    "LeaderKey": [
        ("name", 1, _BYTES, ""),
        ("key", 2, _BYTES, ""),
        ("rev", 3, _INT64, ""),
        ("lease", 4, _INT64, ""),
    ],
    "LeaderRequest": [("name", 1, _BYTES, "")],
    "LeaderResponse": [("header", 1, _MESSAGE, "ResponseHeader"), ("kv", 2, _MESSAGE, "KeyValue")],
    "ResignRequest": [("leader", 1, _MESSAGE, "LeaderKey")],
    "ResignResponse": [("header", 1, _MESSAGE, "ResponseHeader")],
    "ProclaimRequest": [("leader", 1, _MESSAGE, "LeaderKey"), ("value", 2, _BYTES, "")],
    "ProclaimResponse": [("header", 1, _MESSAGE, "ResponseHeader")],
}
"""The messages used: field name, number, protobuf type and message type."""

MESSAGES: dict[str, Any] = build("etcd_recipes/v3election_min.proto", PACKAGE, FIELDS)
"""Message classes by name (``MESSAGES["CampaignRequest"](name=b"x", lease=7)``)."""


def _rpc(name: str, request: str, response: str, *, streaming: bool = False) -> Method:
    return Method(f"{SERVICE}/{name}", MESSAGES[request], MESSAGES[response], streaming)


CAMPAIGN = _rpc("Campaign", "CampaignRequest", "CampaignResponse")
PROCLAIM = _rpc("Proclaim", "ProclaimRequest", "ProclaimResponse")
LEADER = _rpc("Leader", "LeaderRequest", "LeaderResponse")
OBSERVE = _rpc("Observe", "LeaderRequest", "LeaderResponse", streaming=True)
RESIGN = _rpc("Resign", "ResignRequest", "ResignResponse")
