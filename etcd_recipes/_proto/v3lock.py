"""etcd's lock service (``v3lockpb.Lock``): the layout of the vendored ``v3lock.proto`` next to
this file, and its two RPCs. ``tests/locks/test_interop.py`` checks these fields against the
``.proto`` file, field by field.
"""

from __future__ import annotations

from typing import Any

from . import Layout, Method, T, build

__all__ = ["FIELDS", "LOCK", "PACKAGE", "UNLOCK", "LockRequest", "UnlockRequest"]

PACKAGE = "v3lockpb"
SERVICE = f"/{PACKAGE}.Lock"

FIELDS: Layout = {
    "ResponseHeader": [
        ("cluster_id", 1, T.TYPE_UINT64, ""),
        ("member_id", 2, T.TYPE_UINT64, ""),
        ("revision", 3, T.TYPE_INT64, ""),
        ("raft_term", 4, T.TYPE_UINT64, ""),
    ],
    "LockRequest": [("name", 1, T.TYPE_BYTES, ""), ("lease", 2, T.TYPE_INT64, "")],
    "LockResponse": [
        ("header", 1, T.TYPE_MESSAGE, "ResponseHeader"),
        ("key", 2, T.TYPE_BYTES, ""),
    ],
    "UnlockRequest": [("key", 1, T.TYPE_BYTES, "")],
    "UnlockResponse": [("header", 1, T.TYPE_MESSAGE, "ResponseHeader")],
}
"""The messages of ``v3lock.proto``: field name, number, protobuf type and message type."""

_CLASSES = build("etcd_recipes/v3lock.proto", PACKAGE, FIELDS)
LockRequest: Any = _CLASSES["LockRequest"]
UnlockRequest: Any = _CLASSES["UnlockRequest"]

LOCK = Method(f"{SERVICE}/Lock", LockRequest, _CLASSES["LockResponse"])
UNLOCK = Method(f"{SERVICE}/Unlock", UnlockRequest, _CLASSES["UnlockResponse"])
