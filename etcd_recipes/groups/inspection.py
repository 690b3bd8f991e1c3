"""Reading a group from outside: its members and the owners of its items (the CLI's
``group ls`` and ``group partitions``).

Guaranteed: read only, one range read of ``<path>/`` (members and owners at one revision);
only keys in the family's layout are reported (``<path>/members/<id>``,
``<path>/owners/<item>``), anything else under ``<path>/`` is counted as ``other_keys``.

Not guaranteed: the partitioners' item set is not in etcd, so an item nobody owns right now
(a hand-over in progress, a dead owner's lease not yet expired and deleted) is not listed;
``expected_owner`` is what rendezvous hashing over the members read names, which the
partitioners converge to once their views agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._assign import owner_of
from ._keys import members_prefix, owners_prefix

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["GroupView", "MemberRecord", "OwnerRecord", "read_group"]


@dataclass(frozen=True)
class MemberRecord:
    """One member key: ``<path>/members/<member_id>``."""

    member_id: str
    payload: bytes
    lease: int
    create_revision: int


@dataclass(frozen=True)
class OwnerRecord:
    """One owner key: ``<path>/owners/<item>``; ``fencing_token`` is its create revision."""

    item: str
    owner: str
    fencing_token: int
    lease: int
    owner_is_member: bool
    expected_owner: str | None


@dataclass(frozen=True)
class GroupView:
    """What ``<path>/`` holds at ``revision``."""

    path: str
    revision: int
    members: tuple[MemberRecord, ...]
    owners: tuple[OwnerRecord, ...]
    other_keys: int


async def read_group(client: EtcdClient, path: str) -> GroupView:
    """The members and owner keys of the group at ``path``, read at one revision.

    Example::

        from etcd_recipes import SetPartitioner
        from etcd_recipes.groups.inspection import read_group

        async with SetPartitioner(client, f"{prefix}/g", ["x"], member_id="a") as p:
            await p.wait_stable(timeout=10)
            view = await read_group(client, f"{prefix}/g")
            assert [m.member_id for m in view.members] == ["a"]
            assert [(o.item, o.owner) for o in view.owners] == [("x", "a")]
    """
    path = path.rstrip("/")
    read = await client.get_prefix(f"{path}/")
    members_at, owners_at = members_prefix(path), owners_prefix(path)
    members: list[MemberRecord] = []
    raw_owners = []
    other = 0
    for kv in read:
        key = kv.key_text
        if key.startswith(members_at) and "/" not in key[len(members_at) :]:
            members.append(
                MemberRecord(key[len(members_at) :], kv.value, kv.lease, kv.create_revision)
            )
        elif key.startswith(owners_at) and "/" not in key[len(owners_at) :]:
            raw_owners.append((key[len(owners_at) :], kv))
        else:
            other += 1
    ids = sorted(m.member_id for m in members)
    owners = tuple(
        OwnerRecord(
            item,
            kv.value.decode("utf-8", "replace"),
            kv.create_revision,
            kv.lease,
            kv.value.decode("utf-8", "replace") in ids,
            owner_of(item, ids),
        )
        for item, kv in raw_owners
    )
    return GroupView(path, read.revision, tuple(members), owners, other)
