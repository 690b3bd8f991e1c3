"""Counted barriers. :class:`DistributedBarrierWithCount` is a rendezvous of N: each member
waits until N members have arrived, then all are released together.
:class:`~etcd_recipes.DistributedDoubleBarrier` (``barriers/double.py``) adds a second
rendezvous for leaving.

:Status: Beta

Key layout (shared with the Kotlin library):

* ``<path>/ready`` -- **no lease**; created by the first arrival of a round (value: its
  ``"<client_id>:<token>"``) and deleted when the round is released. Its create revision
  identifies the round;
* ``<path>/waiting/<client_id>:<token>`` -- one per waiting member, on a **self-healing** lease
  of ``lease_ttl`` seconds, created with a compare-and-swap.

The member that sees N waiting keys releases the round with one transaction: it deletes
``ready`` and every waiting key, guarded by ``ready``'s create revision and by the create
revisions of the N keys it counted. Everyone else is released by the deletion of ``ready``,
which they watch on the shared ``<path>/`` prefix from their read's revision + 1.

Guarantees:

* a round is released only while N of its members are waiting (exactly, for ``member_count``
  up to 127; beyond that the guard covers 127 of the counted keys);
* every member waiting when the round is released is released, and no later arrival is: a
  member joins a round only while its ``ready`` key exists (the join is guarded by it), and
  the release removes all of the round's waiting keys at once, so the next round starts from
  zero -- the barrier is reusable;
* a member that times out, is cancelled, or whose recipe is closed stops counting: its
  waiting key is deleted and its lease revoked before the call returns (or re-raises);
* waits survive reconnects and compaction (the state is re-read after every watch recovery).

Not guaranteed: a member whose process is paused or partitioned for longer than
``lease_ttl`` drops out of the count until its lease heals (then it is counted again); a
crashed member stops counting after ``lease_ttl``. The ``ready`` key has no lease, so a round
whose members all left remains open for the next arrivals.

Deviations from the Kotlin library (which this port fixes): arrivals racing with a release could be
counted in the wrong round, a member could be released by a count that had just dropped below
N, and the double barrier did not pass its client id and TTL to its two barriers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .._core.keys import append_to_path, random_token
from .._core.logctx import library_logger
from .._core.shield import abort_guard, run_shielded
from .._core.txn import Cmp, Compare, Op
from .._core.validate import check_count, check_timeout, check_ttl
from .._recipe.recipe import Recipe
from .._recipe.waiting import wait_for_change
from ..client.lease import SelfHealingLease
from ..events import LeaseEvent
from ..types import EventType, KeyValue, RangeResult, WatchEvent
from ._common import metered_wait, report_lease_event
from .barrier import DEFAULT_TTL

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DEFAULT_TTL", "DistributedBarrierWithCount"]

log = library_logger("etcd_recipes.counted_barrier")

_MAX_GUARDED = 127  # etcd's default --max-txn-ops is 128, and ready's compare takes one


class _Arrival:
    """One member's wait on one round: its token, its round, its waiting key and lease."""

    def __init__(self, barrier: DistributedBarrierWithCount) -> None:
        self.barrier = barrier
        self.token = f"{barrier.client_id}:{random_token()}"
        self.key = append_to_path(barrier._waiting, self.token)
        self.round = 0  # the create revision of <path>/ready for our round
        self.lease: SelfHealingLease | None = None

    async def leave(self) -> None:
        """Stop counting: revoke the lease (its key goes with it), then make sure the key is
        gone even if the revoke failed."""
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.aclose()
            client = self.barrier._client
            await client.txn([Cmp.value(self.key) == self.token], [Op.delete(self.key)])


class DistributedBarrierWithCount(Recipe):
    """A rendezvous of ``member_count`` members.

    Example::

        from etcd_recipes import DistributedBarrierWithCount

        # Every member (usually one per process) runs this with the same path and member_count;
        # a count of 1 keeps the example to one process.
        barrier = DistributedBarrierWithCount(client, f"{prefix}/start", member_count=1)
        print(await barrier.wait_on_barrier(timeout=30))  # True: every member has arrived

    ``start()`` is optional. Each call of :meth:`wait_on_barrier` is one arrival.

    :param member_count: how many members must arrive (> 0).
    :param lease_ttl: seconds; a crashed member stops counting this long after it died.
    :param metrics_name: the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        member_count: int,
        *,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.member_count: int = check_count(member_count, what="member_count")
        """How many members must arrive before the barrier releases them."""
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """Seconds: the TTL of each waiting key's lease."""
        self._ready = append_to_path(path, "ready")
        self._waiting = append_to_path(path, "waiting/")
        self._prefix = append_to_path(path, "")
        self._waits: set[anyio.CancelScope] = set()

    async def waiter_count(self) -> int:
        """How many members are waiting now (one count-only read; advisory)."""
        self._check_open()
        return await self._client.count(self._waiting)

    async def wait_on_barrier(self, timeout: float | None = None) -> bool:
        """Arrive, and wait until ``member_count`` members have arrived.

        Returns True when released; False if ``timeout`` seconds pass first or the recipe is
        closed meanwhile -- in both cases this member no longer counts. Cancellation is safe:
        the waiting key is removed before the caller's cancellation is re-raised.

        Example::

            from etcd_recipes import DistributedBarrierWithCount

            barrier = DistributedBarrierWithCount(client, f"{prefix}/start", member_count=2)
            assert not await barrier.wait_on_barrier(timeout=0.5)  # alone: it times out ...
            assert await barrier.waiter_count() == 0  # ... and no longer counts
        """
        self._check_open()
        return await metered_wait(self, self._wait(check_timeout(timeout)))

    async def _wait(self, timeout: float | None) -> bool:
        """:meth:`wait_on_barrier` without its metrics (the double barrier meters its own)."""
        arrival = _Arrival(self)
        released = False
        with anyio.CancelScope() as close_scope:
            self._waits.add(close_scope)
            try:
                async with abort_guard(arrival.leave, what=f"{self.exception_context}: leave"):
                    with anyio.move_on_after(timeout):
                        released = await self._arrive_and_wait(arrival)
            finally:
                self._waits.discard(close_scope)
        # Released: our key is already gone, revoke its lease. Timed out or closed: stop
        # counting before returning.
        await run_shielded(arrival.leave, what=f"{self.exception_context}: leave")
        return released

    async def _arrive_and_wait(self, arrival: _Arrival) -> bool:
        while True:
            if await self._join_round(arrival):
                break  # joined: our waiting key exists
        while True:
            snapshot = await self._snapshot()
            if self._round_over(snapshot, arrival):
                return True
            members = snapshot[1]
            if len(members) >= self.member_count:
                if await self._release(arrival, members):
                    return True
                continue  # the state changed since the read: read it again
            if await self._wait_for_progress(arrival, members, snapshot[2]):
                return True

    async def _join_round(self, arrival: _Arrival) -> bool:
        """Open (or find) the current round, then create our waiting key while that round is
        still open. False if the round was released in between (join the next one)."""
        client = self._client
        opened = await client.txn(
            [Cmp.missing(self._ready)],
            [Op.put(self._ready, arrival.token), Op.get(self._ready)],
            [Op.get(self._ready)],
        )
        read = opened.responses[-1]
        assert isinstance(read, RangeResult)
        if not read.kvs:  # released between the two operations? (cannot happen in one txn)
            return False
        arrival.round = read.kvs[0].create_revision
        round_open = Cmp.create_revision(self._ready) == arrival.round

        async def establish(lease_id: int) -> bool:
            result = await client.txn(
                [Cmp.missing(arrival.key), round_open],
                [Op.put(arrival.key, arrival.token, lease=lease_id)],
            )
            return result.succeeded

        lease = client.self_healing_lease(self.lease_ttl, establish)
        lease.add_listener(self._on_lease_event)
        if not await lease.start():
            return False
        arrival.lease = lease
        return True

    async def _snapshot(self) -> tuple[KeyValue | None, list[KeyValue], int]:
        """``ready``, the waiting keys (oldest first) and the revision, in one read."""
        result = await self._client.txn(
            [], [Op.get(self._ready), Op.get(self._waiting, prefix=True, keys_only=True)]
        )
        ready, waiting = result.responses
        assert isinstance(ready, RangeResult)
        assert isinstance(waiting, RangeResult)
        members = sorted(waiting.kvs, key=lambda kv: kv.create_revision)
        return (ready.kvs[0] if ready.kvs else None), members, result.revision

    @staticmethod
    def _round_over(
        snapshot: tuple[KeyValue | None, list[KeyValue], int], arrival: _Arrival
    ) -> bool:
        ready = snapshot[0]
        return ready is None or ready.create_revision != arrival.round

    async def _release(self, arrival: _Arrival, members: list[KeyValue]) -> bool:
        """Release the round: delete ``ready`` and all waiting keys, guarded by the round and
        by the keys we counted still being there."""
        guards: list[Compare] = [Cmp.create_revision(self._ready) == arrival.round]
        for kv in members[: min(self.member_count, _MAX_GUARDED)]:
            guards.append(Cmp.create_revision(kv.key) == kv.create_revision)
        result = await self._client.txn(
            guards, [Op.delete(self._ready), Op.delete(self._waiting, prefix=True)]
        )
        if result.succeeded:
            log.info("%s: released round %d", self.exception_context, arrival.round)
        return result.succeeded

    async def _wait_for_progress(
        self, arrival: _Arrival, members: list[KeyValue], revision: int
    ) -> bool:
        """Wait after ``revision`` until the round is released (True) or enough members wait
        to release it (False: re-read and release). Only those two events wake a member, so
        a round of N costs O(N) reads, not O(N^2)."""
        released = False
        waiting = {kv.key for kv in members}
        ready = self._ready.encode()
        prefix = self._waiting.encode()

        def trigger(event: WatchEvent) -> bool:
            nonlocal released
            key = event.kv.key
            if key == ready and event.type is EventType.DELETE:
                released = True
                return True
            if not key.startswith(prefix):
                return False
            if event.type is EventType.PUT:
                waiting.add(key)
            else:
                waiting.discard(key)
            return len(waiting) >= self.member_count

        async def probe() -> tuple[bool, int]:
            snapshot = await self._snapshot()
            over = self._round_over(snapshot, arrival)
            return over or len(snapshot[1]) >= self.member_count, snapshot[2]

        await wait_for_change(
            self._client,
            self._prefix,
            prefix=True,
            after_revision=revision,
            trigger=trigger,
            probe=probe,
            on_recovery=self._on_recovery_event,
        )
        return released

    def _on_lease_event(self, event: LeaseEvent) -> None:
        report_lease_event(self, event)

    async def _do_close(self) -> None:
        for scope in list(self._waits):
            scope.cancel()  # parked waiters stop counting and return False
