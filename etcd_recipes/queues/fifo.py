"""A FIFO queue that hands each item out **at most once**: :class:`DistributedQueue`.

:Status: Beta

**At most once -- read this first.** A take deletes the item in the same transaction that hands
it to you: once ``dequeue()`` returns, etcd keeps no copy. If your process dies before it has
processed the item, the item is gone. That is the contract of this queue and of
:class:`~etcd_recipes.DistributedPriorityQueue` (Curator's and the Kotlin library's queues behave
the same), and the right trade when items are cheap or replayable. When an item must survive
its consumer, use :class:`~etcd_recipes.DistributedWorkQueue`, which claims instead of
deleting.

Key layout (shared with the Kotlin library; ``<p>`` is the queue path without a trailing ``/``):
``<p>/<millis%019d>-<r3>``; a batch ``<p>/<millis%019d>-<index%05d>-<r3>`` (one shared
``millis``), written in one transaction. Ordered by **mod revision** -- etcd's commit order,
not the client clock -- and, within a batch (one revision), by key, i.e. argument order. A take
is ``If(mod_revision(head) == observed) Then(delete head)`` -- under contention ``Else`` the
same for the next item read, nested (see below).

Performance notes: a head read makes etcd fetch the whole queue (it sorts by revision
server-side), so a consumer reads a window of items and serves several takes from it -- valid
because new items only ever join at the tail; a lone consumer sends one plain
compare-and-delete per take, and the nested chain grows only while other consumers win races.

Guarantees:

* exactly one consumer gets each item, however many race for it: a take deletes the head
  guarded on its mod revision. A consumer that loses the race moves on to the next item still
  present, in queue order, within the same transaction (nested compares over the first few
  items it read); when none is left, the transaction's failure branch re-reads the head and
  the take retries in a loop -- no recursion, no new watch per retry;
* with one consumer, items come out in commit order, a batch in argument order (also beyond
  12 items, where etcd's own sort of equal revisions is unstable: ties are broken by key here);
* ``enqueue_all`` is atomic: the whole batch becomes visible at one revision, or nothing does;
* an empty queue is waited on with a watch anchored at or before the empty read's revision +
  1 (one watch per client and queue path, shared by every consumer parked on it), so an item
  enqueued in between is never missed; after waking, the true head is re-read (the first put
  seen is not necessarily the head); the wait survives server restarts and compaction;
* cancelling ``dequeue()`` or ``poll()`` (task cancel, ``anyio.fail_after``, ``asyncio.timeout``,
  Ctrl-C in the sync facade) consumes nothing: a take whose delete was already in flight puts
  the item back under its key (it then sorts after what was enqueued before the put-back);
* values are ``bytes`` by default (``str`` is UTF-8 encoded), or any ``T`` through ``codec=``.
* with a codec, a take decodes the head **before** it commits: a value that does not decode
  raises :class:`~etcd_recipes.errors.CodecError` naming its key and stays where it is (never
  lost; a queue on the same path without a codec takes it raw, to inspect or drop);
* every ``enqueue``/``enqueue_all`` and every take (``dequeue``, ``try_dequeue``, ``poll``)
  reports one ``queue_operation`` event to the client's metrics hook (``name``: the
  ``metrics_name`` given), with one outcome (``ok``, ``empty``, ``timeout``, ``cancelled``,
  ``error``) and a ``queue.enqueue`` / ``queue.receive`` span (the path: a span attribute
  only, never a label); a wait that got an item also reports the v1 latency
  ``"queue.dequeue"``.

Not guaranteed:

* **delivery**: an item is lost when its consumer dies after the take (at most once);
* a global order across several consumers: each take gets the head of its moment, so two
  consumers may finish items in either order;
* ``size()`` is one count read, already stale when it returns.

Deviations from the Kotlin library: prefix reads and watches use a trailing ``/``; producers write
with a create-only compare, so two producers that draw the same key in the same millisecond
cannot overwrite each other (a plain put could silently lose an item).

Example::

    from etcd_recipes import DistributedQueue

    async with DistributedQueue(client, f"{prefix}/orders") as queue:
        await queue.enqueue(b"order-1")
        assert await queue.dequeue() == b"order-1"
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, overload

from .._core.keys import append_to_path, pad, random_token
from .._core.txn import GetOp
from ..codecs import Codec, ValueT
from ..errors import RecipeClosedError
from ..types import KeyValue, RangeResult
from ._metering import Metered, batch_size
from ._produce import check_batch, create, key_millis
from ._take import TakeQueue

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedQueue"]


class DistributedQueue(TakeQueue[ValueT], Generic[ValueT]):
    """A FIFO queue ordered by etcd's commit order; each item is handed out at most once.

    Values are ``bytes`` (``str`` is accepted and UTF-8 encoded); pass ``codec=`` to make the
    queue carry any ``T``. No ``start()`` is needed; ``async with`` works and closing releases
    nothing (the queue holds no lease). ``metrics_name`` is the ``name`` label of its metrics
    (low-cardinality: never a path or an id).

    Example::

        from etcd_recipes import JSON, DistributedQueue

        async with DistributedQueue(client, f"{prefix}/orders", codec=JSON) as orders:
            await orders.enqueue({"id": 1})
            await orders.enqueue_all([{"id": 2}, {"id": 3}])   # one transaction
            assert await orders.dequeue() == {"id": 1}
            assert await orders.poll(5.0) == {"id": 2}
            assert await orders.try_dequeue() == {"id": 3}
            assert await orders.try_dequeue() is None          # empty: at once
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[ValueT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, codec=codec, client_id=client_id, metrics_name=metrics_name)

    # Items only ever join a FIFO queue at its tail (a new commit has a higher revision), so
    # the first still-present item of an earlier window is still the head: a window serves
    # several takes, and the ordering read (etcd fetches the whole queue to sort it by
    # revision) is paid once per window, not once per take.
    _cacheable = True

    # A deep queue makes each ordering read dearer (etcd fetches and sorts every key: 86 ms at
    # 100,000 keys): the window grows with the depth the last read counted, so the read's
    # share of a take stays about flat (a 1,024-key window of names is ~40 KB; values, read
    # only with a codec, are capped lower).
    _depth = 0

    def _limit(self) -> int:
        most = 1024 if self.codec is None else 256
        return max(self._read_limit, min(most, self._depth // 64))

    def _observe(self, op: GetOp, read: RangeResult) -> GetOp | None:
        self._depth = read.count
        return None

    async def _window(self, read: RangeResult) -> list[KeyValue]:
        """The head items in queue order: by revision, then key (a batch: argument order).

        etcd sorts equal revisions unstably beyond 12 items, so order is fixed here; when the
        read ends inside the first revision's group, the group is read in full; a later group
        the read may have cut short is left out.
        """
        kvs = read.kvs
        limit = len(kvs)
        while read.more and kvs and kvs[-1].mod_revision == kvs[0].mod_revision:
            limit = 0 if limit >= 1024 else limit * 16
            read = await self._read_head(limit)
            kvs = read.kvs
        kvs = sorted(kvs, key=lambda kv: (kv.mod_revision, kv.key))
        if read.more:
            kvs = [kv for kv in kvs if kv.mod_revision < kvs[-1].mod_revision]
        return kvs

    def __aiter__(self) -> DistributedQueue[ValueT]:
        """``async for value in queue:`` takes items forever, as :meth:`dequeue` does (ends
        when the queue is closed); a cancelled loop consumes nothing.

        Example::

            from etcd_recipes import DistributedQueue

            async with DistributedQueue(client, f"{prefix}/orders") as orders:
                await orders.enqueue_all([b"a", b"b"])
                async for order in orders:      # takes forever; break to stop
                    if order == b"b":
                        break
        """
        return self

    async def __anext__(self) -> ValueT:
        try:
            return await self.dequeue()
        except RecipeClosedError:
            raise StopAsyncIteration from None

    @overload
    async def enqueue(self: DistributedQueue[bytes], value: bytes | str) -> None: ...
    @overload
    async def enqueue(self, value: ValueT) -> None: ...
    async def enqueue(self, value: Any) -> None:
        """Append ``value`` (one transaction; its commit revision is its place in the queue).

        Example::

            from etcd_recipes import DistributedQueue

            queue = DistributedQueue(client, f"{prefix}/orders")
            await queue.enqueue(b"order-1")
            await queue.enqueue("order-2")           # str: stored UTF-8 encoded
            assert await queue.dequeue() == b"order-1"
        """
        self._check_open()
        data = self._encode(value)

        def key() -> list[str]:
            return [append_to_path(self.path, f"{pad(key_millis(), 19)}-{random_token(3)}")]

        with Metered(self._meter, "enqueue", self.path):
            await create(self._client, key, [data])

    @overload
    async def enqueue_all(self: DistributedQueue[bytes], values: Iterable[bytes | str]) -> None: ...
    @overload
    async def enqueue_all(self, values: Iterable[ValueT]) -> None: ...
    async def enqueue_all(self, values: Iterable[Any]) -> None:
        """Append every value in **one** transaction: all become visible at the same revision,
        in argument order, or none does. An empty iterable is a no-op.

        The server bounds a transaction (``--max-txn-ops``, 128 by default): a larger batch
        raises :class:`~etcd_recipes.errors.TooManyOperationsError` with nothing written.

        Example::

            from etcd_recipes import DistributedQueue

            queue = DistributedQueue(client, f"{prefix}/batch")
            await queue.enqueue_all([b"a", b"b", b"c"])
            assert [await queue.dequeue() for _ in range(3)] == [b"a", b"b", b"c"]
        """
        self._check_open()
        data = [self._encode(v) for v in check_batch(values)]
        if not data:
            return

        def keys() -> list[str]:
            millis = pad(key_millis(), 19)
            return [
                append_to_path(self.path, f"{millis}-{pad(i, 5)}-{random_token(3)}")
                for i in range(len(data))
            ]

        with Metered(self._meter, "enqueue", self.path, **batch_size(len(data))):
            await create(self._client, keys, data)
