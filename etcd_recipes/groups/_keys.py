"""The key layout of a group: ``<path>/members/<member_id>`` and ``<path>/owners/<item>``."""

from __future__ import annotations

__all__ = ["member_key", "members_prefix", "owner_key", "owners_prefix"]


def members_prefix(path: str) -> str:
    """``<path>/members/``: every member's key lives under it."""
    return f"{path}/members/"


def member_key(path: str, member_id: str) -> str:
    """``<path>/members/<member_id>``."""
    return f"{members_prefix(path)}{member_id}"


def owners_prefix(path: str) -> str:
    """``<path>/owners/``: every owner key of a partitioner lives under it."""
    return f"{path}/owners/"


def owner_key(path: str, item: str) -> str:
    """``<path>/owners/<item>``."""
    return f"{owners_prefix(path)}{item}"
