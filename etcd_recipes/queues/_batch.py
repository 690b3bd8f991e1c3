"""Batched claims and settles of a work queue (not public; behind ``receive_many()`` and
``ack_many()``).

A batch is **one** transaction of nested ones, one per item, each with its own compare: a
claim's is the single claim's (``If(mod_revision(items/id) == observed, attempts/id missing)
Then(delete items/id, put claimed/id, put claims/id on the lease, put attempts/id = 1)``), an
ack's is the single ack's (the claim marker still this consumer's, value and create revision).
So an item that another consumer took, or whose claim was lost, fails alone and the rest
commit; the outer transaction reads the queue's next items, as a single claim does.

Guaranteed: a batch claim that committed for a cancelled ``receive_many()`` is undone item by
item (payloads back under their keys) before the cancellation is re-raised; a redelivered
item among the candidates is claimed after the batch, with ``attempt + 1`` (its count must be
read first), so it is never passed over; an ack batch whose outcome a transport failure hid is
retried and tells, per item, "we had acked it" from "the claim was lost" as a single settle
does. Not guaranteed: that every candidate is claimed (the ones others took are skipped), or
that a batch is larger than what etcd allows in one transaction (``MAX_BATCH`` items).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from .._core.txn import AnyOp, Cmp, Op
from ..errors import EtcdConnectionError, EtcdTimeoutError
from ..types import KeyValue, RangeResult, TxnResult
from ._claims import Claimed, Claimer
from ._layout import Snapshot, item_name
from ._take import commit

MAX_BATCH = 100  # items per batch transaction (etcd's --max-txn-ops is 128 by default)
_BATCH_BYTES = 1024 * 1024  # payload bytes a batch claim may carry (etcd's limit: 1.5 MiB)


def batch_window(claimer: Claimer, items: list[KeyValue], most: int) -> list[KeyValue]:
    """The candidates of a batch claim: items no sibling took or is after (all of them if
    siblings are after every one), at most ``most`` and ``_BATCH_BYTES`` of payload."""
    taken, busy = claimer.local.taken, claimer.local.busy
    fresh = [kv for kv in items if (kv.key, kv.mod_revision) not in taken]
    free = [kv for kv in fresh if (kv.key, kv.mod_revision) not in busy] or fresh
    window: list[KeyValue] = []
    size = 0
    for kv in free[:most]:
        size += len(kv.value)
        if window and size > _BATCH_BYTES:
            break
        window.append(kv)
    return window


async def claim_many(
    claimer: Claimer, window: list[KeyValue], lease_id: int, limit: int
) -> tuple[list[Claimed], Snapshot]:
    """Claim every item of ``window`` still present and never delivered, in one transaction
    (then each redelivery among them, with its count); the claims in queue order, and the
    queue right after the batch (its next ``limit`` items)."""
    keys = claimer.keys
    snapshot_ops = claimer.reads.ops(orphans=False, limit=limit)
    nested: list[AnyOp] = []
    for kv in window:
        attempts_key = keys.attempts + item_name(kv.key)
        nested.append(
            Op.txn(
                [Cmp.mod_revision(kv.key) == kv.mod_revision, Cmp.missing(attempts_key)],
                claimer.claim_ops(kv, 1, lease_id),
                [Op.get(attempts_key), Op.get(kv.key, keys_only=True)],
            )
        )

    async def undo(result: TxnResult) -> None:
        for kv, part in zip(window, result.responses):
            if isinstance(part, TxnResult) and part.succeeded:
                await claimer._unclaim(kv, None, result.revision)

    busy = claimer.local.busy
    targets = [(kv.key, kv.mod_revision) for kv in window]
    for target in targets:
        busy[target] = busy.get(target, 0) + 1
    try:
        result = await commit(
            claimer.client, [], [*nested, *snapshot_ops], [], undo=undo, what=claimer.what
        )
    finally:
        for target in targets:
            if (left := busy.pop(target) - 1) > 0:
                busy[target] = left
    after = claimer.reads.parse(snapshot_ops, result.responses[len(window) :], result.revision)
    claimed: list[Claimed] = []
    again: list[tuple[KeyValue, KeyValue]] = []
    for kv, part in zip(window, result.responses):
        assert isinstance(part, TxnResult)
        if part.succeeded:
            context = claimer.context_in(part.responses)
            claimed.append(Claimed(kv, 1, result.revision, after, context))
            claimer.local.took((kv.key, kv.mod_revision))
            continue
        counts, present = part.responses
        assert isinstance(counts, RangeResult)
        assert isinstance(present, RangeResult)
        if counts.kvs and present.kvs and present.kvs[0].mod_revision == kv.mod_revision:
            again.append((kv, counts.kvs[0]))  # delivered before: claimed with its count
    for kv, known in again:
        redelivered = await claimer._claim_again(kv, known, lease_id)
        if isinstance(redelivered, Claimed):
            claimer.local.took((kv.key, kv.mod_revision))
            claimed.append(redelivered)
            after = redelivered.after
    return claimed, after


@dataclass
class Settling:
    """One item of a settle batch: its name, its claim's revision and lease, its writes."""

    name: str
    revision: int
    lease_id: int
    ops: list[AnyOp]


async def settle_many(claimer: Claimer, batch: list[Settling], budget: float) -> list[bool]:
    """Run the settles of ``batch`` in one transaction, each guarded on its claim still being
    ours; per item, whether it settled. A transport failure is retried for up to ``budget``
    seconds; after one, an item whose compare fails is told apart as :meth:`Claimer.settle`
    does (marker present: another claim's, ``False``; gone while its lease lives: ours had
    landed, ``True``)."""
    keys = claimer.keys
    nested: list[AnyOp] = [
        Op.txn(claimer.held(s.name, s.revision), s.ops, [Op.get(keys.claims + s.name)])
        for s in batch
    ]
    started, failures, uncertain = time.monotonic(), 0, False
    while True:
        try:
            result = await claimer.client.txn([], nested)
            break
        except (EtcdConnectionError, EtcdTimeoutError):
            failures += 1
            left = budget - (time.monotonic() - started)
            if left <= 0:
                raise
            uncertain = True
            await asyncio.sleep(min(left, 0.1 * 2 ** min(failures, 4)))
    done: list[bool] = []
    alive: dict[int, bool] = {}
    for settling, part in zip(batch, result.responses):
        assert isinstance(part, TxnResult)
        if part.succeeded or not uncertain:
            done.append(part.succeeded)
            continue
        found = part.responses[0]
        assert isinstance(found, RangeResult)
        if found.kvs:
            done.append(False)
            continue
        if settling.lease_id not in alive:
            info = await claimer.client.lease_time_to_live(settling.lease_id)
            alive[settling.lease_id] = info.ttl > 0
        done.append(alive[settling.lease_id])
    return done
