"""Pass-throughs to etcd's own election service (``v3election``: ``etcdctl elect``, Go's
``concurrency.Election``): :func:`election_campaign`, :func:`election_proclaim`,
:func:`election_leader`, :func:`election_observe`, :func:`election_resign`.

Guaranteed: what etcd's service guarantees -- one leader key per name at a time (the oldest
campaign key wins), and a cancelled or timed-out :func:`election_campaign` deletes its key.
Not guaranteed: leadership lasts as long as the lease *you* keep alive; nothing here watches
for its loss or fences writes for you -- prefer :class:`~etcd_recipes.LeaderSelector` /
:class:`~etcd_recipes.LeaderLatch`. This layout (``<name>/<lease hex>``) is etcd's, not the
JVM library's: these calls do not interoperate with the recipes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.keys import key_bytes
from .._core.txn import Cmp, Op
from .._core.validate import check_lease_id
from .._core.waiting import abort_guard
from .._proto_election import MESSAGES
from .._proto_election.calls import stream as _election_stream
from .._proto_election.calls import unary as _election_unary
from ..codecs import to_bytes
from ..errors import EtcdServerError, EtcdTimeoutError
from ..types import KeyValue

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "ElectionLeaderKey",
    "election_campaign",
    "election_leader",
    "election_observe",
    "election_proclaim",
    "election_resign",
]


@dataclass(frozen=True)
class ElectionLeaderKey:
    """The leadership returned by :func:`election_campaign` (etcd's ``LeaderKey``): pass it to
    :func:`election_proclaim` and :func:`election_resign`.

    ``key`` is ``<name>/<lease id in hex>``; ``revision`` its create revision (a fencing
    token: guard writes with ``Cmp.create_revision(key) == revision``).

    Example::

        from etcd_recipes import election_campaign, election_resign

        async with client.lease(10) as lease:
            leader = await election_campaign(client, f"{prefix}/jobs", "node-1", lease=lease.id)
            print(leader.key, leader.revision)  # b'/doc/.../jobs/<lease hex>' <revision>
            await election_resign(client, leader)
    """

    name: bytes
    key: bytes
    revision: int
    lease: int


def _leader_key_pb(client: EtcdClient, leader: ElectionLeaderKey) -> Any:
    return MESSAGES["LeaderKey"](
        name=client._k(leader.name),
        key=client._k(leader.key),
        rev=leader.revision,
        lease=leader.lease,
    )


async def election_campaign(
    client: EtcdClient,
    name: bytes | str,
    value: bytes | str,
    *,
    lease: int,
    timeout: float | None = None,
) -> ElectionLeaderKey:
    """Campaign in etcd's election service (``etcdctl elect``, Go's ``concurrency.Election``):
    blocks until this campaign leads ``name``, with ``value`` proclaimed.

    ``lease`` must be a live lease you keep alive (``client.lease(ttl)``); leadership ends when
    it does. ``timeout`` bounds the wait (:class:`~etcd_recipes.errors.EtcdTimeoutError`).
    Cancelled or timed out, the campaign's key ``<name>/<lease hex>`` is deleted.
    Prefer :class:`LeaderSelector` / :class:`LeaderLatch`, which manage leases, loss and fencing.

    Example::

        from etcd_recipes import election_campaign, election_leader, election_resign

        async with client.lease(10) as lease:
            leader = await election_campaign(client, f"{prefix}/jobs", "node-1", lease=lease.id)
            kv = await election_leader(client, f"{prefix}/jobs")
            assert kv is not None and kv.text == "node-1"
            await election_resign(client, leader)
    """
    check_lease_id(lease, what="election_campaign()")
    raw_name = key_bytes(name)
    own_key = raw_name + b"/" + f"{lease:x}".encode()
    request = MESSAGES["CampaignRequest"](
        name=client._k(raw_name), lease=lease, value=to_bytes(value)
    )

    async def withdraw() -> None:
        await client.txn([Cmp.lease(own_key) == lease], [Op.delete(own_key)])

    async with abort_guard(withdraw, what=f"election_campaign({raw_name!r}): withdraw"):
        try:
            resp = await _election_unary(
                client, "Campaign", request, op="election_campaign", retry=False, timeout=timeout
            )
        except EtcdServerError as exc:
            if "deadline exceeded" in exc.details.lower():
                raise EtcdTimeoutError(
                    f"election_campaign({raw_name!r}): not elected within {timeout}s"
                ) from exc
            raise
    leader = resp.leader
    return ElectionLeaderKey(
        client._strip(bytes(leader.name)),
        client._strip(bytes(leader.key)),
        int(leader.rev),
        int(leader.lease),
    )


async def election_proclaim(
    client: EtcdClient, leader: ElectionLeaderKey, value: bytes | str
) -> None:
    """Publish a new ``value`` for a leadership won with :func:`election_campaign`.

    Raises :class:`~etcd_recipes.errors.NotLeaderError` if that leadership is over.

    Example::

        from etcd_recipes import election_campaign, election_leader, election_proclaim

        async with client.lease(10) as lease:
            leader = await election_campaign(client, f"{prefix}/jobs", "node-1", lease=lease.id)
            await election_proclaim(client, leader, "node-1 (draining)")
            kv = await election_leader(client, f"{prefix}/jobs")
            assert kv is not None and kv.text == "node-1 (draining)"
    """
    request = MESSAGES["ProclaimRequest"](
        leader=_leader_key_pb(client, leader), value=to_bytes(value)
    )
    await _election_unary(client, "Proclaim", request, op="election_proclaim")


async def election_leader(client: EtcdClient, name: bytes | str) -> KeyValue | None:
    """The current leader's key and proclaimed value for ``name``, or ``None`` without one.

    Example::

        from etcd_recipes import election_leader

        kv = await election_leader(client, f"{prefix}/jobs")
        print(kv.text if kv else "no leader")  # no leader: nobody campaigned
    """
    request = MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    try:
        resp = await _election_unary(client, "Leader", request, op="election_leader")
    except EtcdServerError as exc:
        if "election: no leader" in exc.details:
            return None
        raise
    return client._kv(resp.kv)


async def election_observe(client: EtcdClient, name: bytes | str) -> AsyncIterator[KeyValue]:
    """The leader of ``name`` (when there is one) and every later proclamation or new leader.

    etcd's ``Observe`` never reports that an election became vacant -- use
    :class:`LeaderObserver` for that. The stream is cancelled when the iteration stops.

    Example::

        import contextlib
        from etcd_recipes import election_campaign, election_observe

        async with client.lease(10) as lease:
            await election_campaign(client, f"{prefix}/jobs", "node-1", lease=lease.id)
            async with contextlib.aclosing(election_observe(client, f"{prefix}/jobs")) as kvs:
                async for kv in kvs:
                    print(kv.key, kv.text)  # the current leader first: ... node-1
                    break
    """
    request = MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    async for resp in _election_stream(client, "Observe", request, op="election_observe"):
        yield client._kv(resp.kv)


async def election_resign(client: EtcdClient, leader: ElectionLeaderKey) -> None:
    """Give up a leadership won with :func:`election_campaign` (deletes its key; the next
    campaigner, if any, is elected). Resigning an ended leadership is a no-op.

    Example::

        from etcd_recipes import election_campaign, election_leader, election_resign

        async with client.lease(10) as lease:
            leader = await election_campaign(client, f"{prefix}/jobs", "node-1", lease=lease.id)
            await election_resign(client, leader)
            assert await election_leader(client, f"{prefix}/jobs") is None
    """
    request = MESSAGES["ResignRequest"](leader=_leader_key_pb(client, leader))
    await _election_unary(client, "Resign", request, op="election_resign")
