"""What a work queue knows and does about one item by its id, and its counts (not public; a
base of :class:`~etcd_recipes.DistributedWorkQueue`, whose methods these are): ``size()``,
``status(id)``, ``cancel(id)`` and the dead letters' operator surface.

Guaranteed: ``cancel()`` removes an item only while it waits (ready or delayed), in one
transaction guarded on its key still being there, so it never races a claim: an item a
consumer claimed first is reported as not cancelled (it is in flight: it may still be acked,
or come back). ``status()`` is one read transaction (plus, for an id found nowhere else, one
keys-only read of the delayed items, where an item requeued with a delay waits under its ready
time). Not guaranteed: that a status still holds when it is returned (advisory, like
``size()``), or that ``size()`` is cheap on a deep queue (an exact count: etcd visits every
key).
"""

from __future__ import annotations

from typing import Generic

from .._core.txn import AnyOp, Cmp, Op
from .._recipe.recipe import Recipe
from ..codecs import Codec, ValueT
from ..types import KeyValue, RangeResult
from ._layout import WorkKeys, check_id, item_name
from .dead_letters import DeadLetter, _list_dead, _purge_dead, _requeue_dead
from .item import ItemState


class ItemControl(Recipe, Generic[ValueT]):
    """The by-id reads and writes of a work queue (see the module docstring)."""

    codec: Codec[ValueT] | None
    _keys: WorkKeys

    async def size(self) -> int:
        """How many items wait to be received (not delayed, in flight or dead): one count read,
        advisory.

        Example::

            from etcd_recipes import DistributedWorkQueue

            queue = DistributedWorkQueue(client, f"{prefix}/jobs")
            await queue.enqueue(b"job")
            print("backlog:", await queue.size())            # backlog: 1
        """
        self._check_open()
        return await self._client.count(self._keys.items)

    # ------------------------------------------------------------------ dead letters

    async def dead_letters(self) -> list[DeadLetter[ValueT]]:
        """The dead-lettered items, oldest id first, with their reasons (one read): orphans
        of their last allowed delivery, items a worker gave up on, undecodable payloads.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"poison")
                await (await queue.receive()).dead_letter("cannot parse")
                for dead in await queue.dead_letters():
                    print(f"{dead.id} after {dead.attempts} attempt(s): {dead.reason}")
        """
        self._check_open()
        return await _list_dead(self._client, self._keys, self.codec)

    async def requeue_dead_letter(self, item_id: str) -> bool:
        """Put a dead letter back in the queue (at its original place) with a fresh attempt
        count; ``False`` if there is no such dead letter.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                item_id = await queue.enqueue(b"poison")
                await (await queue.receive()).dead_letter("bug #12")
                assert await queue.requeue_dead_letter(item_id) is True  # fixed: replay it
                assert (await queue.receive()).attempt == 1             # a fresh count
                assert await queue.requeue_dead_letter(item_id) is False
        """
        self._check_open()
        return await _requeue_dead(self._client, self._keys, check_id(item_id))

    async def purge_dead_letter(self, item_id: str) -> bool:
        """Delete a dead letter for good; ``False`` if there is no such dead letter.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                for dead in await queue.dead_letters():
                    await queue.purge_dead_letter(dead.id)
                assert await queue.purge_dead_letter("0001700000000000-abc") is False
        """
        self._check_open()
        return await _purge_dead(self._client, self._keys, check_id(item_id))

    async def status(self, item_id: str) -> ItemState | None:
        """Where the item ``item_id`` is (see :data:`ItemState`), or ``None`` when the queue
        does not hold it (acknowledged, cancelled, purged, or never enqueued); advisory.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                item_id = await queue.enqueue(b"job")
                assert await queue.status(item_id) == "ready"
                item = await queue.receive()
                assert await queue.status(item_id) == "in_flight"
                await item.ack()
                assert await queue.status(item_id) is None
        """
        name = check_id(item_id)
        self._check_open()
        keys = self._keys
        parts = (keys.items, keys.claimed, keys.dlq, keys.delayed)
        found = await self._client.txn([], [Op.get(p + name, keys_only=True) for p in parts])
        states: tuple[ItemState, ...] = ("ready", "in_flight", "dead", "delayed")
        for state, read in zip(states, found.responses):
            if isinstance(read, RangeResult) and read.kvs:
                return state
        return "delayed" if await self._requeued_late(name) is not None else None

    async def cancel(self, item_id: str) -> bool:
        """Remove the waiting item ``item_id`` (ready or delayed) for good; ``False`` when it
        is not waiting -- in flight (a consumer claimed it first: it may still be acked or
        come back), dead-lettered (see :meth:`purge_dead_letter`) or unknown. One
        transaction, guarded on the item's key: it never races a claim.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                item_id = await queue.enqueue(b"report", delay=3600)
                assert await queue.cancel(item_id) is True      # gone before it matured
                assert await queue.cancel(item_id) is False     # nothing left to cancel
                other = await queue.enqueue(b"job")
                item = await queue.receive()
                assert await queue.cancel(other) is False       # in flight: not cancelled
                await item.ack()
        """
        name = check_id(item_id)
        self._check_open()
        keys = self._keys
        for key in (keys.items + name, keys.delayed + name):
            result = await self._client.txn([Cmp.exists(key)], self._forget(key, name))
            if result.succeeded:
                return True
        late = await self._requeued_late(name)
        if late is None:
            return False
        guard = [Cmp.mod_revision(late.key) == late.mod_revision]
        return (await self._client.txn(guard, self._forget(late.key, name))).succeeded

    def _forget(self, key: bytes | str, name: str) -> list[AnyOp]:
        keys = self._keys
        return [Op.delete(key), Op.delete(keys.attempts + name), Op.delete(keys.trace + name)]

    async def _requeued_late(self, name: str) -> KeyValue | None:
        """The delayed key of item ``name`` requeued with a delay (``<ready>-<id>``): a
        keys-only read of the delayed items (as long as they are many)."""
        tail = ("-" + name).encode()
        read = await self._client.range(self._keys.delayed, prefix=True, keys_only=True)
        return next((kv for kv in read.kvs if item_name(kv.key).encode().endswith(tail)), None)
