"""Small typed results of raw etcd operations (instead of raw protobuf messages).

All are frozen dataclasses; keys and values are ``bytes``. Helpers such as
:attr:`KeyValue.text` decode UTF-8 for convenience.

Example::

    kv = await client.get("/config/mode")
    if kv is not None:
        print(kv.text, kv.mod_revision)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = [
    "Alarm",
    "DeleteResult",
    "ElectionLeaderKey",
    "EventType",
    "KeyValue",
    "LeaseGrant",
    "LeaseInfo",
    "Member",
    "PutResult",
    "RangeResult",
    "SortOrder",
    "SortTarget",
    "Status",
    "TxnResult",
    "WatchEvent",
    "WatchProgress",
]


class SortTarget(enum.IntEnum):
    """What a range is sorted by (etcd's ``RangeRequest.SortTarget``)."""

    KEY = 0
    VERSION = 1
    CREATE = 2
    MOD = 3
    VALUE = 4


class SortOrder(enum.IntEnum):
    """Sort direction of a range (etcd's ``RangeRequest.SortOrder``)."""

    NONE = 0
    ASCEND = 1
    DESCEND = 2


class EventType(enum.Enum):
    """Kind of a watch event."""

    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True)
class KeyValue:
    """One key with its value and revisions.

    Example::

        kv = await client.get("/k")
        assert kv is None or kv.version >= 1
    """

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @property
    def text(self) -> str:
        """The value decoded as UTF-8."""
        return self.value.decode("utf-8")

    @property
    def key_text(self) -> str:
        """The key decoded as UTF-8."""
        return self.key.decode("utf-8")

    @classmethod
    def _from_pb(cls, pb: Any) -> KeyValue:
        return cls(
            key=bytes(pb.key),
            value=bytes(pb.value),
            create_revision=int(pb.create_revision),
            mod_revision=int(pb.mod_revision),
            version=int(pb.version),
            lease=int(pb.lease),
        )


@dataclass(frozen=True)
class RangeResult:
    """The result of a range read: ``kvs`` (empty for count-only), ``count``, ``more`` and the
    store ``revision`` at which the read was served (anchor watches at ``revision + 1``)."""

    kvs: list[KeyValue]
    count: int
    more: bool
    revision: int

    def __iter__(self) -> Any:
        return iter(self.kvs)

    def __len__(self) -> int:
        return len(self.kvs)


@dataclass(frozen=True)
class PutResult:
    """The result of a put: the new store ``revision`` and, if asked, the previous key-value."""

    revision: int
    prev_kv: KeyValue | None = None


@dataclass(frozen=True)
class DeleteResult:
    """The result of a delete: how many keys were ``deleted``, their previous values if asked."""

    deleted: int
    revision: int
    prev_kvs: list[KeyValue] = field(default_factory=list)


OpResult = Union[RangeResult, PutResult, DeleteResult, "TxnResult"]


@dataclass(frozen=True)
class TxnResult:
    """The result of a transaction: which branch ran and one result per operation of it."""

    succeeded: bool
    revision: int
    responses: list[OpResult]


@dataclass(frozen=True)
class ElectionLeaderKey:
    """A leadership won in etcd's election service (etcd's ``LeaderKey``), returned by
    :meth:`~etcd_recipes.EtcdClient.election_campaign`: pass it to
    :meth:`~etcd_recipes.EtcdClient.election_proclaim` and
    :meth:`~etcd_recipes.EtcdClient.election_resign`.

    ``key`` is ``<name>/<lease id in hex>``; ``revision`` its create revision (a fencing
    token: guard writes with ``Cmp.create_revision(key) == revision``).

    Example::

        from etcd_recipes import Cmp, Op

        async with client.lease(10) as lease:
            leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
            fenced = Cmp.create_revision(leader.key) == leader.revision
            r = await client.txn([fenced], [Op.put(prefix + "/data", b"x")])
            assert r.succeeded
            await client.election_resign(leader)
    """

    name: bytes
    key: bytes
    revision: int
    lease: int


@dataclass(frozen=True)
class LeaseGrant:
    """A granted lease: its ``id`` and the ``ttl`` (seconds) the server actually granted."""

    id: int
    ttl: int


@dataclass(frozen=True)
class LeaseInfo:
    """A lease's remaining ``ttl`` (``-1`` if it no longer exists), ``granted_ttl`` and keys."""

    id: int
    ttl: int
    granted_ttl: int
    keys: list[bytes]


@dataclass(frozen=True)
class Member:
    """A cluster member."""

    id: int
    name: str
    peer_urls: list[str]
    client_urls: list[str]
    is_learner: bool


@dataclass(frozen=True)
class Status:
    """A member's status, from the Maintenance service."""

    version: str
    db_size: int
    leader: int
    member_id: int
    raft_index: int
    raft_term: int
    revision: int
    errors: list[str]
    cluster_id: int = 0
    """The cluster's id: a restore from a snapshot makes a new one."""
    db_size_in_use: int = 0
    """Bytes of the database file in use; ``db_size - db_size_in_use`` is what a defragment
    would give back."""
    is_learner: bool = False
    """Whether the answering member is a learner (a non-voting member catching up)."""


@dataclass(frozen=True)
class Alarm:
    """An alarm raised on a member (``etcdctl alarm list``), from the Maintenance service.

    ``NOSPACE``: the member's database reached its quota (``--quota-backend-bytes``); the
    cluster accepts only reads and deletes until space is freed (compact, defragment) and the
    alarm is disarmed. ``CORRUPT``: the member's data diverged from the others.

    Example::

        for alarm in await client.alarms():
            print(f"{alarm.member_id:x}: {alarm.alarm}")
    """

    member_id: int
    alarm: str
    """``"NOSPACE"`` or ``"CORRUPT"`` (etcd's ``AlarmType`` names)."""


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch. ``prev_kv`` is set only when the watch asked for it."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None = None

    @property
    def revision(self) -> int:
        """The revision of the change (the key's ``mod_revision``)."""
        return self.kv.mod_revision


@dataclass(frozen=True)
class WatchProgress:
    """etcd confirmed that a watch has delivered every change up to ``revision``.

    Only :meth:`Watch.items_and_progress() <etcd_recipes.Watch.items_and_progress>` yields
    it: after it, the watched keys are known to be unchanged between the last event and
    ``revision``.
    """

    key: bytes
    """The watched key (or prefix), without the client's namespace."""
    revision: int
