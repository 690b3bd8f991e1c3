"""A priority queue that hands each item out **at most once**: :class:`DistributedPriorityQueue`
(lowest priority number first, FIFO within a priority).

:Status: Beta

**At most once**, as :class:`~etcd_recipes.DistributedQueue`: a take deletes the item in the
transaction that hands it to you, so an item is lost when its consumer dies after the take.
Use :class:`~etcd_recipes.DistributedWorkQueue` when an item must survive its consumer.

Key layout (shared with the Kotlin library; ``<p>`` is the queue path without a trailing ``/``):
``<p>/<priority%05d>/<seq%016d>``, ordered by key: lower priority number first, FIFO within a
priority. The guard key ``__<p>/<priority%05d>`` (value ``""``, outside ``<p>/``) serialises
producers of one priority: ``If(mod_revision(guard) < read_revision + 1) Then(put guard, put
item)``, retried up to 50 times. A take is ``If(mod_revision(head) == observed) Then(delete
head)`` -- under contention ``Else`` the same for the next item of the same priority, nested.

Guarantees:

* exactly one consumer gets each item, however many race for it (the take side is the FIFO
  queue's, see :mod:`etcd_recipes.queues.fifo`);
* with one consumer, items come out by priority, then in enqueue order within a priority;
* an empty queue is waited on with a watch anchored at the empty read's revision + 1, so an
  item enqueued in between is never missed;
* cancelling ``dequeue()`` or ``poll()`` consumes nothing: a take whose delete was already in
  flight puts the item back under its key, where it keeps its place;
* a priority outside 0..65535 (or not an ``int``) raises :class:`InvalidPriorityError` with
  nothing written;
* values are ``bytes`` by default (``str`` is UTF-8 encoded), or any ``T`` through ``codec=``.
* with a codec, a take decodes the head **before** it commits: a value that does not decode
  raises :class:`~etcd_recipes.errors.CodecError` naming its key and stays where it is (never
  lost; a queue on the same path without a codec takes it raw, to inspect or drop);
* every ``enqueue``/``enqueue_all`` and every take (``dequeue``, ``try_dequeue``, ``poll``)
  reports one ``queue_operation`` event to the client's metrics hook (``name``: the
  ``metrics_name`` given), with one outcome (``ok``, ``empty``, ``timeout``, ``cancelled``,
  ``error``) and a ``queue.enqueue`` / ``queue.receive`` span (the path: a span attribute
  only, never a label); a wait that got an item also reports the v1 latency
  ``"priority_queue.dequeue"``.

Not guaranteed:

* **delivery** (at most once, see above);
* a global order across several consumers (a take that lost a race only ever moves on to an
  item of the same priority, never to a lower one);
* ``size()`` is one count read, already stale when it returns.

Deviations from the Kotlin library: prefix reads and watches use a trailing ``/``; a priority
outside 0..65535 raises :class:`InvalidPriorityError` instead of wrapping.

Example::

    from etcd_recipes import DistributedPriorityQueue

    async with DistributedPriorityQueue(client, f"{prefix}/jobs") as jobs:
        await jobs.enqueue(b"later", 9)
        await jobs.enqueue(b"first", 0)
        assert await jobs.dequeue() == b"first"
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING, Any, Generic, overload

from .._core.keys import append_to_path, pad
from .._core.logctx import library_logger
from .._core.txn import Cmp, GetOp, Op
from .._core.validate import check_duration, check_int_range
from ..codecs import Codec, ValueT
from ..errors import EtcdRecipeError, InvalidArgumentError, RecipeClosedError, RetriesExhaustedError
from ..types import KeyValue, RangeResult, SortOrder, SortTarget
from ._horizon import sequence_bound, shared_horizon
from ._metering import Metered
from ._take import TakeQueue

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["MAX_PRIORITY", "DistributedPriorityQueue", "InvalidPriorityError"]

log = library_logger("etcd_recipes.queue")

MAX_PRIORITY = 65535
"""The largest priority (priorities are stored as five digits; lower numbers are served first)."""

MAX_ENQUEUE_ATTEMPTS = 50
"""Compare-and-swap attempts of a priority enqueue before it gives up (the Kotlin library's)."""


class InvalidPriorityError(InvalidArgumentError):
    """A priority outside ``0..65535`` (or not an ``int``). Also a ``ValueError``.

    Example::

        from etcd_recipes import DistributedPriorityQueue, InvalidPriorityError

        queue = DistributedPriorityQueue(client, f"{prefix}/jobs")
        try:
            await queue.enqueue(b"job", 70000)
        except InvalidPriorityError as exc:
            print(exc)   # priority must be an int in 0..65535, got 70000 (...)
        else:
            raise AssertionError("70000 is out of range")
    """


class DistributedPriorityQueue(TakeQueue[ValueT], Generic[ValueT]):
    """A priority queue: the lowest priority number is served first, FIFO within a priority;
    each item is handed out at most once.

    ``minimum_wait_time`` (seconds, default 0) paces this instance's enqueues: each waits until
    that long has passed since the previous one, thinning out compare-and-swap contention on a
    busy priority. It is per instance, not a cluster-wide rate limit. Enqueues of one instance
    run one at a time. ``metrics_name`` is the ``name`` label of its metrics (low-cardinality:
    never a path or an id).

    Example::

        from etcd_recipes import DistributedPriorityQueue

        async with DistributedPriorityQueue(client, f"{prefix}/jobs") as jobs:
            await jobs.enqueue(b"nightly-report", 200)
            await jobs.enqueue(b"page-oncall", 1)
            assert await jobs.dequeue() == b"page-oncall"
            assert await jobs.dequeue() == b"nightly-report"
    """

    _metric = "priority_queue.dequeue"
    _read_limit = 8
    _chain = 8

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        minimum_wait_time: float = 0.0,
        codec: Codec[ValueT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, codec=codec, client_id=client_id, metrics_name=metrics_name)
        self.minimum_wait_time: float = check_duration(
            minimum_wait_time, what="minimum_wait_time", minimum=0.0, inclusive=True
        )
        """Seconds between two enqueues of this instance (0: no pacing)."""
        self._last_write = float("-inf")
        self._enqueue_lock = asyncio.Lock()
        prefix = self._prefix.encode()
        self._horizon = shared_horizon(client, self._prefix, sequence_bound(prefix))

    def __aiter__(self) -> DistributedPriorityQueue[ValueT]:
        """``async for value in queue:`` takes items forever, as :meth:`dequeue` does (ends
        when the queue is closed); a cancelled loop consumes nothing.

        Example::

            from etcd_recipes import DistributedPriorityQueue

            async with DistributedPriorityQueue(client, f"{prefix}/jobs") as jobs:
                await jobs.enqueue(b"later", 9)
                await jobs.enqueue(b"first", 0)
                async for job in jobs:          # takes forever; break to stop
                    if job == b"later":
                        break
        """
        return self

    async def __anext__(self) -> ValueT:
        try:
            return await self.dequeue()
        except RecipeClosedError:
            raise StopAsyncIteration from None

    @overload
    async def enqueue(
        self: DistributedPriorityQueue[bytes], value: bytes | str, priority: int
    ) -> None: ...
    @overload
    async def enqueue(self, value: ValueT, priority: int) -> None: ...
    async def enqueue(self, value: Any, priority: int) -> None:
        """Add ``value`` at ``priority`` (0..65535, lower first; FIFO within a priority).

        Raises :class:`InvalidPriorityError` for a priority out of range (nothing is written),
        and :class:`~etcd_recipes.errors.RetriesExhaustedError` if 50 compare-and-swap attempts
        in a row lose to other producers of the same priority.

        Example::

            from etcd_recipes import DistributedPriorityQueue, InvalidPriorityError

            queue = DistributedPriorityQueue(client, f"{prefix}/jobs")
            await queue.enqueue(b"page-oncall", 1)
            try:
                await queue.enqueue(b"too-low", 70000)
            except InvalidPriorityError:
                pass                                 # out of 0..65535: nothing written
            assert await queue.size() == 1
        """
        prio = check_int_range(
            priority, what="priority", minimum=0, maximum=MAX_PRIORITY, error=InvalidPriorityError
        )
        self._check_open()
        data = self._encode(value)
        bucket = append_to_path(self.path, pad(prio, 5))
        with Metered(self._meter, "enqueue", self.path, **{"etcd_recipes.queue.priority": prio}):
            await self._write(prio, data, "__" + bucket, bucket + "/")

    async def _write(self, prio: int, data: bytes, guard: str, children: str) -> None:
        """Write under the next sequence number of the bucket: the guard's value (the last
        sequence number written, kept there by every enqueue of this library) or -- for a guard
        without one (the Kotlin library writes ``""``), or when the key is taken all the
        same -- one read of the bucket's last key, as costly as the bucket is long."""
        last = Op.get(
            children,
            prefix=True,
            sort_target=SortTarget.KEY,
            sort_order=SortOrder.DESCEND,
            limit=1,
            keys_only=True,
        )
        async with self._enqueue_lock:
            pause = self._last_write + self.minimum_wait_time - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            scan = False  # read the bucket's last key instead of trusting the guard's value
            read = await self._client.txn([], [Op.get(guard)])
            for attempt in range(1, MAX_ENQUEUE_ATTEMPTS + 1):
                seq = None if scan else _guard_seq(read.responses[0])
                if seq is None:
                    read = await self._client.txn([], [Op.get(guard), last])
                    seq = self._next_seq(children, read.responses[1])
                key = f"{children}{pad(seq, 16)}"
                result = await self._client.txn(
                    [Cmp.mod_revision(guard) < read.revision + 1, Cmp.missing(key)],
                    [Op.put(guard, str(seq)), Op.put(key, data)],
                    [Op.get(guard)],
                )
                if result.succeeded:
                    self._last_write = time.monotonic()
                    return
                log.debug("%s: enqueue CAS lost (attempt %d)", self.exception_context, attempt)
                # The guard unchanged since the read: the key was taken by a writer that keeps
                # no sequence number in the guard -- find the bucket's true end.
                scan = _guard_revision(result.responses[0]) == _guard_revision(read.responses[0])
                read = result
                if attempt % 5 == 0:  # heavy contention: let the others through
                    await asyncio.sleep(random.uniform(0, 0.001 * attempt))
        raise RetriesExhaustedError(
            f"{self.exception_context}: failed to enqueue at priority {prio} after "
            f"{MAX_ENQUEUE_ATTEMPTS} attempts (other producers kept winning)",
            attempts=MAX_ENQUEUE_ATTEMPTS,
        )

    def _next_seq(self, children: str, found: Any) -> int:
        assert isinstance(found, RangeResult)
        if not found.kvs:
            return 0
        tail = found.kvs[0].key[len(children.encode()) :]
        try:
            return int(tail.split(b"/")[0]) + 1
        except ValueError:
            raise EtcdRecipeError(
                f"{self.exception_context}: unexpected key {found.kvs[0].key!r} in a priority "
                "bucket (expected <path>/<priority>/<16-digit sequence>)"
            ) from None

    def _head_op(self, limit: int) -> GetOp:
        # Key order (no sort: a sorted read makes etcd fetch and sort the whole queue), kept
        # near the head: see queues/_horizon.py.
        return self._horizon.op(limit=limit, keys_only=self.codec is None)

    def _observe(self, op: GetOp, read: RangeResult) -> GetOp | None:
        self._horizon.observe(op, read)
        if read.kvs:
            return None
        return self._horizon.beyond_op(op, limit=op.limit, keys_only=op.keys_only)

    async def _window(self, read: RangeResult) -> list[KeyValue]:
        """The head's priority bucket only: after losing a race, a take moves on to the next
        item of the same priority, never to a lower priority."""
        if not read.kvs:
            return []
        bucket = read.kvs[0].key.rsplit(b"/", 1)[0]
        return [kv for kv in read.kvs if kv.key.rsplit(b"/", 1)[0] == bucket]


def _guard_seq(found: Any) -> int | None:
    """The next sequence number a guard's value gives (``None``: missing, or no number)."""
    assert isinstance(found, RangeResult)
    if not found.kvs or not found.kvs[0].value.isdigit():
        return None
    return int(found.kvs[0].value) + 1


def _guard_revision(found: Any) -> int:
    assert isinstance(found, RangeResult)
    return found.kvs[0].mod_revision if found.kvs else 0
