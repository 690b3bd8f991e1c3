"""An **at-least-once** work queue: a received item is *claimed*, not deleted, and is delivered
again if the consumer that claimed it dies before acknowledging it.

:Status: Beta

Key layout (shared with the Kotlin library, tabled in :mod:`._layout`; ``<p>`` is the queue path,
``<id>`` an item's name): ``<p>/items/<id>``, ``claimed/<id>`` (payloads waiting, in flight),
``claims/<id>`` (markers, on the consumer's lease), ``attempts/<id>`` (int32 BE counts),
``dlq/<id>`` (dead letters) with ``reasons/<id>`` beside them, ``delayed/<ready%019d>-<r3>``.

``<id>`` is ``<millis%019d>-<r3>`` (a batch: ``<millis%019d>-<index%05d>-<r3>``); ``items/`` is
served in key order, i.e. FIFO by the producers' clocks (made strictly increasing within a
process, so one producer's items keep their order). A claim is one transaction:
``If(mod_revision(items/id) == observed, attempts unchanged) Then(delete items/id,
put claimed/id, put claims/id on the lease, put attempts/id = attempt)``; the consumers of one
queue on one client aim at different items, and under contention a claim goes on, nested in
the same transaction, to the next item read still present and never delivered; it reads the
queue's next items, which a receive within half a second starts from. ``ack()`` deletes
``claims/ claimed/ attempts/``, ``requeue()`` moves the payload back to ``items/<id>`` (delayed:
to ``delayed/<ready%019d>-<id>``, promoted back under its id) and ``dead_letter(reason)`` to
``dlq/<id>``, all guarded on the claim marker still being this consumer's (value and create
revision), and retried through an outage of up to ``visibility_timeout``.

Guarantees:

* every item is delivered until a consumer acknowledges it, or it is dead-lettered: nothing is
  lost when a consumer crashes, is killed or is partitioned. Delivery is **at least once**, so
  handlers must be idempotent (key side effects on :attr:`WorkItem.id`);
* exactly one consumer holds an item's claim at a time; ``ack()`` and ``requeue()`` return
  ``False`` when the claim was lost (its lease expired and the item may be delivered again
  elsewhere) -- the work may have been done twice, so count it, do not "compensate";
* the claim marker lives on the consumer's **self-healing** lease (TTL =
  ``visibility_timeout``), taken lazily: a producer that only enqueues holds no lease and runs
  no sweeper. A live consumer keeps renewing, so ``visibility_timeout`` bounds **crash
  detection**, not processing time. When the lease is lost its markers go with it (the lease
  heals for *future* claims only) and the items become reclaimable;
* orphaned items (a claim with no marker) are returned by every consumer -- when a receive
  notices them, and by a sweeper every ``sweep_interval`` -- to their **original** key, so
  they keep their place in the queue, with ``attempt + 1`` on the next delivery. A crashed
  consumer's item is redelivered within about ``visibility_timeout + sweep_interval``;
* an orphan whose ``attempts`` reached ``max_deliveries`` goes to the dead letters instead,
  as does an item a worker gives up on (``item.dead_letter(reason)``) and -- at once, reason
  ``"undecodable"``, raw bytes kept -- a payload the codec cannot decode; each keeps its reason
  (``dead_letters()``, ``requeue_dead_letter(id)``, ``purge_dead_letter(id)``: an operator
  surface that nothing drains automatically);
* delayed items (``enqueue(v, delay=s)``) are invisible until ready, then promoted in
  ready-time order under their ready time, so they interleave with immediate items by time;
* ``enqueue_all`` is atomic (one transaction);
* closing returns this consumer's unacknowledged items to the queue at once (as a crash would,
  without the wait) and revokes the lease;
* cancelling ``receive()`` (task cancel, ``anyio.fail_after``, ``asyncio.timeout``, Ctrl-C in
  the sync facade) consumes nothing: a claim already in flight is undone (payload back under
  its key, attempts as before), and a consumer lease taken by that call is revoked again.

Metrics (``metrics_name`` is the ``name`` label): one ``queue_operation`` per enqueue, receive
and settle call (outcomes and spans: ``queues/_metering.py``), ``queue_redelivered`` per sweep
that returned expired claims, ``lease_lost`` when the consumer lease is lost.

Not guaranteed: exactly-once processing; an order across consumers; delay precision better
than the clock skew between producer and consumer (ready times are producers' clock readings).
``requeue()`` keeps the attempt count but never dead-letters (only orphans do, as in the
reference). A JVM consumer promotes an item requeued with a delay under a new id (its attempt
count starts afresh) and leaves ``reasons/`` behind when it purges (a stale reason is ignored).

Deviations from the Kotlin library: the wait for items is anchored at the snapshot's revision + 1
(or before: a client's consumers share one watch per prefix); sibling consumers spread;
orphans are detected by a receive that reads the queue afresh (two count reads in the head
read's round trip); ``ack``/``requeue`` also compare the marker's create revision, so a stale
item cannot settle a later claim of the same consumer; producers write with a create-only
compare; closing returns held items instead of leaving them to other consumers' sweeps; dead letters
keep a reason; a settle hidden by an outage is retried.

Example::

    from etcd_recipes import DistributedWorkQueue

    async with DistributedWorkQueue(client, f"{prefix}/emails") as queue:
        await queue.enqueue(b"welcome:42")
        item = await queue.receive()
        assert item.value == b"welcome:42"   # send it here; handlers must be idempotent
        if not await item.ack():
            print(f"claim on {item.id} was lost; it may have been sent twice")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, overload

from .._core.logctx import library_logger
from .._core.shield import abort_guard
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import AnyOp
from .._core.validate import check_delay, check_int_range, check_timeout
from .._recipe.waiting import Interrupts
from ..codecs import Codec, ValueT, as_codec
from ..errors import (
    InvalidArgumentError,
    LeaseEventError,
    RecipeClosedError,
)
from ..events import LeaseEvent, LeaseExpired, LeaseRestored, LeaseResumed
from ._batch import MAX_BATCH, Settling, settle_many
from ._bounded import admit
from ._claims import Claimer
from ._consumer import RECEIVE_CALL, ConsumerLease
from ._horizon import millis_bound, shared_horizon
from ._items import ItemControl
from ._layout import HeadReader, WorkKeys, item_name
from ._metering import Metered, batch_size, check_propagation, report_lease_loss
from ._produce import check_batch, create, encode
from ._receive import Receiver
from ._sweep import Sweeps
from .config import WorkQueueConfig, _check_config
from .item import TracePropagation, WorkItem

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DistributedWorkQueue"]

log = library_logger("etcd_recipes.work_queue")

_METRIC = "work_queue.receive"
_PREFETCH_TTL = 0.5  # seconds a snapshot read by a claim may start the next receive
_DEAD = "it was moved to the dead letters (reason 'undecodable', raw bytes kept)"


class DistributedWorkQueue(ItemControl[ValueT], Generic[ValueT]):
    """An at-least-once work queue with visibility timeout, dead letters and delayed delivery.

    Values are ``bytes`` (``str`` is accepted and UTF-8 encoded); pass ``codec=`` to carry any
    ``T`` (``WorkItem.value`` and ``DeadLetter.value`` are then decoded). No ``start()`` is
    needed. Close it (``async with``) so that unacknowledged items return at once.
    ``trace_propagation`` (off by default; ``contrib.otel.TraceContextPropagation``) carries
    the producer's trace context to consumers that set it too, in a ``trace/<id>`` sibling key.

    Example::

        from etcd_recipes import JSON, DistributedWorkQueue, WorkQueueConfig

        config = WorkQueueConfig(visibility_timeout=10, max_deliveries=3)
        async with DistributedWorkQueue(client, f"{prefix}/jobs", config, codec=JSON) as queue:
            await queue.enqueue({"job": 1})
            await queue.enqueue({"job": 2}, delay=60)      # visible in a minute
            while (item := await queue.receive(timeout=0.5)) is not None:
                assert item.value == {"job": 1}            # process it here, then:
                await item.ack()
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        config: WorkQueueConfig | None = None,
        *,
        codec: Codec[ValueT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
        trace_propagation: TracePropagation | None = None,
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self._trace = check_propagation(trace_propagation)
        self.config: WorkQueueConfig = _check_config(config)
        """The queue's settings."""
        self.codec: Codec[ValueT] | None = None if codec is None else as_codec(codec)
        """The value codec (``None``: raw bytes, ``str`` accepted and UTF-8 encoded)."""
        self._keys = keys = WorkKeys.under(self.path)
        horizon = shared_horizon(client, keys.items, millis_bound(keys.items.encode()))
        # A parked receive wakes every sweep_interval at the latest: look that far ahead (and a
        # second more) for delayed items, so one maturing before the next wake is never missed.
        self._reads = HeadReader(keys, horizon, self.config.sweep_interval + 1.0)
        context = self.exception_context
        self._claimer = Claimer(client, self._reads, self.client_id, context, bool(self._trace))
        self._receiver = Receiver(self)
        self._sweeps = Sweeps(
            client,
            self._keys,
            self.config,
            context,
            touched=self._receiver.stale,
            snapshot=self._receiver.snapshot,
            on_error=lambda exc: self._record_exception(exc, "sweeper"),
            meter=lambda: self._meter,
        )
        self._consumer = ConsumerLease(
            client,
            self.config.visibility_timeout,
            on_event=self._on_lease_event,
            spawn_sweeper=lambda: self._spawn(self._sweeps.forever(), "sweeper"),
            check_open=self._check_open,
            context=context,
        )
        self._held: dict[str, WorkItem[ValueT]] = {}
        self._waits = Interrupts()  # closing ends the parked waits at once
        self._lease_events: Broadcast[LeaseEvent] = self._broadcast("lease")

    # ------------------------------------------------------------------ producing

    @overload
    async def enqueue(
        self: DistributedWorkQueue[bytes], value: bytes | str, delay: float | None = None
    ) -> str: ...
    @overload
    async def enqueue(self, value: ValueT, delay: float | None = None) -> str: ...
    async def enqueue(self, value: Any, delay: float | None = None) -> str:
        """Add ``value``; returns its id. With ``delay`` (seconds) it stays invisible until it
        matures (a delay <= 0 enqueues at once).

        Example::

            from etcd_recipes import DistributedWorkQueue

            queue = DistributedWorkQueue(client, f"{prefix}/mail")
            item_id = await queue.enqueue(b"send-welcome")
            await queue.enqueue(b"send-reminder", delay=3600)   # invisible for an hour
            assert await queue.size() == 1
            assert (await queue.receive()).id == item_id
            await queue.aclose()                    # the unacknowledged item goes back
        """
        self._check_open()
        data = encode(self.codec, value)
        wait = check_delay(delay)
        with Metered(self._meter, "enqueue", self.path) as op:
            writes = self._keys.writes([data], op.inject(self._trace), delay=wait)
            keys = await self._write(*writes, deadline=None)
        assert keys is not None
        return item_name(keys[0].encode())

    @overload
    async def try_enqueue(
        self: DistributedWorkQueue[bytes], value: bytes | str, delay: float | None = None
    ) -> str | None: ...
    @overload
    async def try_enqueue(self, value: ValueT, delay: float | None = None) -> str | None: ...
    async def try_enqueue(self, value: Any, delay: float | None = None) -> str | None:
        """Add ``value`` if the queue has room (``max_items``), returning its id; ``None`` at
        once, with nothing written, when it is full. Without ``max_items`` it is
        :meth:`enqueue`.

        Example::

            from etcd_recipes import DistributedWorkQueue, WorkQueueConfig

            config = WorkQueueConfig(max_items=2)
            async with DistributedWorkQueue(client, f"{prefix}/jobs", config) as queue:
                assert await queue.try_enqueue(b"a") is not None
                assert await queue.try_enqueue(b"b") is not None
                assert await queue.try_enqueue(b"c") is None    # full: nothing written
                await (await queue.receive()).ack()             # room for one more
                assert await queue.try_enqueue(b"c") is not None
        """
        self._check_open()
        data = encode(self.codec, value)
        wait = check_delay(delay)
        with Metered(self._meter, "enqueue", self.path) as op:
            writes = self._keys.writes([data], op.inject(self._trace), delay=wait)
            keys = await self._write(*writes, deadline=time.monotonic())
            if keys is None:
                op.outcome = "full"
                return None
        return item_name(keys[0].encode())

    async def _write(
        self, make_keys: Callable[[], list[str]], values: list[bytes], *, deadline: float | None
    ) -> list[str] | None:
        """Create the keys, through the bound when the queue has one (``None``: full by the
        deadline)."""
        limit = self.config.max_items
        if limit is None:
            return await create(self._client, make_keys, values)
        count = len(values) // 2 if self._trace else len(values)  # trace contexts: no items
        return await admit(
            self._client,
            self._keys,
            limit,
            make_keys,
            values,
            items=count,
            deadline=deadline,
            on_recovery=self._on_recovery_event,
        )

    @overload
    async def enqueue_all(
        self: DistributedWorkQueue[bytes], values: Iterable[bytes | str]
    ) -> list[str]: ...
    @overload
    async def enqueue_all(self, values: Iterable[ValueT]) -> list[str]: ...
    async def enqueue_all(self, values: Iterable[Any]) -> list[str]:
        """Add every value in **one** transaction (all visible at once, in argument order, or
        none); returns their ids. An empty iterable is a no-op.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/batch") as queue:
                ids = await queue.enqueue_all([b"a", b"b", b"c"])
                assert len(ids) == 3 and await queue.size() == 3
        """
        self._check_open()
        data = [encode(self.codec, v) for v in check_batch(values)]
        if not data:
            return []
        with Metered(self._meter, "enqueue", self.path, **batch_size(len(data))) as op:
            writes = self._keys.writes(data, op.inject(self._trace), batch=len(data))
            keys = await self._write(*writes, deadline=None)
        assert keys is not None
        return [item_name(k.encode()) for k in keys[: len(data)]]

    # ------------------------------------------------------------------ consuming

    @overload
    async def receive(self, timeout: float) -> WorkItem[ValueT] | None: ...

    @overload
    async def receive(self, timeout: None = None) -> WorkItem[ValueT]: ...

    async def receive(self, timeout: float | None = None) -> WorkItem[ValueT] | None:
        """Claim the next item, waiting for one (at most ``timeout`` seconds; ``0``: try once);
        ``None`` if the time ran out. Cancellation consumes nothing.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")
                item = await queue.receive(timeout=30)
                if item is not None:
                    await item.ack()
                assert await queue.receive(timeout=0.2) is None   # time ran out
        """
        limit = check_timeout(timeout, zero=True)
        found = await self._receive(wait=limit != 0, timeout=limit)
        return found[0] if found else None

    async def try_receive(self) -> WorkItem[ValueT] | None:
        """Claim the next item if one is ready; ``None`` at once otherwise.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                assert await queue.try_receive() is None         # nothing ready: at once
        """
        found = await self._receive(wait=False, timeout=None)
        return found[0] if found else None

    async def receive_many(
        self, max_items: int, timeout: float | None = None
    ) -> list[WorkItem[ValueT]]:
        """Claim up to ``max_items`` (1..100) ready items in **one** transaction, waiting for
        the first as :meth:`receive` does (at most ``timeout`` seconds; ``0``: try once); an
        empty list if the time ran out. Fewer come when fewer are ready, or others took some.

        Each item is claimed as :meth:`receive` claims one (its own compare inside the batch:
        an item another consumer took is skipped, the rest commit); a redelivered item among
        them is claimed right after, with its attempt count. Cancellation consumes nothing
        (a batch that committed meanwhile is undone). Settle the items one by one or with
        :meth:`ack_many`.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue_all([b"a", b"b", b"c"])
                items = await queue.receive_many(16, timeout=5)
                assert [i.value for i in items] == [b"a", b"b", b"c"]
                assert await queue.ack_many(items) == [True, True, True]
        """
        most = check_int_range(max_items, what="max_items", minimum=1, maximum=MAX_BATCH)
        limit = check_timeout(timeout, zero=True)
        return await self._receive(wait=limit != 0, timeout=limit, most=most)

    async def ack_many(self, items: Iterable[WorkItem[ValueT]]) -> list[bool]:
        """Acknowledge ``items`` (of this queue) in one transaction per 100; per item, in
        order, whether it was acked: ``False`` where its claim was lost (it may be delivered
        again, or was: the work may have run twice) or it was already settled -- one late
        item fails alone, the others are acked. A transport failure is retried as
        :meth:`WorkItem.ack` retries it, and its hidden outcome found out per item.

        Raises :class:`~etcd_recipes.errors.InvalidArgumentError` (nothing written) for an
        item of another queue instance.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue_all([b"a", b"b"])
                first, second = await queue.receive_many(2)
                await first.requeue()                     # settled already: not acked
                assert await queue.ack_many([first, second]) == [False, True]
        """
        batch = list(items)
        for item in batch:
            if not isinstance(item, WorkItem) or item._claim.settle != self._settle:
                raise InvalidArgumentError(f"{self.exception_context}: not an item of this queue")
        self._check_open()
        done: list[bool] = []
        for start in range(0, len(batch), MAX_BATCH):
            done += await self._ack_batch(batch[start : start + MAX_BATCH])
        return done

    def __aiter__(self) -> DistributedWorkQueue[ValueT]:
        """``async for item in queue:`` receives forever (ends when the queue is closed); a
        cancelled loop consumes nothing.

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue_all([b"a", b"b"])
                async for item in queue:
                    await item.ack()
                    if item.value == b"b":
                        break
        """
        return self

    async def __anext__(self) -> WorkItem[ValueT]:
        try:
            return await self.receive()
        except RecipeClosedError:
            raise StopAsyncIteration from None

    @property
    def lease_id(self) -> int:
        """The consumer lease's id (0 before the first claim, while healing, and after close)."""
        return self._consumer.lease_id

    def add_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with each consumer-lease event.

        ``LeaseExpired``: every outstanding claim of this consumer is gone (items reclaimable,
        ``ack()`` returns ``False``) though the lease then heals (``LeaseRestored``) for future
        claims; ``LeaseFailed``: healing gave up (the next claim takes a new lease).

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                queue.add_lease_listener(lambda event: print("lease:", event))
        """
        self._lease_events.add_listener(listener)

    def remove_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._lease_events.remove_listener(listener)

    def lease_events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[LeaseEvent]:
        """The lease listeners' events as an async iterator, until ``aclose()`` (bounded).

        Example::

            from etcd_recipes import DistributedWorkQueue

            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                print(queue.lease_events().buffered)  # 0: no claim yet, no consumer lease
        """
        return self._lease_events.stream(maxsize)

    # ------------------------------------------------------------------ receive internals

    async def _receive(
        self, *, wait: bool, timeout: float | None, most: int = 1
    ) -> list[WorkItem[ValueT]]:
        self._check_open()
        call = object()
        token = RECEIVE_CALL.set(call)

        async def give_back_new_lease() -> None:
            # A cancelled (or failed) receive that took the consumer lease gives it back,
            # unless claims made meanwhile need it.
            if self._consumer.taken_by is call and not self._held:
                await self._consumer.stop()

        extra = batch_size(most) if most > 1 else {}
        try:
            async with abort_guard(give_back_new_lease, what=f"{self.exception_context}: lease"):
                with Metered(self._meter, "receive", self.path, **extra) as op:
                    found = await self._receiver.loop(wait=wait, timeout=timeout, most=most)
                    op.link(self._trace, found[0].trace_context if found else None)
                    op.taken(found or None, waited=wait)
                    return found
        finally:
            RECEIVE_CALL.reset(token)

    # ------------------------------------------------------------------ the consumer lease

    def _on_lease_event(self, event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        report_lease_loss(self._meter, event)
        if isinstance(event, LeaseExpired):
            self._held.clear()  # every marker went with the lease
        if not isinstance(event, (LeaseRestored, LeaseResumed)):
            self._record_exception(LeaseEventError(event), "lease")
        self._lease_events.publish(event)

    # ------------------------------------------------------------------ settling

    async def _settle(
        self, item: WorkItem[ValueT], how: str, *, delay: float = 0.0, reason: str | None = None
    ) -> bool:
        with Metered(self._meter, "dead_letter" if how == "dead" else how, self.path) as op:
            op.link(self._trace, item.trace_context)
            return op.settled(await self._settle_claim(item, how, delay, reason))

    async def _settle_claim(
        self, item: WorkItem[ValueT], how: str, delay: float, reason: str | None
    ) -> bool:
        claim, name = item._claim, item.id
        if claim.settled or self.is_closed:
            return False
        claim.settled = True
        self._held.pop(name, None)  # closing must not return it meanwhile
        if how == "requeue":
            self._receiver.stale()  # it goes back to the head: a kept snapshot lacks it
        ops = self._claimer.settle_ops(name, claim.data, how, delay=delay, reason=reason)
        budget = self.config.visibility_timeout
        try:
            settled = await self._claimer.settle(name, claim.revision, claim.lease_id, ops, budget)
        except BaseException:
            if not self.is_closed:  # unknown: still ours to return on close
                self._held.setdefault(name, item)
                claim.settled = False
            raise
        if not settled:
            log.info("%s: the claim on %s was lost before settling", self.exception_context, name)
        return settled

    async def _ack_batch(self, batch: list[WorkItem[ValueT]]) -> list[bool]:
        with Metered(self._meter, "ack", self.path, **batch_size(len(batch))) as op:
            todo: dict[str, WorkItem[ValueT]] = {}
            for item in batch:  # settled ones (and a repeat of one) are not acked again
                if not item._claim.settled and item.id not in todo:
                    todo[item.id] = item
            for item in todo.values():
                item._claim.settled = True
                self._held.pop(item.id, None)  # closing must not return it meanwhile
            settling = [
                Settling(i.id, i._claim.revision, i._claim.lease_id, self._ack_ops(i))
                for i in todo.values()
            ]
            budget = self.config.visibility_timeout
            try:
                results = await settle_many(self._claimer, settling, budget) if settling else []
            except BaseException:
                for item in todo.values():
                    if not self.is_closed:  # unknown: still ours to return on close
                        self._held.setdefault(item.id, item)
                        item._claim.settled = False
                raise
            acked = {i.id: ok for i, ok in zip(todo.values(), results)}
            out = [acked.pop(item.id, False) for item in batch]
            op.settled(all(out))
            return out

    def _ack_ops(self, item: WorkItem[ValueT]) -> list[AnyOp]:
        return self._claimer.settle_ops(item.id, item._claim.data, "ack")

    # ------------------------------------------------------------------ lifecycle

    async def _do_close(self) -> None:
        self._waits.interrupt_all()
        self._consumer.cancel_sweeper()
        held = list(self._held.values())
        self._held.clear()
        await self._claimer.give_back_all(held, self.config.max_deliveries, self.path)
        await self._consumer.revoke()
