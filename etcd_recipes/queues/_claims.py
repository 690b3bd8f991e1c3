"""Claiming and settling work-queue items (not public; the transactions behind ``receive()``,
``ack()``, ``requeue()`` and closing).

A claim is one transaction: ``If(mod_revision(items/id) == observed, attempts unchanged)
Then(delete items/id, put claimed/id, put claims/id on the lease, put attempts/id =
attempt)``; under contention it goes on, nested in the same transaction, to the next item read
that is still present and never delivered, and it reads the queue's next items right after the
claim. A lone candidate needs no nesting: ``If(mod_revision(items/id) == observed,
attempts/id missing)`` with the claim's writes, else the reads that tell a redelivery (claimed
next, with ``attempt + 1``) from a gone item. Settling is guarded on the claim marker still
being this consumer's (value **and** create revision), so a stale item cannot settle a later
claim of the same consumer.

The consumers of one queue in one process (one client) share what they are claiming and what
they took lately (:class:`LocalClaims`): a claim's first candidate is one no sibling is after
and none took, so siblings reading the same snapshot spread over its items instead of racing
for its head (each claim then stays one compare, no chain). This is a hint only -- every claim
still compares the item's mod revision -- and it never hides an item from all of them: when
every candidate is some sibling's target, the claim races for them as before.

Guaranteed: a claim that committed for a cancelled receive is undone (payload back under its
key, attempts as before) before the cancellation is re-raised; a redelivered head is never
passed over (it is claimed next, with ``attempt + 1``); a settle whose outcome a transport
failure hid is retried and, if the retry's compare fails, tells "we had settled it" from "the
claim was lost" (see :meth:`Claimer.settle`). Not guaranteed: that a settle succeeds -- it
returns ``False`` when the claim was lost, and raises once an outage outlasts its budget.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.keys import pad
from .._core.logctx import library_logger
from .._core.txn import AnyOp, Cmp, Compare, Op
from ..codecs import INT32
from ..errors import EtcdConnectionError, EtcdTimeoutError
from ..types import KeyValue, RangeResult, TxnResult
from ._layout import WINDOW, HeadReader, Snapshot, attempts_in, item_name
from ._produce import clock_millis
from ._sweep import return_ops
from ._take import commit, next_reach, outcome

if TYPE_CHECKING:
    from ..client import EtcdClient
    from .item import WorkItem

log = library_logger("etcd_recipes.work_queue")

_CHAIN_BYTES = 256 * 1024  # payload bytes one claim transaction may carry
_TAKEN = 256  # claimed items (key, mod revision) the consumers of a process remember
Version = tuple[bytes, int]  # an item as read: its key and mod revision


class LocalClaims:
    """What the consumers of one queue on one client are after and took lately: item versions
    (key, mod revision). A version taken is gone for good (a requeued item comes back with a
    new mod revision), so skipping it is always right; a version a sibling is after is skipped
    while another candidate is free.

    Example::

        from etcd_recipes.queues._claims import LocalClaims

        claims = LocalClaims()
        claims.took((b"/q/items/1", 7))
        assert (b"/q/items/1", 7) in claims.taken
    """

    __slots__ = ("busy", "order", "taken")

    def __init__(self) -> None:
        self.busy: dict[Version, int] = {}  # first candidates of claims in flight (counted)
        self.taken: set[Version] = set()
        self.order: deque[Version] = deque()

    def took(self, version: Version) -> None:
        self.taken.add(version)
        self.order.append(version)
        if len(self.order) > _TAKEN:
            self.taken.discard(self.order.popleft())


_LOCAL: weakref.WeakKeyDictionary[EtcdClient, dict[str, LocalClaims]] = weakref.WeakKeyDictionary()


def local_claims(client: EtcdClient, items: str) -> LocalClaims:
    """The :class:`LocalClaims` shared by every consumer of the queue at ``items`` on
    ``client``."""
    return _LOCAL.setdefault(client, {}).setdefault(items, LocalClaims())


@dataclass
class Claimed:
    """A committed claim: the item's key-value as read, its attempt, the claim transaction's
    revision (= the marker's create revision) and the queue right after the claim."""

    head: KeyValue
    attempt: int
    revision: int
    after: Snapshot
    context: bytes | None = None  # the producer's trace context (read only with tracing on)


class Claimer:
    """The claim transactions of one consumer of one queue."""

    __slots__ = ("client", "client_id", "context", "keys", "local", "reach", "reads", "trace")

    def __init__(
        self, client: EtcdClient, reads: HeadReader, client_id: str, context: str, trace: bool
    ) -> None:
        self.client = client
        self.reads = reads  # the snapshot reads, bounded near the queue's head
        self.keys = keys = reads.keys
        self.client_id = client_id
        self.trace = trace  # read trace/<id> in the claim transaction
        self.context = context
        self.reach = 1  # candidates the next claim tries (see _take.next_reach)
        self.local = local_claims(client, keys.items)

    @property
    def what(self) -> str:
        """What the cleanup of a cancelled claim is called (made when needed: a parked consumer
        keeps no string of it)."""
        return f"{self.context}: undoing a cancelled claim"

    def window(self, items: list[KeyValue], *, further: bool = True) -> list[KeyValue] | None:
        """The candidates the next claim tries: the first item no sibling took (or is after,
        while another is free), then as many of the next as its reach allows, well under the
        server's request size limit; empty when siblings took every item read; ``None``
        (only with ``further``) when siblings are after every other item read and a full
        window was read: more may follow (:meth:`read_further`)."""
        taken, busy, read = self.local.taken, self.local.busy, len(items)
        if taken:
            items = [kv for kv in items if (kv.key, kv.mod_revision) not in taken]
            if not items:
                return []
        if busy:
            free = [kv for kv in items if (kv.key, kv.mod_revision) not in busy]
            if not free and further and read >= WINDOW:
                return None
            items = free or items
        window, size = [items[0]], len(items[0].value)
        for kv in items[1 : self.reach]:
            size += len(kv.value)
            if size > _CHAIN_BYTES:
                break
            window.append(kv)
        return window

    async def read_further(self) -> list[KeyValue]:
        """The first items of the queue, as many more than a window as siblings are after."""
        op = self.reads.horizon.op(limit=WINDOW + len(self.local.busy))
        read = await self.client.range(op.key, range_end=op.range_end, limit=op.limit)
        self.reads.horizon.observe(op, read)
        return read.kvs

    def claim_ops(self, head: KeyValue, attempt: int, lease_id: int) -> list[AnyOp]:
        name = item_name(head.key)
        ops: list[AnyOp] = [
            Op.delete(head.key),
            Op.put(self.keys.claimed + name, head.value),
            Op.put(self.keys.claims + name, self.client_id, lease=lease_id),
            Op.put(self.keys.attempts + name, INT32.encode(attempt)),
        ]
        if self.trace:  # a read: nothing more is written, with tracing on or off
            ops.append(Op.get(self.keys.trace + name))
        return ops

    def context_in(self, responses: list[Any]) -> bytes | None:
        """The trace context read by :meth:`claim_ops` (``None``: tracing off, or none)."""
        if not self.trace or len(responses) < 5:
            return None
        found = responses[4]
        return found.kvs[0].value if isinstance(found, RangeResult) and found.kvs else None

    def claim_chain(
        self, window: list[KeyValue], lease_id: int, snapshot_ops: list[AnyOp]
    ) -> list[AnyOp]:
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
                        Cmp.missing(self.keys.attempts + item_name(kv.key)),
                    ],
                    self.claim_ops(kv, 1, lease_id),
                    failure,
                )
            ]
        head = window[0]
        attempts_key = self.keys.attempts + item_name(head.key)
        first_delivery = Op.txn(
            [Cmp.missing(attempts_key)],
            self.claim_ops(head, 1, lease_id),
            [Op.get(attempts_key)],
        )
        chain = Op.txn([Cmp.mod_revision(head.key) == head.mod_revision], [first_delivery], failure)
        return [chain, *snapshot_ops]

    async def claim(self, window: list[KeyValue], lease_id: int) -> Claimed | Snapshot:
        """Claim the first of ``window`` still present: the claim, or a fresh snapshot if none
        was (raises :class:`~etcd_recipes.errors.LeaseNotFoundError` for a dead lease). Its
        siblings skip ``window[0]`` meanwhile, and the item claimed afterwards."""
        target = (window[0].key, window[0].mod_revision)
        busy = self.local.busy
        busy[target] = busy.get(target, 0) + 1
        try:
            if len(window) == 1:
                claimed = await self._claim_one(window[0], lease_id)
            else:
                claimed = await self._claim_chain(window, lease_id)
        finally:
            if (left := busy.pop(target) - 1) > 0:
                busy[target] = left
        if isinstance(claimed, Claimed):
            self.local.took((claimed.head.key, claimed.head.mod_revision))
        return claimed

    async def _claim_one(self, head: KeyValue, lease_id: int) -> Claimed | Snapshot:
        """Claim a lone candidate in a flat transaction: a first delivery at once; else the
        attempt count and the item's version, read in the failure branch, tell a redelivery
        (claimed next, with ``attempt + 1``) from an item that is gone."""
        attempts_key = self.keys.attempts + item_name(head.key)
        claim_ops = self.claim_ops(head, 1, lease_id)
        snapshot_ops = self.reads.ops(orphans=False)  # the reads after a claim
        result = await commit(
            self.client,
            [Cmp.mod_revision(head.key) == head.mod_revision, Cmp.missing(attempts_key)],
            [*claim_ops, *snapshot_ops],
            [Op.get(attempts_key), Op.get(head.key, keys_only=True), *snapshot_ops],
            undo=lambda done: self._unclaim(head, None, done.revision),
            what=self.what,
        )
        if result.succeeded:
            self.reach = next_reach(self.reach, 0, WINDOW)
            after = self.reads.parse(
                snapshot_ops, result.responses[len(claim_ops) :], result.revision
            )
            return Claimed(head, 1, result.revision, after, self.context_in(result.responses))
        counts, present, *snapshot = result.responses
        assert isinstance(counts, RangeResult)
        assert isinstance(present, RangeResult)
        if counts.kvs and present.kvs and present.kvs[0].mod_revision == head.mod_revision:
            self.reach = next_reach(self.reach, 0, WINDOW)
            return await self._claim_again(head, counts.kvs[0], lease_id)
        self.reach = next_reach(self.reach, None, WINDOW)
        return self.reads.parse(snapshot_ops, snapshot, result.revision)

    async def _claim_chain(self, window: list[KeyValue], lease_id: int) -> Claimed | Snapshot:
        snapshot_ops = self.reads.ops(orphans=False)
        result = await commit(
            self.client,
            [],
            self.claim_chain(window, lease_id, snapshot_ops),
            [],
            undo=functools.partial(self._undo_chain, window),
            what=self.what,
        )
        chain, *snapshot = result.responses
        assert isinstance(chain, TxnResult)
        level, reached = outcome(chain)
        self.reach = next_reach(self.reach, level if reached.succeeded else None, WINDOW)
        if not reached.succeeded:
            return self.reads.parse(snapshot_ops, snapshot, result.revision)
        head = window[level]
        first = reached.responses[0]
        if level > 0 or (isinstance(first, TxnResult) and first.succeeded):
            claimed = reached if level > 0 else first
            assert isinstance(claimed, TxnResult)
            after = self.reads.parse(snapshot_ops, snapshot, result.revision)
            context = self.context_in(claimed.responses)
            return Claimed(head, 1, result.revision, after, context)
        assert isinstance(first, TxnResult)
        counts = first.responses[0]
        assert isinstance(counts, RangeResult)
        return await self._claim_again(head, counts.kvs[0], lease_id)

    async def _claim_again(
        self, head: KeyValue, known: KeyValue, lease_id: int
    ) -> Claimed | Snapshot:
        """Claim a redelivery: ``attempt + 1``, guarded on the attempt count read."""
        attempts_key = self.keys.attempts + item_name(head.key)
        attempt = attempts_in([known]) + 1
        snapshot_ops = self.reads.ops(orphans=False)
        claim_ops = self.claim_ops(head, attempt, lease_id)
        result = await commit(
            self.client,
            [
                Cmp.mod_revision(head.key) == head.mod_revision,
                Cmp.mod_revision(attempts_key) == known.mod_revision,
            ],
            [*claim_ops, *snapshot_ops],
            snapshot_ops,
            undo=lambda done: self._unclaim(head, known, done.revision),
            what=self.what,
        )
        if result.succeeded:
            after = self.reads.parse(
                snapshot_ops, result.responses[len(claim_ops) :], result.revision
            )
            context = self.context_in(result.responses)
            return Claimed(head, attempt, result.revision, after, context)
        return self.reads.parse(snapshot_ops, result.responses, result.revision)

    async def _undo_chain(self, window: list[KeyValue], result: TxnResult) -> None:
        chain = result.responses[0]
        assert isinstance(chain, TxnResult)
        level, reached = outcome(chain)
        if not reached.succeeded:
            return
        first = reached.responses[0]
        if level > 0 or (isinstance(first, TxnResult) and first.succeeded):
            await self._unclaim(window[level], None, result.revision)

    async def _unclaim(self, head: KeyValue, known: KeyValue | None, revision: int) -> None:
        """Undo a claim that committed for a cancelled receive: as if it never happened."""
        name = item_name(head.key)
        attempts_key = self.keys.attempts + name
        restore = Op.delete(attempts_key) if known is None else Op.put(attempts_key, known.value)
        await self.client.txn(
            self.held(name, revision),
            [
                Op.put(head.key, head.value),
                Op.delete(self.keys.claimed + name),
                Op.delete(self.keys.claims + name),
                restore,
            ],
        )

    # ------------------------------------------------------------------ settling

    def held(self, name: str, revision: int) -> list[Compare]:
        """The compares of "the claim of ``name`` made at ``revision`` is still ours"."""
        claims_key = self.keys.claims + name
        return [
            Cmp.value(claims_key) == self.client_id,
            Cmp.create_revision(claims_key) == revision,
        ]

    def settle_ops(
        self, name: str, data: bytes, how: str, *, delay: float = 0.0, reason: str | None = None
    ) -> list[AnyOp]:
        """The writes of a settle: ``"ack"`` deletes everything (``trace/<id>`` too, present
        or not: a consumer without tracing leaves nothing behind either); ``"requeue"`` moves the
        payload back to ``items/<id>`` -- or, with a ``delay``, to ``delayed/<ready>-<id>``,
        which is promoted back to ``items/<id>`` -- and ``"dead"`` to ``dlq/<id>`` with its
        ``reason`` beside it; both keep the attempt count."""
        keys = self.keys
        ops: list[AnyOp] = [Op.delete(keys.claims + name), Op.delete(keys.claimed + name)]
        if how == "ack":
            return [*ops, Op.delete(keys.attempts + name), Op.delete(keys.trace + name)]
        if how == "dead":
            return [*ops, Op.put(keys.dlq + name, data), Op.put(keys.reasons + name, reason or "")]
        ready = pad(clock_millis() + round(delay * 1000), 19)
        return [*ops, Op.put(f"{keys.delayed}{ready}-{name}" if delay else keys.items + name, data)]

    async def settle(
        self, name: str, revision: int, lease_id: int, ops: list[AnyOp], budget: float
    ) -> bool:
        """Run a settle guarded on the claim still being ours; ``False`` if it was lost.

        A transport failure leaves the outcome unknown: the settle is retried (for up to
        ``budget`` seconds). A retry whose compare fails reads the marker: present, it is
        another claim's (its create revision differs): ``False``; gone while the lease it
        lived on is still alive, only a transaction can have deleted it -- and only this
        consumer's guarded ones do: the earlier attempt had landed, ``True``.
        """
        marker = self.keys.claims + name
        started, failures, uncertain = time.monotonic(), 0, False
        while True:
            try:
                result = await self.client.txn(self.held(name, revision), ops, [Op.get(marker)])
            except (EtcdConnectionError, EtcdTimeoutError):
                failures += 1
                left = budget - (time.monotonic() - started)
                if left <= 0:
                    raise
                uncertain = True
                await asyncio.sleep(min(left, 0.1 * 2 ** min(failures, 4)))
                continue
            if result.succeeded or not uncertain:
                return result.succeeded
            found = result.responses[0]
            assert isinstance(found, RangeResult)
            if found.kvs:
                return False
            info = await self.client.lease_time_to_live(lease_id)
            return info.ttl > 0

    async def give_back(self, item: WorkItem[Any], max_deliveries: int) -> None:
        """Return an unsettled item as an orphan would be returned (or dead-lettered, on its
        last allowed delivery): what closing does with the items it holds."""
        claim = item._claim
        claim.settled = True
        dead = item.attempt >= max_deliveries
        await self.release(item.id, claim.data, claim.revision, dead=dead, attempts=item.attempt)

    async def give_back_all(
        self, items: list[WorkItem[Any]], max_deliveries: int, path: str
    ) -> None:
        """:meth:`give_back` every item at once (closing); a failure is logged, not raised."""
        if not items:
            return
        results = await asyncio.gather(
            *(self.give_back(item, max_deliveries) for item in items), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                log.info("%s: returning an item on close failed: %s", path, result)

    async def release(
        self, name: str, data: bytes, revision: int, *, dead: bool, attempts: int
    ) -> None:
        """Return a held claim as an orphan would be returned (or dead-lettered)."""
        ops = return_ops(self.keys, name, data, dead=dead, attempts=attempts)
        await self.client.txn(
            self.held(name, revision),
            [Op.delete(self.keys.claims + name), Op.delete(self.keys.claimed + name), *ops],
        )
