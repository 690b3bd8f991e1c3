"""Pass-throughs to etcd's own election service (``v3election``: ``etcdctl elect``, Go's
``concurrency.Election``): :func:`election_campaign`, :func:`election_proclaim`,
:func:`election_leader`, :func:`election_observe`, :func:`election_resign`. Each delegates to
the :class:`~etcd_recipes.EtcdClient` method of the same name (the typed call for the service);
the leadership they pass around is :class:`~etcd_recipes.ElectionLeaderKey`.

Guaranteed: what etcd's service guarantees -- one leader key per name at a time (the oldest
campaign key wins), and a cancelled or timed-out :func:`election_campaign` deletes its key.
Not guaranteed: leadership lasts as long as the lease *you* keep alive; nothing here watches
for its loss or fences writes for you -- prefer :class:`~etcd_recipes.LeaderSelector` /
:class:`~etcd_recipes.LeaderLatch`. This layout (``<name>/<lease hex>``) is etcd's, not the
Kotlin library's: these calls do not interoperate with the recipes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..client import check_client
from ..types import ElectionLeaderKey, KeyValue

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "election_campaign",
    "election_leader",
    "election_observe",
    "election_proclaim",
    "election_resign",
]


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
    return await check_client(client).election_campaign(name, value, lease=lease, timeout=timeout)


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
    await check_client(client).election_proclaim(leader, value)


async def election_leader(client: EtcdClient, name: bytes | str) -> KeyValue | None:
    """The current leader's key and proclaimed value for ``name``, or ``None`` without one.

    Example::

        from etcd_recipes import election_leader

        kv = await election_leader(client, f"{prefix}/jobs")
        print(kv.text if kv else "no leader")  # no leader: nobody campaigned
    """
    return await check_client(client).election_leader(name)


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
    async for kv in check_client(client).election_observe(name):
        yield kv


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
    await check_client(client).election_resign(leader)
