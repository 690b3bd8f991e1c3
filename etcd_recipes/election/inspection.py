"""Operator tools for an election at a path: :func:`leader_record` (who holds the current term,
on which key and lease) and :func:`resign_leader` (end that term from outside). The
``etcd-recipes election resign`` command uses them.

They use the election's own key layout (``<path>/LEADER`` = ``"<client_id>:<7 chars>"`` on a
per-term lease, see :mod:`etcd_recipes.election`).

Guaranteed: :func:`resign_leader` ends exactly the term it read -- it revokes that term's lease
(a per-term lease carries only the LEADER key and the value the term proclaimed, and is never
healed, so a later term, on a new lease, is untouched), or, for a LEADER key without a lease,
deletes it guarded by its create revision (the fencing token). The leader sees its term lost
and steps down (a :class:`~etcd_recipes.LeaderLatch` then contests again and may win a new
term).

Not guaranteed: the old leader notices only when its watch or keep-alive tells it (normally at
once, later while it is partitioned); until then it may still believe it leads -- fence its
writes with the term's compare.

Example::

    from etcd_recipes import LeaderLatch
    from etcd_recipes.election.inspection import leader_record, resign_leader

    async with LeaderLatch(client, f"{prefix}/election", client_id="node-1") as latch:
        await latch.await_leadership(timeout=10)
        record = await leader_record(client, f"{prefix}/election")
        assert record is not None and record.client_id == "node-1"
        assert await resign_leader(client, f"{prefix}/election") == record
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.txn import Cmp, Op
from .._core.validate import check_path
from ..client import check_client
from ..errors import LeaseNotFoundError
from ._keys import leader_key, leader_name

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["LeaderRecord", "leader_record", "resign_leader"]


@dataclass(frozen=True)
class LeaderRecord:
    """The current term of an election: the leader's ``client_id``, its LEADER ``key``, the
    term's ``lease_id`` (0: none) and ``fencing_token`` (the key's create revision).

    Example::

        from etcd_recipes.election.inspection import leader_record

        record = await leader_record(client, f"{prefix}/election")
        print(record and (record.client_id, record.fencing_token))
    """

    path: str
    client_id: str
    key: str
    lease_id: int
    fencing_token: int


async def leader_record(client: EtcdClient, path: str) -> LeaderRecord | None:
    """The current term at ``path`` (one read), or ``None`` when nobody leads.

    Example::

        from etcd_recipes.election.inspection import leader_record

        assert await leader_record(client, f"{prefix}/no-election") is None
    """
    client, path = check_client(client), check_path(path)
    key = leader_key(path)
    kv = await client.get(key)
    if kv is None:
        return None
    return LeaderRecord(path, leader_name(kv.value), key, kv.lease, kv.create_revision)


async def resign_leader(
    client: EtcdClient, path: str, *, fencing_token: int | None = None
) -> LeaderRecord | None:
    """End the current term at ``path``; return the term it ended, or ``None`` when nobody
    led (or, with ``fencing_token``, when the current term is not that one: a newer term is
    never ended by mistake).

    Example::

        from etcd_recipes.election.inspection import resign_leader

        ended = await resign_leader(client, f"{prefix}/election")
        print("nobody led" if ended is None else f"{ended.client_id} resigned")
    """
    record = await leader_record(client, path)
    if record is None or (fencing_token is not None and record.fencing_token != fencing_token):
        return None
    if record.lease_id:
        try:
            await client.lease_revoke(record.lease_id)
        except LeaseNotFoundError:
            return None  # the term ended meanwhile
        return record
    ended = await client.txn(
        [Cmp.create_revision(record.key) == record.fencing_token], [Op.delete(record.key)]
    )
    return record if ended.succeeded else None
