"""A distributed atomic counter.

:Status: Beta

Key layout (shared with the Kotlin library): the key ``<path>`` holds the value as an **8-byte
big-endian signed integer**, with no lease (the counter is durable; closing deletes nothing).

Guarantees: each mutation is a compare-and-swap on the key's mod revision, retried with bounded
random jitter on conflict, and returns the value **this call committed** -- so N concurrent
increments from 0 return exactly ``{1..N}``. The key is created lazily with ``default`` by the
first caller that finds it missing; whoever creates it decides the default.
``compare_and_set(expected, new)`` writes only if the value is ``expected`` at commit time (one
transaction comparing the stored bytes).

Not guaranteed: ``get()`` is a plain read, already stale when it returns; values outside the
int64 range are rejected rather than wrapped.

Example::

    from etcd_recipes import DistributedAtomicLong

    async with DistributedAtomicLong(client, f"{prefix}/orders") as counter:
        order_no = await counter.increment()
        assert order_no == 1          # the key was created with default 0
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from ._core.txn import Cmp, Op
from ._core.validate import INT64_MAX, check_int64, check_path
from ._recipe.recipe import Recipe
from .client import check_client
from .codecs import INT64
from .errors import InvalidArgumentError
from .types import RangeResult

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = ["DistributedAtomicLong"]

_MAX_BACKOFF = 1.0


class DistributedAtomicLong(Recipe):
    """A 64-bit counter shared through etcd.

    Example::

        from etcd_recipes import DistributedAtomicLong

        counter = DistributedAtomicLong(client, f"{prefix}/visits", default=100)
        print(await counter.add(5))   # 105 if this call created the key
        assert await counter.decrement() == 104
        await counter.aclose()

    ``start()`` is optional: every operation creates the key when it is missing.
    ``metrics_name`` is the ``name`` label of its metrics (low-cardinality; ``""``: none); a
    counter reports only its RPCs (``rpc_finished``), which carry no recipe label.
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        default: int = 0,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.default: int = check_int64(default, what="default")

    async def _do_start(self) -> None:
        await self._create_if_missing()

    async def _create_if_missing(self) -> RangeResult:
        """Create the key with the default if missing; return the current key-value read."""
        result = await self._client.txn(
            [Cmp.missing(self.path)],
            [Op.put(self.path, INT64.encode(self.default)), Op.get(self.path)],
            [Op.get(self.path)],
        )
        read = result.responses[-1]
        assert isinstance(read, RangeResult)
        return read

    async def get(self) -> int:
        """The current value (advisory). Creates the key with the default when missing."""
        self._check_open()
        kv = await self._client.get(self.path)
        if kv is None:
            read = await self._create_if_missing()
            kv = read.kvs[0]
        return INT64.decode(kv.value)

    async def increment(self) -> int:
        """Add 1; returns the value this call committed."""
        return await self.add(1)

    async def decrement(self) -> int:
        """Subtract 1; returns the value this call committed."""
        return await self.add(-1)

    async def subtract(self, delta: int) -> int:
        """Subtract ``delta``; returns the value this call committed."""
        return await self.add(-check_int64(delta, what="delta", minimum=-INT64_MAX))

    async def add(self, delta: int) -> int:
        """Add ``delta`` (may be negative); returns the value this call committed.

        Raises :class:`~etcd_recipes.errors.InvalidArgumentError` if the result would leave the
        int64 range.
        """
        check_int64(delta, what="delta")
        self._check_open()
        kv = await self._client.get(self.path)
        if kv is None:
            kv = (await self._create_if_missing()).kvs[0]
        conflicts = 0
        while True:
            new = INT64.decode(kv.value) + delta
            if not INT64.MIN <= new <= INT64.MAX:
                raise InvalidArgumentError(
                    f"{self.exception_context}: {INT64.decode(kv.value)} + {delta} leaves the "
                    "int64 range"
                )
            result = await self._client.txn(
                [Cmp.mod_revision(self.path) == kv.mod_revision],
                [Op.put(self.path, INT64.encode(new))],
                [Op.get(self.path)],
            )
            if result.succeeded:
                return new
            read = result.responses[0]
            assert isinstance(read, RangeResult)
            if not read.kvs:  # deleted under us: re-create and go again
                read = await self._create_if_missing()
            kv = read.kvs[0]
            conflicts += 1
            await asyncio.sleep(random.uniform(0, min(_MAX_BACKOFF, conflicts * 0.01)))

    async def compare_and_set(self, expected: int, new: int) -> bool:
        """Set the value to ``new`` only if it is ``expected`` now: one transaction comparing
        the stored bytes (a missing key is created with the default first). ``False``: the
        value was not ``expected``; nothing was written.

        Example::

            from etcd_recipes import DistributedAtomicLong

            async with DistributedAtomicLong(client, f"{prefix}/slots", default=5) as counter:
                assert await counter.compare_and_set(5, 4)
                assert not await counter.compare_and_set(5, 3)  # it is 4 now
                assert await counter.get() == 4
        """
        check_int64(expected, what="expected")
        check_int64(new, what="new")
        self._check_open()
        for _ in range(2):  # a second round only after creating a missing key
            result = await self._client.txn(
                [Cmp.value(self.path) == INT64.encode(expected)],
                [Op.put(self.path, INT64.encode(new))],
                [Op.get(self.path)],
            )
            if result.succeeded:
                return True
            read = result.responses[0]
            assert isinstance(read, RangeResult)
            if read.kvs:  # a value compare fails on a missing key: only then try again
                return False
            await self._create_if_missing()
        return False

    @staticmethod
    async def delete(client: EtcdClient, path: str) -> bool:
        """Delete the counter's key; True if it existed.

        Example::

            from etcd_recipes import DistributedAtomicLong

            async with DistributedAtomicLong(client, f"{prefix}/visits") as counter:
                await counter.increment()
            assert await DistributedAtomicLong.delete(client, f"{prefix}/visits") is True
            assert await DistributedAtomicLong.delete(client, f"{prefix}/visits") is False
        """
        return (await check_client(client).delete(check_path(path))).deleted > 0
