"""What groups report: member changes, and the items a partitioner takes and gives back.

A :class:`~etcd_recipes.GroupMember` reports a :data:`GroupEvent`: :class:`MemberJoined`,
:class:`MemberUpdated`, :class:`MemberLeft` (one per changed member key, in revision order),
:class:`GroupResynced` after the view was re-read (a compaction, a restore: the changes found
by the re-read come just before it, marked ``synthetic``), and the
:data:`~etcd_recipes.LeaseEvent` s of the member's own lease.

A :class:`~etcd_recipes.SetPartitioner` reports a :data:`PartitionEvent`:
:class:`ItemAssigned` once its owner key is created, :class:`ItemReleased` when it gives an
item back (before deleting the key) or lost it (``lost=True``: its lease expired or the key
was deleted out of band; the key is already gone).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, Union

from ..codecs import ValueT
from ..events import LeaseEvent

__all__ = [
    "GroupEvent",
    "GroupResynced",
    "ItemAssigned",
    "ItemReleased",
    "MemberJoined",
    "MemberLeft",
    "MemberUpdated",
    "PartitionEvent",
    "PartitionState",
]


@dataclass(frozen=True)
class MemberJoined(Generic[ValueT]):
    """``member_id`` joined the group at ``revision`` with ``payload``.

    Example::

        from etcd_recipes import GroupMember, MemberJoined

        async with GroupMember(client, f"{prefix}/workers", b"a", member_id="a") as a:
            events = a.events()
            async with GroupMember(client, f"{prefix}/workers", b"b", member_id="b"):
                event = await anext(events)
                assert isinstance(event, MemberJoined) and event.member_id == "b"
    """

    member_id: str
    payload: ValueT | None
    revision: int
    synthetic: bool = False
    """Found by a re-read after a compaction or restore rather than seen by the watch."""


@dataclass(frozen=True)
class MemberUpdated(Generic[ValueT]):
    """``member_id`` changed its payload at ``revision`` (see :meth:`GroupMember.update
    <etcd_recipes.GroupMember.update>`)."""

    member_id: str
    payload: ValueT | None
    revision: int
    synthetic: bool = False


@dataclass(frozen=True)
class MemberLeft:
    """``member_id`` left at ``revision`` (closed, died and its lease expired, or lost its
    lease: it comes back with a :class:`MemberJoined` when its lease heals)."""

    member_id: str
    revision: int
    synthetic: bool = False


@dataclass(frozen=True)
class GroupResynced:
    """The member view was re-read at ``revision`` (history compacted, server restored): the
    differences found were reported just before, as ``synthetic`` events."""

    revision: int


GroupEvent = Union[MemberJoined[Any], MemberUpdated[Any], MemberLeft, GroupResynced, LeaseEvent]
"""What a :class:`~etcd_recipes.GroupMember` reports."""


@dataclass(frozen=True)
class ItemAssigned:
    """This member now owns ``item``; ``fencing_token`` is its owner key's create revision.

    Example::

        from etcd_recipes import ItemAssigned, SetPartitioner

        partitioner = SetPartitioner(client, f"{prefix}/shards", ["s0", "s1"])
        events = partitioner.events()
        async with partitioner:
            first = await anext(events)
            assert isinstance(first, ItemAssigned) and first.item in ("s0", "s1")
    """

    item: str
    fencing_token: int


@dataclass(frozen=True)
class ItemReleased:
    """This member no longer owns ``item``. ``lost`` is False for a hand-over (published before
    the owner key is deleted -- but listeners and iterators are not waited for: to stop the
    work before anyone else can take the item, pass ``on_release`` to the partitioner) and
    True when ownership was lost (the lease expired, or the key was deleted out of band: it is
    gone already)."""

    item: str
    fencing_token: int
    lost: bool = False


PartitionEvent = Union[ItemAssigned, ItemReleased]
"""What a :class:`~etcd_recipes.SetPartitioner` reports."""


class PartitionState(enum.Enum):
    """Where a :class:`~etcd_recipes.SetPartitioner` stands against its assignment (as it
    sees the group): ``ACQUIRING`` (items assigned to it are still held by another member),
    ``RELEASING`` (it holds items assigned to another member), ``STABLE`` (neither)."""

    NEW = "new"
    ACQUIRING = "acquiring"
    RELEASING = "releasing"
    STABLE = "stable"
    CLOSED = "closed"
