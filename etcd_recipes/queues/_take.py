"""The take side shared by the queues of this family (not public).

Used by :mod:`.fifo` and :mod:`.priority` (through :class:`TakeQueue`, the Kotlin library's
``AbstractQueue``) and by :mod:`.work` (the cancellation-safe commit and the nested compare
chain); the produce side (key clock, create-only writes) is :mod:`._produce`:

* :func:`commit` runs a take or claim transaction whose outcome cancellation cannot lose: a
  cancelled caller's cleanup waits for the outcome and undoes a committed take, then the
  cancellation is re-raised unchanged (a cancelled take consumes nothing);
* :func:`first_present` / :func:`outcome` / :func:`next_reach` build and read the chain of
  nested compares that lets a take that lost a race move on to the next item in the same
  transaction, and shrink that chain back to one compare without contention;

Not guaranteed here: delivery (a take deletes; see :mod:`.fifo`), or any order across
consumers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, cast

from .._core.keys import append_to_path
from .._core.shield import abort_guard
from .._core.txn import AnyOp, Cmp, Compare, GetOp, Op
from .._core.validate import check_timeout
from .._recipe.recipe import Recipe
from .._recipe.waiting import Interrupts, pass_on, wait_for_put_under
from ..codecs import Codec, ValueT, as_codec
from ..errors import (
    CodecError,
)
from ..types import DeleteResult, KeyValue, RangeResult, SortOrder, SortTarget, TxnResult
from ._metering import Metered
from ._produce import encode

if TYPE_CHECKING:
    from ..client import EtcdClient

_LEFT = "it was left in place (a queue on the same path without a codec takes it raw)"
CHAIN = 4  # candidates one take transaction tries, in queue order
READ = 64  # keys one head read returns (a FIFO window serves several takes)


# --------------------------------------------------------------------------- shared helpers


def decode(codec: Codec[Any] | None, data: bytes) -> Any:
    return data if codec is None else codec.decode(data)


def decode_at(codec: Codec[Any] | None, kv: KeyValue, context: str, fate: str) -> Any:
    """``kv``'s value through ``codec``; a value that fails to decode (any ``Exception`` of the
    codec) raises :class:`~etcd_recipes.errors.CodecError` naming the key and ``fate`` (what
    became of the item), the codec's error chained."""
    if codec is None:
        return kv.value
    try:
        return codec.decode(kv.value)
    except Exception as exc:
        raise CodecError(
            f"{context}: the value at {kv.key.decode('utf-8', 'replace')!r} does not decode "
            f"({type(exc).__name__}: {exc}); {fate}"
        ) from exc


def retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def commit(
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
    task.add_done_callback(retrieve)

    async def cleanup() -> None:
        try:
            result = await task
        except Exception:
            return  # it did not commit (or cannot be known to have): nothing to undo
        if result.succeeded:
            await undo(result)

    async with abort_guard(cleanup, what=what):
        return await asyncio.shield(task)


def first_present(
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


def next_reach(reach: int, level: int | None, most: int) -> int:
    """How many candidates the next take tries: grows when a take had to pass over items that
    others took (``level`` > 0, or ``None``: all were gone), shrinks back to 1 without such
    contention -- a lone consumer sends one compare-and-delete, no chain."""
    if level is None:
        return most
    if level > 0:
        return min(most, level + 2)
    return max(1, reach - 1)


def outcome(result: TxnResult) -> tuple[int, TxnResult]:
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


class TakeQueue(Recipe, Generic[ValueT]):
    """The take side both queues share (the Kotlin library's ``AbstractQueue``)."""

    one_shot = False
    _sort: ClassVar[SortTarget] = SortTarget.MOD
    _metric: ClassVar[str] = "queue.dequeue"
    _read_limit: ClassVar[int] = READ  # keys per head read
    _chain: ClassVar[int] = CHAIN  # candidates per take transaction
    _cacheable: ClassVar[bool] = False  # may the rest of a window serve the next take?

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[ValueT] | None,
        client_id: str | None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.codec: Codec[ValueT] | None = None if codec is None else as_codec(codec)
        """The value codec (``None``: raw bytes, ``str`` accepted and UTF-8 encoded)."""
        self._prefix = append_to_path(self.path, "")
        self._cache: list[KeyValue] = []  # FIFO only: the rest of the last window read
        self._reach = 1  # candidates the next take tries (see next_reach)
        self._waits = Interrupts()  # closing ends the parked waits at once

    async def dequeue(self) -> ValueT:
        """Take the head of the queue, waiting for an item as long as it takes.

        Cancellation consumes nothing (see the module docstring). With a codec, the head is
        decoded **before** the take commits: a value that does not decode raises
        :class:`~etcd_recipes.errors.CodecError` naming its key and stays in place (a queue
        on the same path without a codec takes it raw).

        Example::

            from etcd_recipes import DistributedQueue

            queue = DistributedQueue(client, f"{prefix}/q")
            await queue.enqueue(b"job")
            assert await queue.dequeue() == b"job"   # waits while the queue is empty
        """
        taken = await self._take(wait=True, timeout=None)
        assert taken is not None
        return taken[0]

    async def try_dequeue(self) -> ValueT | None:
        """Take the head if there is one; ``None`` at once when the queue is empty.

        Example::

            from etcd_recipes import DistributedQueue

            queue = DistributedQueue(client, f"{prefix}/q")
            value = await queue.try_dequeue()
            if value is None:
                print("empty")
        """
        taken = await self._take(wait=False, timeout=None)
        return None if taken is None else taken[0]

    async def poll(self, timeout: float) -> ValueT | None:
        """Take the head, waiting up to ``timeout`` seconds for one (``0``: try once, like
        :meth:`try_dequeue`); ``None`` if none came.

        Example::

            from etcd_recipes import DistributedPriorityQueue

            queue = DistributedPriorityQueue(client, f"{prefix}/pq")
            assert await queue.poll(0.2) is None     # nothing came within 0.2 s
            await queue.enqueue(b"job", 3)
            assert await queue.poll(5.0) == b"job"
        """
        limit = check_timeout(timeout, optional=False, zero=True)
        taken = await self._take(wait=limit != 0, timeout=limit)
        return None if taken is None else taken[0]

    async def size(self) -> int:
        """How many items the queue holds: one count read, advisory (stale once returned).

        Use :meth:`try_dequeue` or :meth:`poll` to decide whether a take succeeds.

        Example::

            from etcd_recipes import DistributedQueue

            queue = DistributedQueue(client, f"{prefix}/q")
            await queue.enqueue_all([b"a", b"b"])
            print("depth:", await queue.size())      # depth: 2
        """
        self._check_open()
        return await self._client.count(self._prefix)

    # ------------------------------------------------------------------ internals

    def _encode(self, value: object) -> bytes:
        return encode(self.codec, value)

    def _head_op(self, limit: int) -> GetOp:
        """The head read (a queue may bound it: see the priority queue). With a codec the
        values come along: a take decodes its candidates before it commits."""
        return Op.get(
            self._prefix,
            prefix=True,
            sort_target=self._sort,
            sort_order=SortOrder.ASCEND,
            limit=limit,
            keys_only=self.codec is None,
        )

    def _observe(self, op: GetOp, read: RangeResult) -> GetOp | None:
        """Learn from a head read made with ``op``; the read of what lies past it when it was
        bounded and found nothing (``None``: the read covered the whole queue)."""
        return None

    def _limit(self) -> int:
        """Keys the next head read asks for."""
        return self._read_limit

    async def _read_head(self, limit: int) -> RangeResult:
        op = self._head_op(limit)
        read = await self._range(op)
        beyond = self._observe(op, read)
        if beyond is not None:
            read = await self._range(beyond)
            self._observe(beyond, read)
        return read

    async def _range(self, op: GetOp) -> RangeResult:
        return await self._client.range(
            op.key,
            prefix=op.prefix,
            range_end=op.range_end,
            sort_target=op.sort_target,
            sort_order=op.sort_order,
            limit=op.limit,
            keys_only=op.keys_only,
        )

    def _decoded(self, chain: list[KeyValue]) -> list[ValueT]:
        """The values of the first decodable candidates of ``chain`` (the chain stops before
        the first that does not decode); the head not decoding raises ``CodecError``."""
        values: list[ValueT] = []
        for i, kv in enumerate(chain):
            try:
                values.append(decode_at(self.codec, kv, self.exception_context, _LEFT))
            except CodecError:
                if i == 0:
                    raise
                break
        return values

    async def _window(self, read: RangeResult) -> list[KeyValue]:
        """The first items of the queue, in queue order, from a head read (keys only)."""
        return read.kvs

    async def _take(self, *, wait: bool, timeout: float | None) -> tuple[ValueT] | None:
        """One metered take: one ``dequeue`` event and one ``queue.receive`` span."""
        self._check_open()
        with Metered(self._meter, "dequeue", self.path) as op:
            return op.taken(await self._take_loop(wait=wait, timeout=timeout), waited=wait)

    async def _take_loop(self, *, wait: bool, timeout: float | None) -> tuple[ValueT] | None:
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        window, self._cache = self._cache, []
        revision = 0
        woken = False  # woken for an item and not yet through the read and take after it
        try:
            while True:
                if not window:
                    read = await self._read_head(self._limit())
                    window, revision = await self._window(read), read.revision
                if not window:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if not wait or (remaining is not None and remaining <= 0):
                        return None
                    woken = False
                    woken = await self._wait_for_item(revision, remaining)
                    self._check_open()
                    continue
                values = self._decoded(window[: self._reach])
                chain = window[: len(values)]
                fallback = self._head_op(self._limit())
                compare, success, failure = first_present(chain, fallback)
                result = await commit(
                    self._client,
                    compare,
                    success,
                    failure,
                    undo=self._put_back,
                    what=f"{self.exception_context}: putting back a cancelled take",
                )
                level, reached = outcome(result)
                got = level if reached.succeeded else None
                self._reach = next_reach(self._reach, got, self._chain)
                if reached.succeeded:
                    if self._cacheable:
                        self._cache = window[level + 1 :]
                    if wait:
                        self._record_latency(self._metric, started)
                    if self.codec is not None:
                        return (values[level],)  # decoded as read: its mod revision was compared
                    deleted = reached.responses[0]  # raw: the keys-only read had no values
                    assert isinstance(deleted, DeleteResult)
                    return (cast(ValueT, deleted.prev_kvs[0].value),)
                # Every candidate was gone: the innermost failure branch re-read the head (when it
                # was bounded and found nothing, the next pass reads past the bound).
                fresh = reached.responses[0]
                assert isinstance(fresh, RangeResult)
                self._observe(fallback, fresh)
                window, revision = await self._window(fresh), result.revision
        except BaseException:
            if woken:  # leaving without the item it was woken for: another looks instead
                pass_on(self._client, self._prefix)
            raise

    async def _do_close(self) -> None:
        self._waits.interrupt_all()

    async def _put_back(self, result: TxnResult) -> None:
        _, reached = outcome(result)
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
            interrupts=self._waits,
            one=True,
        )
