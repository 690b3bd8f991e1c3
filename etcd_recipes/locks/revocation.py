"""Cooperative revocation (Curator's ``Revocable``): :func:`request_revoke` asks the holder of
a mutex to give it back; the holder hears of it through the revocation listeners of its
:class:`~etcd_recipes.DistributedMutex` (``add_revocation_listener``) and decides when to
release.

Layout: the request is the holder key's **value**. The holder key
(``<path>/<lease id in hex>``, empty) is re-written with the value ``__REVOKE__`` (Curator's
marker), on its own lease and only while it is the same key (``create_revision`` compared), so
its create revision -- the fencing token and the place in line -- and its lease do not change.
No other key is written: a key of its own under ``<path>/`` would be a contender to every
mutex on the path. ``etcd-recipes lock show`` / ``lock ls`` still list the holder (its
``value`` reads ``__REVOKE__``), ``lock break`` still revokes its lease; mutex waiters
(Python, Go, ``etcdctl lock``) wait for the key's deletion and ignore the write.

Guaranteed: a request reaches only the holder it read (a holder that released meanwhile is
not asked, nor its successor); nothing is released by the request itself.

Not guaranteed: the holder must have registered a revocation listener **before** it acquired
(a holder without one -- another process, ``etcdctl lock``, Go -- ignores requests), and it
decides whether and when to release; a request is heard once per hold. Only the mutex layout
is revocable (not read-write locks, semaphores or multi-locks).

Example::

    import asyncio

    from etcd_recipes import DistributedMutex
    from etcd_recipes.locks.revocation import request_revoke

    mutex = DistributedMutex(client, f"{prefix}/report-lock")
    asked = asyncio.Event()
    mutex.add_revocation_listener(lambda holder: asked.set())
    async with mutex:
        print((await request_revoke(client, f"{prefix}/report-lock")) is not None)  # True
        await asyncio.wait_for(asked.wait(), 5)
        print(mutex.revocation_requested)  # True: finish up, then leave the block
    await mutex.aclose()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.txn import Cmp, Op
from ..errors import InvalidArgumentError
from ._revoke import REVOKE_VALUE
from .hold import LockParticipant
from .inspection import mutex_state

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["REVOKE_VALUE", "request_revoke"]


async def request_revoke(client: EtcdClient, path: str) -> LockParticipant | None:
    """Ask the holder of the mutex at ``path`` to release it: the holder it asked, or ``None``
    when nobody holds it (or the holder released before the request landed). Raises
    :class:`~etcd_recipes.errors.InvalidArgumentError`, writing nothing, when ``<path>/`` also
    holds keys outside the lock layout (it is not a lock).

    Example::

        from etcd_recipes.locks.revocation import request_revoke

        print(await request_revoke(client, f"{prefix}/nobody-holds-this"))  # None
    """
    state = await mutex_state(client, path)
    if state.foreign:
        raise InvalidArgumentError(
            f"{path} is not a lock: {len(state.foreign)} key(s) under it are outside the lock "
            "layout (<path>/<lease hex> on that lease)"
        )
    holder = state.holder
    if holder is None:
        return None
    asked = await client.txn(
        [Cmp.create_revision(holder.key) == holder.create_revision],
        [Op.put(holder.key, REVOKE_VALUE, lease=holder.lease_id)],
    )
    if not asked.succeeded:
        return None
    return LockParticipant(holder.key, holder.lease_id, holder.create_revision, True, REVOKE_VALUE)
