"""The receive side of a work queue (not public): snapshots, the wait for items, and the claim
of one item or of a batch, for :class:`~etcd_recipes.DistributedWorkQueue`.

A receive reads a snapshot (the first items below the head's horizon, the first delayed item
due soon, and the orphan counts), promotes matured delayed items and returns orphans when the
snapshot shows any, claims from the items read, and otherwise parks on a watch of ``items/``
and ``delayed/`` anchored at the snapshot's revision + 1 (at most ``sweep_interval``, or until
the first delayed item is due). A claim's transaction also reads the queue's next items,
which a receive within half a second starts from instead of reading them again.

Guaranteed (with :mod:`._claims` and :mod:`._batch`): an item enqueued after the snapshot is
never missed by the wait; a claim that committed for a cancelled receive is undone; a payload
that does not decode is dead-lettered at once (reason ``"undecodable"``), never handed out.
Not guaranteed: which of several consumers gets an item.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Generic, cast

from .._core.logctx import library_logger
from .._recipe.waiting import pass_on, wait_for_put_under
from ..codecs import ValueT
from ..errors import CodecError, LeaseNotFoundError
from ..types import KeyValue, RangeResult
from ._batch import batch_window, claim_many
from ._claims import Claimed
from ._layout import WINDOW, Snapshot, item_name, ready_millis
from ._produce import now_millis
from ._take import decode_at
from .item import WorkItem, _Claim

if TYPE_CHECKING:
    from .work import DistributedWorkQueue

log = library_logger("etcd_recipes.work_queue")

METRIC = "work_queue.receive"
_PREFETCH_TTL = 0.5  # seconds a snapshot read by a claim may start the next receive
_DEAD = "it was moved to the dead letters (reason 'undecodable', raw bytes kept)"


class Receiver(Generic[ValueT]):
    """The receive side of one work-queue instance (its snapshots and claims)."""

    __slots__ = ("prefetched", "queue")

    def __init__(self, queue: DistributedWorkQueue[ValueT]) -> None:
        self.queue = queue
        self.prefetched: tuple[float, Snapshot] | None = None

    def stale(self) -> None:
        """Forget the snapshot a claim read: items moved (a sweep, a requeue)."""
        self.prefetched = None

    def fresh_prefetch(self) -> Snapshot | None:
        prefetched, self.prefetched = self.prefetched, None
        if prefetched is None or time.monotonic() - prefetched[0] > _PREFETCH_TTL:
            return None
        prefetched[1].kept = True
        return prefetched[1]

    async def snapshot(self, limit: int = WINDOW) -> Snapshot:
        """A fresh snapshot of the first ``limit`` items: the bounded reads in one round trip
        and -- only when no item lies below the bound -- a second that reads past it (see
        :class:`._layout.HeadReader`)."""
        q = self.queue
        ops = q._reads.ops(limit=limit)
        result = await q._client.txn([], ops)
        snap = q._reads.parse(ops, result.responses, result.revision)
        if snap.beyond is not None:
            further = await q._client.txn([], [snap.beyond])
            found = further.responses[0]
            assert isinstance(found, RangeResult)
            q._reads.horizon.observe(snap.beyond, found)
            snap.items, snap.beyond, snap.revision = list(found.kvs), None, further.revision
        return snap

    async def loop(
        self, *, wait: bool, timeout: float | None, most: int = 1
    ) -> list[WorkItem[ValueT]]:
        """Claim up to ``most`` items (at least one), waiting for them as ``wait`` and
        ``timeout`` say; an empty list when none came."""
        woken = [False]  # woken for an item and not yet through the read and claim after it
        try:
            return await self._loop(wait=wait, timeout=timeout, most=most, woken=woken)
        except BaseException:
            if woken[0]:  # leaving without the item it was woken for: another looks instead
                pass_on(self.queue._client, (self.queue._keys.items, self.queue._keys.delayed))
            raise

    async def _loop(
        self, *, wait: bool, timeout: float | None, most: int, woken: list[bool]
    ) -> list[WorkItem[ValueT]]:
        q = self.queue
        started = time.monotonic()
        # try_receive() does not wait for a healing lease either.
        deadline = started if not wait else None if timeout is None else started + timeout
        limit = max(WINDOW, most)
        snap = self.fresh_prefetch()
        if snap is None or (snap.limit < limit and len(snap.items) >= snap.limit):
            snap = await self.snapshot(limit)  # a batch wants more than a claim's read held
        reclaimed = False
        while True:
            q._check_open()
            if snap.beyond is not None:  # a claim's snapshot saw no item below its bound
                snap = await self.snapshot(limit)
            if snap.delayed is not None and ready_millis(snap.delayed) <= now_millis():
                await q._sweeps.promote()
                snap = await self.snapshot(limit)
                continue
            if snap.orphans and not reclaimed:
                reclaimed = True  # once per pass: a lost race must not spin
                if await q._sweeps.reclaim():
                    snap = await self.snapshot(limit)
                    continue
            if snap.items:
                outcome = await self.claim(snap.items, deadline, most)
                if isinstance(outcome, list):
                    if wait:
                        q._record_latency(METRIC, started)
                    return outcome
                if outcome is None:
                    return []  # the deadline passed while the consumer lease was healing
                snap, reclaimed = outcome, False
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if not wait or (remaining is not None and remaining <= 0):
                return []
            if snap.kept:
                # Park only on a fresh read: a watch anchored below the current revision is
                # caught up by etcd's 100 ms sync loop, so a hand-off would lag by up to that.
                snap, reclaimed = await self.snapshot(limit), False
                continue
            wait_for = q.config.sweep_interval
            if remaining is not None:
                wait_for = min(wait_for, remaining)
            if snap.delayed is not None:
                due = (ready_millis(snap.delayed) - now_millis()) / 1000
                wait_for = min(wait_for, max(due, 0.001))
            woken[0] = False
            woken[0] = await wait_for_put_under(  # a new item, or a delayed one (may be due sooner)
                q._client,
                (q._keys.items, q._keys.delayed),
                after_revision=snap.revision,
                timeout=wait_for,
                on_recovery=q._on_recovery_event,
                interrupts=q._waits,
                one=True,
            )
            q._check_open()
            snap, reclaimed = await self.snapshot(limit), False

    async def claim(
        self, items: list[KeyValue], deadline: float | None, most: int
    ) -> list[WorkItem[ValueT]] | Snapshot | None:
        """Claim the first of ``items`` still present (a batch: up to ``most`` of them): the
        items (never empty), a fresh snapshot if none was claimed, or ``None`` if the deadline
        passed while the consumer lease was healing."""
        q = self.queue
        claimer = q._claimer
        dead = 0  # a lease id the server no longer knows
        while True:
            lease_id = await q._consumer.acquire(deadline, dead)
            if not lease_id:
                return None
            try:
                if most > 1:
                    window = batch_window(claimer, items, most)
                    if not window:
                        return await self.snapshot(max(WINDOW, most))
                    claimed, after = await claim_many(claimer, window, lease_id, len(window))
                else:
                    single = claimer.window(items)  # right before the claim: siblings see it
                    if single is None:  # siblings are after every item read: look further
                        single = claimer.window(await claimer.read_further(), further=False)
                    if not single:
                        return await self.snapshot()  # siblings took every item read
                    one = await claimer.claim(single, lease_id)
                    if isinstance(one, Snapshot):
                        return one
                    claimed, after = [one], one.after
            except LeaseNotFoundError:
                # The lease died (revoked, expired) before the keeper noticed: wait for the
                # healed one instead of retrying with a dead id.
                dead = lease_id
                continue
            # The state right after this claim: the next receive may start from it (saving a
            # round trip) while it is fresh. The claim of a stale candidate just fails over.
            self.prefetched = (time.monotonic(), after)
            out = [item for c in claimed if (item := await self.hand_out(c, lease_id))]
            return out or after

    async def hand_out(self, claimed: Claimed, lease_id: int) -> WorkItem[ValueT] | None:
        """The item of a claim, decoded; ``None`` (and dead-lettered) if it does not decode."""
        q = self.queue
        name = item_name(claimed.head.key)
        claim = _Claim(q._settle, claimed, lease_id)
        try:
            value = decode_at(q.codec, claimed.head, q.exception_context, _DEAD)
        except CodecError as exc:
            # A payload that does not decode would wedge every consumer: dead-letter it.
            log.warning("%s", exc)
            item = WorkItem[ValueT](name, cast(ValueT, None), claimed.attempt, claim=claim)
            await q._settle(item, "dead", reason="undecodable")
            return None
        item = WorkItem(name, value, claimed.attempt, claim=claim)
        q._held[name] = item
        return item
