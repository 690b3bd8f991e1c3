"""Pass-throughs to etcd's own lock service (v3lock ``Lock``/``Unlock``), through
:meth:`EtcdClient.lock <etcd_recipes.EtcdClient.lock>`. Prefer
:class:`~etcd_recipes.DistributedMutex` (same key layout, herd-free waits, loss reported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..client import check_client

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["server_lock", "server_unlock"]


async def server_lock(
    client: EtcdClient, name: str | bytes, lease_id: int, *, timeout: float | None = None
) -> bytes:
    """Acquire ``name`` through etcd's own lock service (the v3lock ``Lock`` RPC).

    The server queues ``<name>/<lease id in hex>`` and answers once it owns the lock; the key
    returned lives while the lease does. Keep ``lease_id`` alive yourself (for example with
    ``client.lease(ttl)``) and give the key to :func:`server_unlock`. On timeout (or
    cancellation) the waiter key is removed and :class:`LockTimeoutError` raised.

    Prefer :class:`DistributedMutex` (same key layout): the server-side wait hands a contended
    lock over at most about every 100 ms, and loss is not reported.

    Example::

        from etcd_recipes import server_lock, server_unlock

        async with client.lease(10) as lease:
            key = await server_lock(client, f"{prefix}/job", lease.id, timeout=5)
            try:
                print(key)  # <name>/<lease id in hex>
            finally:
                await server_unlock(client, key)
    """
    return await check_client(client).lock(name, lease_id, timeout=timeout)


async def server_unlock(client: EtcdClient, key: str | bytes) -> None:
    """Release a lock taken with :func:`server_lock` (the v3lock ``Unlock`` RPC: it deletes
    ``key``). Idempotent.

    Example::

        from etcd_recipes import server_lock, server_unlock

        async with client.lease(10) as lease:
            key = await server_lock(client, f"{prefix}/job", lease.id)
            await server_unlock(client, key)
            await server_unlock(client, key)  # idempotent
    """
    await check_client(client).unlock(key)
