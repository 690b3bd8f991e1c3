"""Claiming and settling work-queue items (not public; the transactions behind ``receive()``,
``ack()``, ``requeue()`` and closing).

A claim is one transaction: ``If(mod_revision(items/id) == observed, attempts unchanged)
Then(delete items/id, put claimed/id, put claims/id on the lease, put attempts/id =
attempt)``; under contention it goes on, nested in the same transaction, to the next item read
that is still present and never delivered, and it reads the queue's next items right after the
claim. Settling is guarded on the claim marker still being this consumer's (value **and**
create revision), so a stale item cannot settle a later claim of the same consumer.

Guaranteed: a claim that committed for a cancelled receive is undone (payload back under its
key, attempts as before) before the cancellation is re-raised; a redelivered head is never
passed over (it is claimed next, with ``attempt + 1``). Not guaranteed: that a settle succeeds
-- it returns ``False`` when the claim was lost.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.txn import AnyOp, Cmp, Compare, Op
from ..codecs import INT32
from ..types import KeyValue, RangeResult, TxnResult
from ._layout import WINDOW, Snapshot, WorkKeys, attempts_in, item_name
from ._take import commit, next_reach, outcome

if TYPE_CHECKING:
    from ..client import EtcdClient


@dataclass
class Claimed:
    """A committed claim: the item's key-value as read, its attempt, the claim transaction's
    revision (= the marker's create revision) and the queue right after the claim."""

    head: KeyValue
    attempt: int
    revision: int
    after: Snapshot


class Claimer:
    """The claim transactions of one consumer of one queue."""

    def __init__(self, client: EtcdClient, keys: WorkKeys, client_id: str, what: str) -> None:
        self.client = client
        self.keys = keys
        self.client_id = client_id
        self.what = what  # for the cleanup of a cancelled claim
        self.reach = 1  # candidates the next claim tries (see _take.next_reach)

    def claim_ops(self, head: KeyValue, attempt: int, lease_id: int) -> list[AnyOp]:
        name = item_name(head.key)
        return [
            Op.delete(head.key),
            Op.put(self.keys.claimed + name, head.value),
            Op.put(self.keys.claims + name, self.client_id, lease=lease_id),
            Op.put(self.keys.attempts + name, INT32.encode(attempt)),
        ]

    def claim_chain(self, window: list[KeyValue], lease_id: int) -> list[AnyOp]:
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
        return [chain, *self.keys.snapshot_ops(orphans=False)]

    async def claim(self, window: list[KeyValue], lease_id: int) -> Claimed | Snapshot:
        """Claim the first of ``window`` still present: the claim, or a fresh snapshot if none
        was (raises :class:`~etcd_recipes.errors.LeaseNotFoundError` for a dead lease)."""
        result = await commit(
            self.client,
            [],
            self.claim_chain(window, lease_id),
            [],
            undo=functools.partial(self._undo_chain, window),
            what=self.what,
        )
        chain, *snapshot = result.responses
        assert isinstance(chain, TxnResult)
        level, reached = outcome(chain)
        self.reach = next_reach(self.reach, level if reached.succeeded else None, WINDOW)
        if not reached.succeeded:
            return Snapshot.parse(snapshot, result.revision)
        head = window[level]
        first = reached.responses[0]
        if level > 0 or (isinstance(first, TxnResult) and first.succeeded):
            return Claimed(head, 1, result.revision, Snapshot.parse(snapshot, result.revision))
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
        snapshot_ops = self.keys.snapshot_ops(orphans=False)
        result = await commit(
            self.client,
            [
                Cmp.mod_revision(head.key) == head.mod_revision,
                Cmp.mod_revision(attempts_key) == known.mod_revision,
            ],
            [*self.claim_ops(head, attempt, lease_id), *snapshot_ops],
            snapshot_ops,
            undo=lambda done: self._unclaim(head, known, done.revision),
            what=self.what,
        )
        if result.succeeded:
            after = Snapshot.parse(result.responses[4:], result.revision)
            return Claimed(head, attempt, result.revision, after)
        return Snapshot.parse(result.responses, result.revision)

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

    async def settle(self, name: str, data: bytes, revision: int, *, requeue: bool) -> bool:
        """Ack (delete for good) or requeue (back to ``items/``, attempts kept) a claim;
        ``False`` if the claim was lost."""
        keys = self.keys
        ops: list[AnyOp]
        if requeue:
            ops = [
                Op.put(keys.items + name, data),
                Op.delete(keys.claims + name),
                Op.delete(keys.claimed + name),
            ]
        else:
            ops = [
                Op.delete(keys.claims + name),
                Op.delete(keys.claimed + name),
                Op.delete(keys.attempts + name),
            ]
        result = await self.client.txn(self.held(name, revision), ops)
        return result.succeeded

    async def release(self, name: str, data: bytes, revision: int, *, dead: bool) -> None:
        """Return a held claim as an orphan would be returned (or dead-lettered)."""
        keys = self.keys
        await self.client.txn(
            self.held(name, revision),
            [
                Op.delete(keys.claims + name),
                Op.delete(keys.claimed + name),
                Op.put((keys.dlq if dead else keys.items) + name, data),
            ],
        )
