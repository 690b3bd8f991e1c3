"""Queues that hand each item out **at most once**: :class:`DistributedQueue` (FIFO) and
:class:`DistributedPriorityQueue` (lowest priority number first).

:Status: Beta

**At most once -- read this first.** A take deletes the item in the same transaction that hands
it to you: once ``dequeue()`` returns, etcd keeps no copy. If your process dies before it has
processed the item, the item is gone. That is the contract of these two queues (Curator's and
the JVM library's queues behave the same), and the right trade when items are cheap or
replayable. When an item must survive its consumer, use
:class:`~etcd_recipes.work_queue.DistributedWorkQueue`, which claims instead of deleting.

Key layout (shared with the JVM library; ``<p>`` is the queue path without a trailing ``/``):

* FIFO: ``<p>/<millis%019d>-<r3>``; a batch ``<p>/<millis%019d>-<index%05d>-<r3>`` (one shared
  ``millis``), written in one transaction. Ordered by **mod revision** -- etcd's commit order,
  not the client clock -- and, within a batch (one revision), by key, i.e. argument order.
* priority: ``<p>/<priority%05d>/<seq%016d>``, ordered by key: lower priority number first,
  FIFO within a priority. The guard key ``__<p>/<priority%05d>`` (value ``""``, outside
  ``<p>/``) serialises producers of one priority: ``If(mod_revision(guard) < read_revision + 1)
  Then(put guard, put item)``, retried up to 50 times.
* take (both queues): ``If(mod_revision(head) == observed) Then(delete head)`` -- under
  contention ``Else`` the same for the next item read, nested (see below).

Performance notes: a FIFO head read makes etcd fetch the whole queue (it sorts by revision
server-side), so a FIFO consumer reads a window of items and serves several takes from it --
valid because new items only ever join at the tail; a lone consumer sends one plain
compare-and-delete per take, and the nested chain grows only while other consumers win races.

Guarantees:

* exactly one consumer gets each item, however many race for it: a take deletes the head
  guarded on its mod revision. A consumer that loses the race moves on to the next item still
  present, in queue order, within the same transaction (nested compares over the first few
  items it read); when none is left, the transaction's failure branch re-reads the head and
  the take retries in a loop -- no recursion, no new watch per retry;
* with one consumer, items come out in queue order: FIFO by commit order, a batch in argument
  order (also beyond 12 items, where etcd's own sort of equal revisions is unstable: ties are
  broken by key here), or by priority;
* ``enqueue_all`` is atomic: the whole batch becomes visible at one revision, or nothing does;
* an empty queue is waited on with a watch anchored at the empty read's revision + 1, so an
  item enqueued in between is never missed; after waking, the true head is re-read (the first
  put seen is not necessarily the head); the wait survives server restarts and compaction;
* cancelling ``dequeue()`` or ``poll()`` (task cancel, ``anyio.fail_after``, ``asyncio.timeout``,
  Ctrl-C in the sync facade) consumes nothing: a take whose delete was already in flight puts
  the item back under its key (in a priority queue it keeps its place; in a FIFO queue it then
  sorts after what was enqueued before the put-back);
* values are ``bytes`` by default (``str`` is UTF-8 encoded), or any ``T`` through ``codec=``.

Not guaranteed:

* **delivery**: an item is lost when its consumer dies after the take (at most once);
* a global order across several consumers: each take gets the head of its moment, so two
  consumers may finish items in either order (a priority take only ever moves on to an item
  of the same priority);
* ``size()`` is one count read, already stale when it returns.

Deviations from the reference: prefix reads and watches use a trailing ``/``; producers write
with a create-only compare, so two producers that draw the same key in the same millisecond
cannot overwrite each other (a plain put could silently lose an item); a priority outside
0..65535 raises :class:`InvalidPriorityError` instead of wrapping.

Example::

    async with DistributedQueue(client, "/queues/orders") as queue:
        await queue.enqueue(b"order-1")
        print(await queue.dequeue())          # b'order-1'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast, overload

import anyio

from ._core.keys import append_to_path, pad, random_token
from ._core.recipe import Recipe
from ._core.txn import AnyOp, Cmp, Compare, GetOp, Op
from ._core.waiting import abort_guard, wait_for_put_under
from .codecs import Codec, as_codec, to_bytes
from .errors import (
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdTimeoutError,
    InvalidArgumentError,
    RetriesExhaustedError,
)
from .types import (
    DeleteResult,
    KeyValue,
    RangeResult,
    SortOrder,
    SortTarget,
    TxnResult,
)

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = [
    "MAX_PRIORITY",
    "DistributedPriorityQueue",
    "DistributedQueue",
    "InvalidPriorityError",
]

log = logging.getLogger("etcd_recipes.queue")

T = TypeVar("T")

MAX_PRIORITY = 65535
"""The largest priority (priorities are stored as five digits; lower numbers are served first)."""

MAX_ENQUEUE_ATTEMPTS = 50
"""Compare-and-swap attempts of a priority enqueue before it gives up (the reference's bound)."""

_CHAIN = 4  # candidates one take transaction tries, in queue order
_READ = 64  # keys one head read returns (a FIFO window serves several takes)
_MAX_KEY_CLASHES = 10  # fresh random suffixes tried when a new key already exists


class InvalidPriorityError(InvalidArgumentError):
    """A priority outside ``0..65535`` (or not an ``int``). Also a ``ValueError``.

    Example::

        try:
            await queue.enqueue(b"job", 70000)
        except InvalidPriorityError as exc:
            print(exc)   # priority must be an int in 0..65535, got 70000
    """


# --------------------------------------------------------------------------- shared helpers
# (also used by etcd_recipes.work_queue)


_last_millis = 0


def _now_millis() -> int:
    return time.time_ns() // 1_000_000


def _key_millis() -> int:
    """The producer clock for a new key, strictly increasing within this process, so that two
    enqueues in one millisecond keep their order where keys are sorted by their text."""
    global _last_millis
    _last_millis = max(_now_millis(), _last_millis + 1)
    return _last_millis


def _check_timeout(timeout: float, what: str = "timeout") -> float:
    """A number of seconds > 0 (finite or not), else :class:`InvalidArgumentError`."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"{what} must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _encode(codec: Codec[Any] | None, value: object) -> bytes:
    """Bytes for ``value``: through ``codec``, or as bytes / UTF-8 text without one."""
    if codec is None:
        return to_bytes(value)  # type: ignore[arg-type]
    return codec.encode(value)


def _decode(codec: Codec[Any] | None, data: bytes) -> Any:
    return data if codec is None else codec.decode(data)


def _check_batch(values: Iterable[object]) -> list[object]:
    if isinstance(values, (str, bytes, bytearray, memoryview)):
        raise InvalidArgumentError(
            "enqueue_all() takes an iterable of values, not a single str/bytes value"
        )
    return list(values)


def _record_latency(client: EtcdClient, name: str, started: float) -> None:
    """The one place queues report latency: call -> item in hand, waiting included."""
    client.resilience.metrics.record_latency(name, time.monotonic() - started)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _create(
    client: EtcdClient, make_keys: Callable[[], Sequence[str]], values: Sequence[bytes]
) -> list[str]:
    """Write ``values`` under fresh keys in one transaction, each guarded "does not exist".

    A clash (another producer drew the same key) draws new keys. A transport failure retries
    the same keys under the client's RPC retry policy; if the retry then finds the first key
    holding our value, the earlier attempt had landed and counts as done.
    """
    policy = client.resilience.rpc.retry_policy
    keys = list(make_keys())
    uncertain = False
    failures = clashes = 0
    start = time.monotonic()
    while True:
        try:
            result = await client.txn(
                [Cmp.missing(k) for k in keys],
                [Op.put(k, v) for k, v in zip(keys, values)],
                [Op.get(keys[0])],
            )
        except (EtcdConnectionError, EtcdTimeoutError):
            failures += 1
            delay = policy.next_delay(failures, time.monotonic() - start)
            if delay is None:
                raise
            uncertain = True
            await asyncio.sleep(delay)
            continue
        if result.succeeded:
            return keys
        existing = result.responses[0]
        if (
            uncertain
            and isinstance(existing, RangeResult)
            and existing.kvs
            and existing.kvs[0].value == values[0]
        ):
            return keys  # our attempt that timed out had been committed
        clashes += 1
        if clashes >= _MAX_KEY_CLASHES:
            raise RetriesExhaustedError(
                f"could not find a free key after {clashes} attempts (last: {keys[0]})",
                attempts=clashes,
            )
        keys, uncertain = list(make_keys()), False


async def _commit(
    client: EtcdClient,
    compare: Sequence[Compare],
    success: Sequence[AnyOp],
    failure: Sequence[AnyOp],
    *,
    undo: Callable[[TxnResult], Awaitable[object]],
    what: str,
) -> TxnResult:
    """Run a take/claim transaction whose outcome cancellation cannot lose.

    The transaction runs in its own task; if the caller is cancelled (or fails) meanwhile, the
    cleanup -- shielded and bounded, via :func:`abort_guard` -- waits for the outcome and, if
    it committed, runs ``undo(result)`` so the take consumes nothing. The caller's
    cancellation is then re-raised unchanged.
    """
    task = asyncio.ensure_future(client.txn(compare, success, failure))
    task.add_done_callback(_retrieve)

    async def cleanup() -> None:
        try:
            result = await task
        except Exception:
            return  # it did not commit (or cannot be known to have): nothing to undo
        if result.succeeded:
            await undo(result)

    async with abort_guard(cleanup, what=what):
        return await asyncio.shield(task)


class _Waits:
    """The parked waits of one recipe, so that closing the recipe ends them at once (the
    waiting call then raises :class:`~etcd_recipes.errors.RecipeClosedError`)."""

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)

    def end_all(self) -> None:
        for scope in list(self._scopes):
            scope.cancel()


def _first_present(
    window: Sequence[KeyValue], fallback: GetOp
) -> tuple[list[Compare], list[AnyOp], list[AnyOp]]:
    """One transaction that deletes the first item of ``window`` still present (unchanged since
    it was read), trying them in order as nested transactions; when none is left, its innermost
    failure branch runs ``fallback`` (a fresh head read)."""
    failure: list[AnyOp] = [fallback]
    for kv in reversed(window[1:]):
        failure = [
            Op.txn(
                [Cmp.mod_revision(kv.key) == kv.mod_revision],
                [Op.delete(kv.key, prev_kv=True)],
                failure,
            )
        ]
    head = window[0]
    return (
        [Cmp.mod_revision(head.key) == head.mod_revision],
        [Op.delete(head.key, prev_kv=True)],
        failure,
    )


def _next_reach(reach: int, level: int | None, most: int) -> int:
    """How many candidates the next take tries: grows when a take had to pass over items that
    others took (``level`` > 0, or ``None``: all were gone), shrinks back to 1 without such
    contention -- a lone consumer sends one compare-and-delete, no chain."""
    if level is None:
        return most
    if level > 0:
        return min(most, level + 2)
    return max(1, reach - 1)


def _outcome(result: TxnResult) -> tuple[int, TxnResult]:
    """Walk a chain of nested transactions down its failure branches: the level whose compare
    held and its result, or -- when none held -- the depth and the innermost result (whose
    responses are the fallback's)."""
    level = 0
    while not result.succeeded:
        inner = result.responses[0] if result.responses else None
        if not isinstance(inner, TxnResult):
            break
        result, level = inner, level + 1
    return level, result


# --------------------------------------------------------------------------- the take side


class _QueueBase(Recipe, Generic[T]):
    """The take side both queues share (the reference's ``AbstractQueue``)."""

    one_shot = False
    _sort: ClassVar[SortTarget] = SortTarget.MOD
    _metric: ClassVar[str] = "queue.dequeue"
    _read_limit: ClassVar[int] = _READ  # keys per head read
    _chain: ClassVar[int] = _CHAIN  # candidates per take transaction
    _cacheable: ClassVar[bool] = False  # may the rest of a window serve the next take?

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[T] | None,
        client_id: str | None,
    ) -> None:
        super().__init__(client, path, client_id=client_id)
        self.codec: Codec[T] | None = None if codec is None else as_codec(codec)
        """The value codec (``None``: raw bytes, ``str`` accepted and UTF-8 encoded)."""
        self._prefix = append_to_path(self.path, "")
        self._cache: list[KeyValue] = []  # FIFO only: the rest of the last window read
        self._reach = 1  # candidates the next take tries (see _next_reach)
        self._waits = _Waits()

    async def dequeue(self) -> T:
        """Take the head of the queue, waiting for an item as long as it takes.

        Cancellation consumes nothing (see the module docstring).

        Example::

            value = await queue.dequeue()
        """
        data = await self._take(wait=True, timeout=None)
        assert data is not None
        return cast(T, _decode(self.codec, data))

    async def try_dequeue(self) -> T | None:
        """Take the head if there is one; ``None`` at once when the queue is empty.

        Example::

            value = await queue.try_dequeue()
            if value is None:
                print("empty")
        """
        data = await self._take(wait=False, timeout=None)
        return None if data is None else cast(T, _decode(self.codec, data))

    async def poll(self, timeout: float) -> T | None:
        """Take the head, waiting up to ``timeout`` seconds (> 0) for one; ``None`` if none came.

        Example::

            value = await queue.poll(5.0)
        """
        data = await self._take(wait=True, timeout=_check_timeout(timeout))
        return None if data is None else cast(T, _decode(self.codec, data))

    async def size(self) -> int:
        """How many items the queue holds: one count read, advisory (stale once returned).

        Use :meth:`try_dequeue` or :meth:`poll` to decide whether a take succeeds.

        Example::

            print("depth:", await queue.size())
        """
        self._check_open()
        return await self._client.count(self._prefix)

    # ------------------------------------------------------------------ internals

    def _encode(self, value: object) -> bytes:
        return _encode(self.codec, value)

    def _head_op(self, limit: int) -> GetOp:
        return Op.get(
            self._prefix,
            prefix=True,
            sort_target=self._sort,
            sort_order=SortOrder.ASCEND,
            limit=limit,
            keys_only=True,
        )

    async def _read_head(self, limit: int) -> RangeResult:
        return await self._client.range(
            self._prefix,
            prefix=True,
            sort_target=self._sort,
            sort_order=SortOrder.ASCEND,
            limit=limit,
            keys_only=True,
        )

    async def _window(self, read: RangeResult) -> list[KeyValue]:
        """The first items of the queue, in queue order, from a head read (keys only)."""
        return read.kvs

    async def _take(self, *, wait: bool, timeout: float | None) -> bytes | None:
        self._check_open()
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        window, self._cache = self._cache, []
        revision = 0
        while True:
            if not window:
                read = await self._read_head(self._read_limit)
                window, revision = await self._window(read), read.revision
            if not window:
                remaining = None if deadline is None else deadline - time.monotonic()
                if not wait or (remaining is not None and remaining <= 0):
                    return None
                with self._waits.scope():
                    await self._wait_for_item(revision, remaining)
                self._check_open()
                continue
            chain = window[: self._reach]
            compare, success, failure = _first_present(chain, self._head_op(self._read_limit))
            result = await _commit(
                self._client,
                compare,
                success,
                failure,
                undo=self._put_back,
                what=f"{self.exception_context}: putting back a cancelled take",
            )
            level, reached = _outcome(result)
            self._reach = _next_reach(
                self._reach, level if reached.succeeded else None, self._chain
            )
            if reached.succeeded:
                deleted = reached.responses[0]
                assert isinstance(deleted, DeleteResult)
                if self._cacheable:
                    self._cache = window[level + 1 :]
                if wait:
                    _record_latency(self._client, self._metric, started)
                return deleted.prev_kvs[0].value
            # Every candidate was gone: the innermost failure branch re-read the head.
            fresh = reached.responses[0]
            assert isinstance(fresh, RangeResult)
            window, revision = await self._window(fresh), result.revision

    async def _do_close(self) -> None:
        self._waits.end_all()

    async def _put_back(self, result: TxnResult) -> None:
        _, reached = _outcome(result)
        deleted = reached.responses[0] if reached.succeeded else None
        if isinstance(deleted, DeleteResult):
            for kv in deleted.prev_kvs:
                await self._client.put(kv.key, kv.value)

    async def _wait_for_item(self, revision: int, timeout: float | None) -> bool:
        return await wait_for_put_under(
            self._client,
            self._prefix,
            after_revision=revision,
            timeout=timeout,
            on_recovery=self._on_recovery_event,
        )


# --------------------------------------------------------------------------- FIFO


class DistributedQueue(_QueueBase[T], Recipe, Generic[T]):
    """A FIFO queue ordered by etcd's commit order; each item is handed out at most once.

    Values are ``bytes`` (``str`` is accepted and UTF-8 encoded); pass ``codec=`` to make the
    queue carry any ``T``. No ``start()`` is needed; ``async with`` works and closing releases
    nothing (the queue holds no lease).

    Example::

        async with DistributedQueue(client, "/queues/orders", codec=JSON) as orders:
            await orders.enqueue({"id": 1})
            await orders.enqueue_all([{"id": 2}, {"id": 3}])   # one transaction
            print(await orders.dequeue())                      # {'id': 1}
            print(await orders.poll(5.0))                      # {'id': 2}
            print(await orders.try_dequeue())                  # {'id': 3}
    """

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[T],
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DistributedQueue[bytes],
        client: EtcdClient,
        path: str,
        *,
        codec: None = None,
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None: ...

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(client, path, codec=codec, client_id=client_id)

    # Items only ever join a FIFO queue at its tail (a new commit has a higher revision), so
    # the first still-present item of an earlier window is still the head: a window serves
    # several takes, and the ordering read (etcd fetches the whole queue to sort it by
    # revision) is paid once per window, not once per take.
    _cacheable = True

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

    async def enqueue(self, value: T | str) -> None:
        """Append ``value`` (one transaction; its commit revision is its place in the queue).

        Example::

            await queue.enqueue(b"order-1")
        """
        self._check_open()
        data = self._encode(value)

        def key() -> list[str]:
            return [append_to_path(self.path, f"{pad(_key_millis(), 19)}-{random_token(3)}")]

        await _create(self._client, key, [data])

    async def enqueue_all(self, values: Iterable[T | str]) -> None:
        """Append every value in **one** transaction: all become visible at the same revision,
        in argument order, or none does. An empty iterable is a no-op.

        The server bounds a transaction (``--max-txn-ops``, 128 by default): a larger batch
        raises :class:`~etcd_recipes.errors.TooManyOperationsError` with nothing written.

        Example::

            await queue.enqueue_all([b"a", b"b", b"c"])
        """
        self._check_open()
        data = [self._encode(v) for v in _check_batch(values)]
        if not data:
            return

        def keys() -> list[str]:
            millis = pad(_key_millis(), 19)
            return [
                append_to_path(self.path, f"{millis}-{pad(i, 5)}-{random_token(3)}")
                for i in range(len(data))
            ]

        await _create(self._client, keys, data)


# --------------------------------------------------------------------------- priority


def _check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidPriorityError(
            f"priority must be an int in 0..{MAX_PRIORITY}, got {type(priority).__name__}"
        )
    if not 0 <= priority <= MAX_PRIORITY:
        raise InvalidPriorityError(
            f"priority must be an int in 0..{MAX_PRIORITY}, got {priority} "
            "(it is never wrapped into range)"
        )
    return priority


class DistributedPriorityQueue(_QueueBase[T], Recipe, Generic[T]):
    """A priority queue: the lowest priority number is served first, FIFO within a priority;
    each item is handed out at most once.

    ``minimum_wait_time`` (seconds, default 0) paces this instance's enqueues: each waits until
    that long has passed since the previous one, thinning out compare-and-swap contention on a
    busy priority. It is per instance, not a cluster-wide rate limit. Enqueues of one instance
    run one at a time.

    Example::

        async with DistributedPriorityQueue(client, "/queues/jobs") as jobs:
            await jobs.enqueue(b"nightly-report", 200)
            await jobs.enqueue(b"page-oncall", 1)
            print(await jobs.dequeue())       # b'page-oncall'
    """

    _sort = SortTarget.KEY
    _metric = "priority_queue.dequeue"
    _read_limit = 8
    _chain = 8

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        minimum_wait_time: float = 0.0,
        codec: Codec[T],
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DistributedPriorityQueue[bytes],
        client: EtcdClient,
        path: str,
        *,
        minimum_wait_time: float = 0.0,
        codec: None = None,
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        minimum_wait_time: float = 0.0,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None: ...

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        minimum_wait_time: float = 0.0,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(client, path, codec=codec, client_id=client_id)
        if (
            isinstance(minimum_wait_time, bool)
            or not isinstance(minimum_wait_time, (int, float))
            or not 0 <= minimum_wait_time < float("inf")
        ):
            raise InvalidArgumentError(
                f"minimum_wait_time must be a number of seconds >= 0, got {minimum_wait_time!r}"
            )
        self.minimum_wait_time: float = float(minimum_wait_time)
        """Seconds between two enqueues of this instance (0: no pacing)."""
        self._last_write = float("-inf")
        self._enqueue_lock = asyncio.Lock()

    async def enqueue(self, value: T | str, priority: int) -> None:
        """Add ``value`` at ``priority`` (0..65535, lower first; FIFO within a priority).

        Raises :class:`InvalidPriorityError` for a priority out of range (nothing is written),
        and :class:`~etcd_recipes.errors.RetriesExhaustedError` if 50 compare-and-swap attempts
        in a row lose to other producers of the same priority.

        Example::

            await queue.enqueue(b"page-oncall", 1)
        """
        self._check_open()
        prio = _check_priority(priority)
        data = self._encode(value)
        bucket = append_to_path(self.path, pad(prio, 5))
        children = bucket + "/"
        guard = "__" + bucket
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
            read = await self._client.txn([], [last])
            for attempt in range(1, MAX_ENQUEUE_ATTEMPTS + 1):
                found = read.responses[-1]
                assert isinstance(found, RangeResult)
                key = f"{children}{pad(self._next_seq(children, found), 16)}"
                result = await self._client.txn(
                    [Cmp.mod_revision(guard) < read.revision + 1],
                    [Op.put(guard, b""), Op.put(key, data)],
                    [last],
                )
                if result.succeeded:
                    self._last_write = time.monotonic()
                    return
                log.debug("%s: enqueue CAS lost (attempt %d)", self.exception_context, attempt)
                read = result
                if attempt % 5 == 0:  # heavy contention: let the others through
                    await asyncio.sleep(random.uniform(0, 0.001 * attempt))
        raise RetriesExhaustedError(
            f"{self.exception_context}: failed to enqueue at priority {prio} after "
            f"{MAX_ENQUEUE_ATTEMPTS} attempts (other producers kept winning)",
            attempts=MAX_ENQUEUE_ATTEMPTS,
        )

    def _next_seq(self, children: str, found: RangeResult) -> int:
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

    async def _window(self, read: RangeResult) -> list[KeyValue]:
        """The head's priority bucket only: after losing a race, a take moves on to the next
        item of the same priority, never to a lower priority."""
        if not read.kvs:
            return []
        bucket = read.kvs[0].key.rsplit(b"/", 1)[0]
        return [kv for kv in read.kvs if kv.key.rsplit(b"/", 1)[0] == bucket]
