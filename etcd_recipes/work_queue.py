"""An **at-least-once** work queue: a received item is *claimed*, not deleted, and is delivered
again if the consumer that claimed it dies before acknowledging it.

:Status: Beta

Key layout (shared with the JVM library; ``<p>`` is the queue path, ``<id>`` an item's name):

========================================  =============================  ========================
key                                       value                          lease
========================================  =============================  ========================
``<p>/items/<id>``                        the payload, waiting           none
``<p>/claimed/<id>``                      the payload, in flight         none (survives a crash)
``<p>/claims/<id>``                       the consumer's ``client_id``   the consumer's lease
``<p>/attempts/<id>``                     deliveries so far, int32 BE    none
``<p>/dlq/<id>``                          a dead letter's payload        none
``<p>/delayed/<ready%019d>-<r3>``         a delayed payload              none
========================================  =============================  ========================

``<id>`` is ``<millis%019d>-<r3>`` (a batch: ``<millis%019d>-<index%05d>-<r3>``); ``items/`` is
served in key order, i.e. FIFO by the producers' clocks (made strictly increasing within a
process, so one producer's items keep their order). A claim is one transaction:
``If(mod_revision(items/id) == observed, attempts unchanged) Then(delete items/id,
put claimed/id, put claims/id on the lease, put attempts/id = attempt)``; under contention it
goes on, nested in the same transaction, to the next item read that is still present and
never delivered, and it reads the queue's next items right after the claim, which a receive
that follows within half a second starts from. ``ack()`` deletes ``claims/ claimed/
attempts/`` and ``requeue()`` moves the payload back to ``items/<id>``, both guarded on the
claim marker still being this consumer's (value and create revision).

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
* an orphan whose ``attempts`` reached ``max_deliveries`` goes to the dead letters instead
  (``dead_letters()``, ``requeue_dead_letter(id)``, ``purge_dead_letter(id)``): an operator
  surface that nothing drains automatically;
* delayed items (``enqueue(v, delay=s)``) are invisible until ready, then promoted in
  ready-time order under their ready time, so they interleave with immediate items by time;
* ``enqueue_all`` is atomic (one transaction);
* closing returns this consumer's unacknowledged items to the queue at once (as a crash would,
  without the wait) and revokes the lease;
* cancelling ``receive()`` (task cancel, ``anyio.fail_after``, ``asyncio.timeout``, Ctrl-C in
  the sync facade) consumes nothing: a claim already in flight is undone (payload back under
  its key, attempts as before), and a consumer lease taken by that call is revoked again.

Not guaranteed: exactly-once processing; an order across consumers; delay precision better
than the clock skew between producer and consumer (ready times are producers' clock readings).
``requeue()`` keeps the attempt count but never dead-letters (only orphans do, as in the
reference).

Deviations from the reference: the wait for items is anchored at the snapshot's revision + 1
(the reference's was not); orphans are detected by a receive that reads the queue afresh, from
two count reads in the same round trip as the head read; ``ack``/``requeue`` also compare the
marker's create
revision, so a stale item cannot settle a later claim of the same consumer; producers write
with a create-only compare; closing returns held items instead of leaving them to other
consumers' sweeps.

Example::

    async with DistributedWorkQueue(client, "/work/emails") as queue:
        await queue.enqueue(b"welcome:42")
        item = await queue.receive()
        send(item.value)
        if not await item.ack():
            log.warning("claim on %s was lost; it may have been sent twice", item.id)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from ._core.keys import append_to_path, pad, random_token
from ._core.lease import SelfHealingLease, validate_ttl
from ._core.listeners import ListenerSet
from ._core.recipe import Recipe
from ._core.txn import AnyOp, Cmp, Op
from ._core.waiting import abort_guard, wait_for_put_under
from .codecs import INT32, Codec, as_codec
from .errors import (
    CodecError,
    EtcdRecipeError,
    InvalidArgumentError,
    LeaseEventError,
    LeaseNotFoundError,
)
from .events import LeaseEvent, LeaseExpired, LeaseRestored
from .queue import (
    _check_batch,
    _check_timeout,
    _commit,
    _create,
    _decode,
    _encode,
    _key_millis,
    _next_reach,
    _now_millis,
    _outcome,
    _record_latency,
    _retrieve,
    _Waits,
)
from .types import KeyValue, RangeResult, TxnResult

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = ["DeadLetter", "DistributedWorkQueue", "WorkItem", "WorkQueueConfig"]

log = logging.getLogger("etcd_recipes.work_queue")

T = TypeVar("T")

_METRIC = "work_queue.receive"
_LEASE_POLL = 0.05  # while the consumer lease heals, claims wait this long between checks
_WINDOW = 4  # items (with their payloads) a receive reads and may try in one claim
_CHAIN_BYTES = 256 * 1024  # payload bytes one claim transaction may carry
_PREFETCH_TTL = 0.5  # seconds a snapshot read by a claim may start the next receive
_RECEIVE_CALL: contextvars.ContextVar[object] = contextvars.ContextVar("receive_call")


@dataclass(frozen=True)
class WorkQueueConfig:
    """Settings of a :class:`DistributedWorkQueue` (all in seconds except ``max_deliveries``).

    :param visibility_timeout: TTL of the consumer lease (whole seconds, at least 1): how long
        after a consumer **dies** its claims become reclaimable. A live consumer renews its
        lease, so this does not bound processing time -- tune it for crash recovery.
    :param max_deliveries: deliveries before an orphaned item is dead-lettered (at least 1).
    :param sweep_interval: how often each consumer looks for orphans and matured delayed items
        (> 0); also the longest a parked ``receive()`` sleeps without looking.

    Example::

        config = WorkQueueConfig(visibility_timeout=10, max_deliveries=3, sweep_interval=5)
        queue = DistributedWorkQueue(client, "/work/jobs", config)
    """

    visibility_timeout: float = 30.0
    max_deliveries: int = 5
    sweep_interval: float = 30.0

    def __post_init__(self) -> None:
        validate_ttl(self.visibility_timeout)
        deliveries = self.max_deliveries
        if isinstance(deliveries, bool) or not isinstance(deliveries, int) or deliveries < 1:
            raise InvalidArgumentError(f"max_deliveries must be an int >= 1, got {deliveries!r}")
        _check_timeout(self.sweep_interval, "sweep_interval")
        if math.isinf(self.sweep_interval):
            raise InvalidArgumentError("sweep_interval must be finite")


@dataclass(frozen=True)
class DeadLetter(Generic[T]):
    """An item that exhausted ``max_deliveries``: its ``id``, decoded ``value`` and the number
    of ``attempts`` made.

    Example::

        for dead in await queue.dead_letters():
            print(dead.id, dead.attempts, dead.value)
    """

    id: str
    value: T
    attempts: int


class _Claim:
    """What a :class:`WorkItem` needs to settle its claim."""

    __slots__ = ("data", "queue", "revision", "settled")

    def __init__(self, queue: DistributedWorkQueue[Any], data: bytes, revision: int) -> None:
        self.queue = queue
        self.data = data
        self.revision = revision  # the claim transaction's revision = the marker's create rev
        self.settled = False


class WorkItem:
    """A received item, claimed by this consumer until :meth:`ack` or :meth:`requeue`.

    ``value`` is the decoded payload (``bytes`` without a codec), ``attempt`` the delivery
    number (1 the first time; a redelivery after a crash has ``attempt + 1``).

    Example::

        item = await queue.receive()
        try:
            handle(item.value)           # must be idempotent: delivery is at least once
        except Exception:
            await item.requeue()         # back at once, attempt count kept
        else:
            await item.ack()
    """

    def __init__(self, id: str, value: Any, attempt: int, *, claim: _Claim) -> None:
        self.id: str = id
        """The item's name (``<millis%019d>-<r3>``), stable across redeliveries."""
        self.value: Any = value
        """The decoded payload."""
        self.attempt: int = attempt
        """Which delivery this is (1 for the first)."""
        self._claim = claim

    @property
    def is_settled(self) -> bool:
        """Whether :meth:`ack` or :meth:`requeue` already ran (successfully or not)."""
        return self._claim.settled

    async def ack(self) -> bool:
        """Complete the item: delete it for good. ``False`` if the claim was lost (the item may
        be delivered again, or was already) or the item was already settled.

        Example::

            if not await item.ack():
                metrics.increment("work.duplicate_risk")
        """
        return await self._claim.queue._settle(self, requeue=False)

    async def requeue(self) -> bool:
        """Hand the item back at once, to its original place, keeping its attempt count.
        ``False`` if the claim was lost or the item was already settled.

        Example::

            await item.requeue()   # a transient failure: let any consumer retry now
        """
        return await self._claim.queue._settle(self, requeue=True)

    def __repr__(self) -> str:
        state = "settled" if self._claim.settled else "claimed"
        return f"<WorkItem {self.id} attempt={self.attempt} {state}>"


@dataclass
class _Snapshot:
    items: list[KeyValue]  # the first few items (with their values), or nothing
    delayed: KeyValue | None  # the first delayed item (key only)
    orphans: bool  # more payloads in flight than claim markers
    revision: int
    kept: bool = False  # read by an earlier claim (see _fresh_prefetch), not just now


def _name(key: bytes) -> str:
    return key.rsplit(b"/", 1)[-1].decode("utf-8", "replace")


def _ready_millis(kv: KeyValue) -> int:
    """When a delayed item matures (its name's millis); a malformed name is due now."""
    try:
        return int(_name(kv.key).split("-", 1)[0])
    except ValueError:
        return 0


def _attempts(kvs: list[KeyValue]) -> int:
    if not kvs:
        return 0
    try:
        return INT32.decode(kvs[0].value)
    except CodecError:
        log.warning("ignoring a malformed attempt count at %r", kvs[0].key)
        return 0


def _check_id(item_id: str) -> str:
    if not isinstance(item_id, str) or not item_id or "/" in item_id:
        raise InvalidArgumentError(f"not an item id: {item_id!r}")
    return item_id


async def _heal_forward(lease_id: int) -> bool:
    # Claim markers made under a dead lease stay dead: their items are reclaimable, and another
    # consumer may already hold them. The healed lease serves future claims only.
    return True


class DistributedWorkQueue(Recipe, Generic[T]):
    """An at-least-once work queue with visibility timeout, dead letters and delayed delivery.

    Values are ``bytes`` (``str`` is accepted and UTF-8 encoded); pass ``codec=`` to carry any
    ``T`` (``WorkItem.value`` and ``DeadLetter.value`` are then decoded). No ``start()`` is
    needed. Close it (``async with``) so that unacknowledged items return at once.

    Example::

        config = WorkQueueConfig(visibility_timeout=10, max_deliveries=3)
        async with DistributedWorkQueue(client, "/work/jobs", config, codec=JSON) as queue:
            await queue.enqueue({"job": 1})
            await queue.enqueue({"job": 2}, delay=60)      # visible in a minute
            while (item := await queue.receive(timeout=30)) is not None:
                process(item.value)
                await item.ack()
    """

    one_shot = False

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        config: WorkQueueConfig | None = None,
        *,
        codec: Codec[T],
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: DistributedWorkQueue[bytes],
        client: EtcdClient,
        path: str,
        config: WorkQueueConfig | None = None,
        *,
        codec: None = None,
        client_id: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        client: EtcdClient,
        path: str,
        config: WorkQueueConfig | None = None,
        *,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None: ...

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        config: WorkQueueConfig | None = None,
        *,
        codec: Codec[T] | None = None,
        client_id: str | None = None,
    ) -> None:
        super().__init__(client, path, client_id=client_id)
        if config is not None and not isinstance(config, WorkQueueConfig):
            raise InvalidArgumentError(f"config must be a WorkQueueConfig, not {config!r}")
        self.config: WorkQueueConfig = config or WorkQueueConfig()
        """The queue's settings."""
        self.codec: Codec[T] | None = None if codec is None else as_codec(codec)
        """The value codec (``None``: raw bytes, ``str`` accepted and UTF-8 encoded)."""
        base = append_to_path(self.path, "")
        self._items = base + "items/"
        self._claimed = base + "claimed/"
        self._claims = base + "claims/"
        self._attempts = base + "attempts/"
        self._dlq = base + "dlq/"
        self._delayed = base + "delayed/"
        self._lease: SelfHealingLease | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._consumer_lock = asyncio.Lock()
        self._held: dict[str, WorkItem] = {}
        self._prefetched: tuple[float, _Snapshot] | None = None
        self._taken_by: object = None  # the receive call that took the lease
        self._waits = _Waits()
        self._reach = 1  # candidates the next claim tries (see queue._next_reach)
        self._lease_listeners = ListenerSet("lease", self._record_exception_at)

    # ------------------------------------------------------------------ producing

    async def enqueue(self, value: T | str, delay: float | None = None) -> str:
        """Add ``value``; returns its id. With ``delay`` (seconds) it stays invisible until it
        matures (a delay <= 0 enqueues at once).

        Example::

            await queue.enqueue(b"send-welcome")
            await queue.enqueue(b"send-reminder", delay=3600)
        """
        self._check_open()
        data = _encode(self.codec, value)
        if delay is not None and (
            isinstance(delay, bool)
            or not isinstance(delay, (int, float))
            or not math.isfinite(delay)
        ):
            raise InvalidArgumentError(f"delay must be a finite number of seconds, got {delay!r}")

        def key() -> list[str]:
            if delay is None or delay <= 0:
                return [f"{self._items}{pad(_key_millis(), 19)}-{random_token(3)}"]
            ready = _now_millis() + round(delay * 1000)
            return [f"{self._delayed}{pad(ready, 19)}-{random_token(3)}"]

        keys = await _create(self._client, key, [data])
        return keys[0].rsplit("/", 1)[-1]

    async def enqueue_all(self, values: Iterable[T | str]) -> list[str]:
        """Add every value in **one** transaction (all visible at once, in argument order, or
        none); returns their ids. An empty iterable is a no-op.

        Example::

            ids = await queue.enqueue_all([b"a", b"b", b"c"])
        """
        self._check_open()
        data = [_encode(self.codec, v) for v in _check_batch(values)]
        if not data:
            return []

        def keys() -> list[str]:
            millis = pad(_key_millis(), 19)
            return [
                f"{self._items}{millis}-{pad(i, 5)}-{random_token(3)}" for i in range(len(data))
            ]

        return [k.rsplit("/", 1)[-1] for k in await _create(self._client, keys, data)]

    # ------------------------------------------------------------------ consuming

    @overload
    async def receive(self, timeout: float) -> WorkItem | None: ...

    @overload
    async def receive(self, timeout: None = None) -> WorkItem: ...

    async def receive(self, timeout: float | None = None) -> WorkItem | None:
        """Claim the next item, waiting for one (at most ``timeout`` seconds, > 0); ``None`` if
        the time ran out. Cancellation consumes nothing.

        Example::

            item = await queue.receive(timeout=30)
            if item is not None:
                await item.ack()
        """
        limit = None if timeout is None else _check_timeout(timeout)
        return await self._receive(wait=True, timeout=limit)

    async def try_receive(self) -> WorkItem | None:
        """Claim the next item if one is ready; ``None`` at once otherwise.

        Example::

            item = await queue.try_receive()
        """
        return await self._receive(wait=False, timeout=None)

    async def size(self) -> int:
        """How many items wait to be received (not delayed, in flight or dead): one count read,
        advisory.

        Example::

            print("backlog:", await queue.size())
        """
        self._check_open()
        return await self._client.count(self._items)

    @property
    def lease_id(self) -> int:
        """The consumer lease's id (0 before the first claim, while healing, and after close)."""
        return self._lease.current_lease_id if self._lease is not None else 0

    def add_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with each consumer-lease event.

        ``LeaseExpired`` means every outstanding claim of this consumer is gone (the items are
        reclaimable, their ``ack()`` returns ``False``) even though the lease then heals
        (``LeaseRestored``) for future claims; ``LeaseFailed`` means healing gave up (the next
        claim takes a new lease).

        Example::

            queue.add_lease_listener(lambda event: print("lease:", event))
        """
        self._lease_listeners.add(listener)

    def remove_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._lease_listeners.remove(listener)

    # ------------------------------------------------------------------ dead letters

    async def dead_letters(self) -> list[DeadLetter[T]]:
        """The dead-lettered items, oldest id first (one read).

        Example::

            for dead in await queue.dead_letters():
                print(f"{dead.id} failed {dead.attempts} times: {dead.value!r}")
        """
        self._check_open()
        result = await self._client.txn(
            [], [Op.get(self._dlq, prefix=True), Op.get(self._attempts, prefix=True)]
        )
        dead, counts = result.responses
        assert isinstance(dead, RangeResult)
        assert isinstance(counts, RangeResult)
        attempts = {_name(kv.key): _attempts([kv]) for kv in counts.kvs}
        return [
            DeadLetter(_name(kv.key), _decode(self.codec, kv.value), attempts.get(_name(kv.key), 0))
            for kv in dead.kvs
        ]

    async def requeue_dead_letter(self, item_id: str) -> bool:
        """Put a dead letter back in the queue (at its original place) with a fresh attempt
        count; ``False`` if there is no such dead letter.

        Example::

            await queue.requeue_dead_letter("0001700000000000-abc")
        """
        self._check_open()
        name = _check_id(item_id)
        kv = await self._client.get(self._dlq + name)
        if kv is None:
            return False
        result = await self._client.txn(
            [Cmp.mod_revision(kv.key) == kv.mod_revision],
            [
                Op.put(self._items + name, kv.value),
                Op.delete(kv.key),
                Op.delete(self._attempts + name),
            ],
        )
        return result.succeeded

    async def purge_dead_letter(self, item_id: str) -> bool:
        """Delete a dead letter for good; ``False`` if there is no such dead letter.

        Example::

            await queue.purge_dead_letter("0001700000000000-abc")
        """
        self._check_open()
        name = _check_id(item_id)
        kv = await self._client.get(self._dlq + name)
        if kv is None:
            return False
        result = await self._client.txn(
            [Cmp.mod_revision(kv.key) == kv.mod_revision],
            [Op.delete(kv.key), Op.delete(self._attempts + name)],
        )
        return result.succeeded

    # ------------------------------------------------------------------ receive internals

    def _snapshot_ops(self, *, orphans: bool = True) -> list[AnyOp]:
        """The reads of a snapshot: the first items, the first delayed item and -- unless a
        claim carries the snapshot (the sweeps and the next fresh snapshot look) -- the
        in-flight and marker counts that reveal orphans."""
        ops: list[AnyOp] = [
            Op.get(self._items, prefix=True, limit=_WINDOW),
            Op.get(self._delayed, prefix=True, limit=1, keys_only=True),
        ]
        if orphans:
            ops += [
                Op.get(self._claimed, prefix=True, count_only=True),
                Op.get(self._claims, prefix=True, count_only=True),
            ]
        return ops

    @staticmethod
    def _parse(responses: list[Any], revision: int) -> _Snapshot:
        items, delayed, *counts = responses
        orphans = bool(counts) and counts[0].count > counts[1].count
        return _Snapshot(
            list(items.kvs), delayed.kvs[0] if delayed.kvs else None, orphans, revision
        )

    def _fresh_prefetch(self) -> _Snapshot | None:
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is None or time.monotonic() - prefetched[0] > _PREFETCH_TTL:
            return None
        prefetched[1].kept = True
        return prefetched[1]

    async def _snapshot(self) -> _Snapshot:
        result = await self._client.txn([], self._snapshot_ops())
        return self._parse(result.responses, result.revision)

    async def _receive(self, *, wait: bool, timeout: float | None) -> WorkItem | None:
        self._check_open()
        call = object()
        token = _RECEIVE_CALL.set(call)

        async def give_back_new_lease() -> None:
            # A cancelled (or failed) receive that took the consumer lease gives it back,
            # unless claims made meanwhile need it.
            if self._taken_by is call and not self._held:
                await self._stop_consumer()

        try:
            async with abort_guard(give_back_new_lease, what=f"{self.exception_context}: lease"):
                return await self._receive_loop(wait=wait, timeout=timeout)
        finally:
            _RECEIVE_CALL.reset(token)

    async def _receive_loop(self, *, wait: bool, timeout: float | None) -> WorkItem | None:
        started = time.monotonic()
        # try_receive() does not wait for a healing lease either.
        deadline = started if not wait else None if timeout is None else started + timeout
        snap = self._fresh_prefetch() or await self._snapshot()
        reclaimed = False
        while True:
            self._check_open()
            if snap.delayed is not None and _ready_millis(snap.delayed) <= _now_millis():
                await self._promote_matured()
                snap = await self._snapshot()
                continue
            if snap.orphans and not reclaimed:
                reclaimed = True  # once per pass: a lost race must not spin
                if await self._reclaim_orphans():
                    snap = await self._snapshot()
                    continue
            if snap.items:
                outcome = await self._claim(snap.items, deadline)
                if isinstance(outcome, WorkItem):
                    if wait:
                        _record_latency(self._client, _METRIC, started)
                    return outcome
                if outcome is None:
                    return None  # the deadline passed while the consumer lease was healing
                snap, reclaimed = outcome, False
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if not wait or (remaining is not None and remaining <= 0):
                return None
            if snap.kept:
                # Park only on a fresh read: a watch anchored below the current revision is
                # caught up by etcd's 100 ms sync loop, so a hand-off would lag by up to that.
                snap, reclaimed = await self._snapshot(), False
                continue
            wait_for = self.config.sweep_interval
            if remaining is not None:
                wait_for = min(wait_for, remaining)
            if snap.delayed is not None:
                due = (_ready_millis(snap.delayed) - _now_millis()) / 1000
                wait_for = min(wait_for, max(due, 0.001))
            with self._waits.scope():
                await self._wait_for_items(snap.revision, wait_for)
            self._check_open()
            snap, reclaimed = await self._snapshot(), False

    async def _wait_for_items(self, revision: int, timeout: float) -> bool:
        return await wait_for_put_under(
            self._client,
            self._items,
            after_revision=revision,
            timeout=timeout,
            on_recovery=self._on_recovery_event,
        )

    def _claim_ops(self, head: KeyValue, attempt: int, lease_id: int) -> list[AnyOp]:
        name = _name(head.key)
        return [
            Op.delete(head.key),
            Op.put(self._claimed + name, head.value),
            Op.put(self._claims + name, self.client_id, lease=lease_id),
            Op.put(self._attempts + name, INT32.encode(attempt)),
        ]

    def _claim_chain(self, window: list[KeyValue], lease_id: int) -> list[AnyOp]:
        """The operations of one transaction that claims the first item of ``window`` still
        present, trying them in queue order as nested transactions, then reads a snapshot.

        The head (``window[0]``), if present, stops the chain: a first delivery is claimed
        (attempt 1), a redelivery only reports its attempt count (it is claimed next, with
        ``attempt + 1``) -- so a redelivered head is never passed over. The other candidates
        (tried only under contention) are claimed if present and never delivered before. The
        snapshot shows the queue right after the claim (the next receive may start from it)
        or, if nothing was claimed, why.
        """
        failure: list[AnyOp] = []
        for kv in reversed(window[1:]):
            failure = [
                Op.txn(
                    [
                        Cmp.mod_revision(kv.key) == kv.mod_revision,
                        Cmp.missing(self._attempts + _name(kv.key)),
                    ],
                    self._claim_ops(kv, 1, lease_id),
                    failure,
                )
            ]
        head = window[0]
        attempts_key = self._attempts + _name(head.key)
        first_delivery = Op.txn(
            [Cmp.missing(attempts_key)],
            self._claim_ops(head, 1, lease_id),
            [Op.get(attempts_key)],
        )
        chain = Op.txn([Cmp.mod_revision(head.key) == head.mod_revision], [first_delivery], failure)
        return [chain, *self._snapshot_ops(orphans=False)]

    async def _claim(
        self, items: list[KeyValue], deadline: float | None
    ) -> WorkItem | _Snapshot | None:
        """Claim the first of ``items`` still present: the item, a fresh snapshot if none was,
        or None if the deadline passed while the consumer lease was healing."""
        window, size = [items[0]], len(items[0].value)
        for kv in items[1 : self._reach]:  # well under the server's request size limit
            size += len(kv.value)
            if size > _CHAIN_BYTES:
                break
            window.append(kv)
        dead = 0  # a lease id the server no longer knows
        while True:
            lease_id = await self._consumer_lease(deadline, dead)
            if not lease_id:
                return None
            try:
                return await self._claim_with(window, lease_id)
            except LeaseNotFoundError:
                # The lease died (revoked, expired) before the keeper noticed: wait for the
                # healed one instead of retrying with a dead id.
                dead = lease_id

    async def _claim_with(self, window: list[KeyValue], lease_id: int) -> WorkItem | _Snapshot:
        result = await _commit(
            self._client,
            [],
            self._claim_chain(window, lease_id),
            [],
            undo=functools.partial(self._undo_chain, window),
            what=f"{self.exception_context}: undoing a cancelled claim",
        )
        chain, *snapshot = result.responses
        assert isinstance(chain, TxnResult)
        level, reached = _outcome(chain)
        self._reach = _next_reach(self._reach, level if reached.succeeded else None, _WINDOW)
        if not reached.succeeded:
            return self._parse(snapshot, result.revision)
        head = window[level]
        first = reached.responses[0]
        if level > 0 or (isinstance(first, TxnResult) and first.succeeded):
            return self._claimed_item(head, 1, snapshot, result.revision)
        assert isinstance(first, TxnResult)
        counts = first.responses[0]
        assert isinstance(counts, RangeResult)
        return await self._claim_again(head, counts.kvs[0], lease_id)

    async def _claim_again(
        self, head: KeyValue, known: KeyValue, lease_id: int
    ) -> WorkItem | _Snapshot:
        """Claim a redelivery: ``attempt + 1``, guarded on the attempt count read."""
        attempts_key = self._attempts + _name(head.key)
        attempt = _attempts([known]) + 1
        result = await _commit(
            self._client,
            [
                Cmp.mod_revision(head.key) == head.mod_revision,
                Cmp.mod_revision(attempts_key) == known.mod_revision,
            ],
            [*self._claim_ops(head, attempt, lease_id), *self._snapshot_ops(orphans=False)],
            self._snapshot_ops(orphans=False),
            undo=lambda done: self._unclaim(head, known, done.revision),
            what=f"{self.exception_context}: undoing a cancelled claim",
        )
        if result.succeeded:
            return self._claimed_item(head, attempt, result.responses[4:], result.revision)
        return self._parse(result.responses, result.revision)

    def _claimed_item(
        self, head: KeyValue, attempt: int, responses: list[Any], revision: int
    ) -> WorkItem:
        # The state right after this claim: the next receive may start from it (saving a
        # round trip) while it is fresh. The claim of a stale candidate just fails over.
        self._prefetched = (time.monotonic(), self._parse(responses, revision))
        name = _name(head.key)
        item = WorkItem(
            name,
            _decode(self.codec, head.value),
            attempt,
            claim=_Claim(self, head.value, revision),
        )
        self._held[name] = item
        return item

    async def _undo_chain(self, window: list[KeyValue], result: TxnResult) -> None:
        chain = result.responses[0]
        assert isinstance(chain, TxnResult)
        level, reached = _outcome(chain)
        if not reached.succeeded:
            return
        first = reached.responses[0]
        if level > 0 or (isinstance(first, TxnResult) and first.succeeded):
            await self._unclaim(window[level], None, result.revision)

    async def _unclaim(self, head: KeyValue, known: KeyValue | None, revision: int) -> None:
        """Undo a claim that committed for a cancelled receive: as if it never happened."""
        name = _name(head.key)
        claims_key = self._claims + name
        restore = (
            Op.delete(self._attempts + name)
            if known is None
            else Op.put(self._attempts + name, known.value)
        )
        await self._client.txn(
            [
                Cmp.value(claims_key) == self.client_id,
                Cmp.create_revision(claims_key) == revision,
            ],
            [
                Op.put(head.key, head.value),
                Op.delete(self._claimed + name),
                Op.delete(claims_key),
                restore,
            ],
        )

    # ------------------------------------------------------------------ the consumer lease

    async def _consumer_lease(self, deadline: float | None, dead: int = 0) -> int:
        """The consumer lease's id, taken now if needed (never ``dead``); 0 if ``deadline``
        passed while the lease was healing."""
        while True:
            async with self._consumer_lock:
                self._check_open()
                lease = self._lease
                if lease is None or lease.has_failed:
                    if lease is not None:
                        await self._stop_consumer()
                    lease = await self._start_consumer()
                    self._taken_by = _RECEIVE_CALL.get()
            if lease.current_lease_id and lease.current_lease_id != dead:
                return lease.current_lease_id
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            await asyncio.sleep(_LEASE_POLL)

    async def _start_consumer(self) -> SelfHealingLease:
        lease = self._client.self_healing_lease(self.config.visibility_timeout, _heal_forward)
        lease.add_listener(self._on_lease_event)
        start = asyncio.ensure_future(lease.start())
        start.add_done_callback(_retrieve)

        async def give_back() -> None:
            with contextlib.suppress(Exception):
                await start
            await lease.aclose()

        async with abort_guard(give_back, what=f"{self.exception_context}: revoke new lease"):
            await asyncio.shield(start)
        self._lease = lease
        self._sweeper = self._spawn(self._sweep_forever(), "sweeper")
        log.debug("%s: consumer lease %x taken", self.exception_context, lease.current_lease_id)
        return lease

    async def _stop_consumer(self) -> None:
        self._taken_by = None
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sweeper
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.aclose()

    def _on_lease_event(self, event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        if isinstance(event, LeaseExpired):
            self._held.clear()  # every marker went with the lease
        if not isinstance(event, LeaseRestored):
            self._record_exception(LeaseEventError(event), "lease")
        self._lease_listeners.emit(event)

    def _record_exception_at(self, where: str, exc: BaseException) -> None:
        self._record_exception(exc, where)

    # ------------------------------------------------------------------ settling

    async def _settle(self, item: WorkItem, *, requeue: bool) -> bool:
        claim = item._claim
        if claim.settled or self.is_closed:
            return False
        name = item.id
        claims_key = self._claims + name
        ops: list[AnyOp]
        if requeue:
            self._prefetched = None  # it goes back to the head: a kept snapshot lacks it
            ops = [
                Op.put(self._items + name, claim.data),
                Op.delete(claims_key),
                Op.delete(self._claimed + name),
            ]
        else:
            ops = [
                Op.delete(claims_key),
                Op.delete(self._claimed + name),
                Op.delete(self._attempts + name),
            ]
        result = await self._client.txn(
            [
                Cmp.value(claims_key) == self.client_id,
                Cmp.create_revision(claims_key) == claim.revision,
            ],
            ops,
        )
        claim.settled = True
        if self._held.get(name) is item:
            del self._held[name]
        if not result.succeeded:
            log.info("%s: the claim on %s was lost before settling", self.exception_context, name)
        return result.succeeded

    async def _release(self, item: WorkItem) -> None:
        """Return an unsettled item as an orphan would be returned (or dead-lettered)."""
        claim = item._claim
        claim.settled = True
        name = item.id
        dead = item.attempt >= self.config.max_deliveries
        claims_key = self._claims + name
        await self._client.txn(
            [
                Cmp.value(claims_key) == self.client_id,
                Cmp.create_revision(claims_key) == claim.revision,
            ],
            [
                Op.delete(claims_key),
                Op.delete(self._claimed + name),
                Op.put((self._dlq if dead else self._items) + name, claim.data),
            ],
        )

    # ------------------------------------------------------------------ sweeping

    async def _reclaim_orphans(self) -> int:
        """Return every orphaned in-flight item to its original key (or the dead letters)."""
        self._prefetched = None
        listing = await self._client.txn(
            [],
            [
                Op.get(self._claimed, prefix=True, keys_only=True),
                Op.get(self._claims, prefix=True, keys_only=True),
            ],
        )
        claimed, claims = listing.responses
        assert isinstance(claimed, RangeResult)
        assert isinstance(claims, RangeResult)
        live = {_name(kv.key) for kv in claims.kvs}
        returned = 0
        for kv in claimed.kvs:
            name = _name(kv.key)
            if name not in live and await self._reclaim(name, kv.mod_revision):
                returned += 1
        return returned

    async def _reclaim(self, name: str, mod_revision: int) -> bool:
        claimed_key = self._claimed + name
        read = await self._client.txn([], [Op.get(claimed_key), Op.get(self._attempts + name)])
        payload, counts = read.responses
        assert isinstance(payload, RangeResult)
        assert isinstance(counts, RangeResult)
        if not payload.kvs or payload.kvs[0].mod_revision != mod_revision:
            return False
        attempts = _attempts(counts.kvs)
        dead = attempts >= self.config.max_deliveries
        result = await self._client.txn(
            [Cmp.missing(self._claims + name), Cmp.mod_revision(claimed_key) == mod_revision],
            [
                Op.delete(claimed_key),
                Op.put((self._dlq if dead else self._items) + name, payload.kvs[0].value),
            ],
        )
        if result.succeeded and dead:
            log.warning(
                "%s: %s dead-lettered after %d deliveries", self.exception_context, name, attempts
            )
        elif result.succeeded:
            log.info("%s: orphaned %s returned to the queue", self.exception_context, name)
        return result.succeeded

    async def _promote_matured(self) -> int:
        """Move every matured delayed item to ``items/`` under its ready-time name."""
        self._prefetched = None
        promoted = 0
        rename: str | None = None
        while True:
            read = await self._client.range(self._delayed, prefix=True, limit=1)
            if not read.kvs:
                return promoted
            head = read.kvs[0]
            if _ready_millis(head) > _now_millis():
                return promoted
            target = self._items + (rename or _name(head.key))
            result = await self._client.txn(
                [Cmp.mod_revision(head.key) == head.mod_revision, Cmp.missing(target)],
                [Op.delete(head.key), Op.put(target, head.value)],
                [Op.get(head.key, keys_only=True), Op.get(target, keys_only=True)],
            )
            if result.succeeded:
                promoted, rename = promoted + 1, None
                continue
            source, clash = result.responses
            assert isinstance(source, RangeResult)
            assert isinstance(clash, RangeResult)
            unchanged = source.kvs and source.kvs[0].mod_revision == head.mod_revision
            # Another producer's item took the name (same millisecond, same suffix): promote
            # under a fresh suffix. Otherwise another consumer promoted it: re-read.
            rename = (
                f"{pad(_ready_millis(head), 19)}-{random_token(3)}"
                if unchanged and clash.kvs
                else None
            )

    async def _sweep_forever(self) -> None:
        period = self.config.sweep_interval
        await asyncio.sleep(period + random.uniform(0, period / 2))  # fleets do not sweep in step
        while True:
            try:
                snap = await self._snapshot()
                if snap.delayed is not None and _ready_millis(snap.delayed) <= _now_millis():
                    await self._promote_matured()
                if snap.orphans:
                    await self._reclaim_orphans()
            except EtcdRecipeError as exc:
                log.debug("%s: sweep failed: %s", self.exception_context, exc)
            except Exception as exc:
                self._record_exception(exc, "sweeper")
            await asyncio.sleep(period)

    # ------------------------------------------------------------------ lifecycle

    async def _do_close(self) -> None:
        self._waits.end_all()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
        held = list(self._held.values())
        self._held.clear()
        if held:
            results = await asyncio.gather(
                *(self._release(item) for item in held), return_exceptions=True
            )
            for result in results:
                if isinstance(result, Exception):
                    log.info("%s: returning an item on close failed: %s", self.path, result)
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.aclose()
