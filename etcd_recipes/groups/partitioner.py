"""SetPartitioner: the members of a group divide a set of items among themselves.

Key layout: the members are a :class:`~etcd_recipes.GroupMember` group at ``<path>``
(``<path>/members/<member_id>``); owning an item is the key ``<path>/owners/<item>`` holding
the owner's member id **on the owner's member lease**.

How it works: every member computes the same assignment from the member ids it sees
(rendezvous hashing, see below). It first gives back what it no longer owns -- reports
:class:`ItemReleased`, then deletes the owner key guarded by its fencing token -- and takes
what it now owns with a transaction that creates the owner key only if it does not exist
(``create_revision == 0``). So an item is taken only once its old owner's key is gone: given
back, expired with the old owner's lease, or deleted; until then the new owner waits, woken
by its watch of ``<path>/owners/``.

Guaranteed:

* **no item has two owner keys**, at any revision, whatever the members' views, pauses or
  deaths (etcd's compare, not the members' agreement, decides);
* each owned item has a **fencing token**, its owner key's create revision;
  :meth:`SetPartitioner.compare` gives the guard ``create_revision(owner key) == token``, so a
  write in the same transaction commits only while this member still owns the item;
* **stable assignment**: rendezvous (highest-random-weight) hashing of ``(member id, item)``
  with ``blake2b``, deterministic across processes; a joining member takes only the items it
  now wins, a leaving member's items spread over the rest, no other item moves;
* eventually (once the views agree and dead members' leases expired) every item has exactly
  one owner among the live members; ``aclose()`` gives every item back at once;
* a lost lease (or an owner key deleted out of band) ends the ownership of the items on it
  (:class:`ItemReleased` with ``lost=True``); the member heals (a new lease, a new member key)
  and takes its items again with new fencing tokens.

Every member of the group at ``<path>`` takes part: run only partitioners of the **same items**
there. A plain :class:`~etcd_recipes.GroupMember` at that path would be assigned items it never
takes, and a partitioner with other items would leave some unowned.

Not guaranteed: an even split (see the assignment module); that the member's *belief* ends
before its key does after a lease loss -- the loss is noticed up to the TTL later, which is
why writes must be guarded by :meth:`compare`; hand-over latency (a dead owner's items wait
for its lease to expire, ``lease_ttl`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio

from .._core.shield import settled
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Compare, Op
from .._core.validate import check_path_segment, check_timeout
from .._recipe.recipe import Recipe
from ..caches.prefix import PrefixCache
from ..errors import EtcdRecipeError, EtcdTimeoutError, InvalidArgumentError, UsageError
from ._assign import assignment
from ._keys import owner_key, owners_prefix
from .events import ItemAssigned, ItemReleased, PartitionEvent, PartitionState
from .member import DEFAULT_TTL, GroupMember

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["ItemNotOwnedError", "SetPartitioner"]

_IDLE_CHECK = 1.0  # seconds between re-checks when nothing woke the rebalancer


class ItemNotOwnedError(UsageError, LookupError):
    """The item is not owned by this member now (never assigned, released or lost).

    Example::

        from etcd_recipes import ItemNotOwnedError, SetPartitioner

        async with SetPartitioner(client, f"{prefix}/p", ["a"]) as partitioner:
            try:
                partitioner.compare("not-an-item")
            except ItemNotOwnedError:
                pass
    """


def _checked_items(items: Iterable[str]) -> tuple[str, ...]:
    if isinstance(items, (str, bytes)):
        raise InvalidArgumentError("items must be an iterable of item names, not one string")
    checked = sorted({check_path_segment(item, what="an item") for item in items})
    if not checked:
        raise InvalidArgumentError("items must not be empty")
    return tuple(checked)


class SetPartitioner(Recipe):
    """This member's share of ``items``, divided with every other partitioner at ``path``.

    ``on_release(item, fencing_token)``, if given, is awaited for every item this member gives
    back (a hand-over, or closing) **before** its owner key is deleted, so the work on the
    item can stop before anyone else can take it; it is bounded by ``release_timeout``
    seconds (then, or if it raises, the failure is recorded and the item is given back
    anyway) and runs on the partitioner's one rebalancing task: keep it short. Items *lost*
    (lease expired, key deleted) are only reported (:class:`ItemReleased` with ``lost=True``):
    their keys are gone already.

    Example::

        from etcd_recipes import Op, SetPartitioner

        shards = [f"shard-{i}" for i in range(4)]
        async with (
            SetPartitioner(client, f"{prefix}/jobs", shards, member_id="a") as a,
            SetPartitioner(client, f"{prefix}/jobs", shards, member_id="b") as b,
        ):
            assert await a.wait_stable(timeout=10) and await b.wait_stable(timeout=10)
            assert sorted([*a.assigned(), *b.assigned()]) == shards  # each item once
            owner = a if a.assigned() else b
            item = next(iter(owner.assigned()))
            fenced = await client.txn([owner.compare(item)], [Op.put(f"{prefix}/out", item)])
            assert fenced.succeeded  # commits only while the owner still holds the item
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        items: Iterable[str],
        *,
        member_id: str | None = None,
        payload: bytes | str = b"",
        lease_ttl: float = DEFAULT_TTL,
        on_release: Callable[[str, int], Awaitable[Any]] | None = None,
        release_timeout: float = 5.0,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.items: tuple[str, ...] = _checked_items(items)
        """The items divided among the members (sorted)."""
        if on_release is not None and not callable(on_release):
            raise InvalidArgumentError("on_release must be an async callable (item, token)")
        self._on_release = on_release
        bound = check_timeout(release_timeout, what="release_timeout", optional=False)
        assert bound is not None
        self.release_timeout: float = bound
        """Seconds ``on_release`` may take for one item before the item is given back anyway."""
        self._member: GroupMember[bytes] = GroupMember(
            client,
            path,
            payload,
            member_id=member_id if member_id is not None else self.client_id,
            lease_ttl=lease_ttl,
            metrics_name=metrics_name,
        )
        self.member_id: str = self._member.member_id
        """This member's id in the group."""
        self._owners: PrefixCache[bytes] = PrefixCache(
            client, owners_prefix(self.path), metrics_name=metrics_name
        )
        for inner in (self._member, self._owners):
            inner.add_exception_listener(self._inner_failed)
            inner.add_connection_state_listener(lambda new, old: self._set_state(new))
        self._member.add_listener(lambda event: self._poke())
        self._owners.add_listener(lambda batch: self._poke())
        self._owned: dict[str, tuple[int, int]] = {}  # item -> (fencing token, lease id)
        self._assigned_for: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())
        self._releasing: dict[str, int] = {}  # given back, owner key not yet deleted
        self._wake = asyncio.Event()
        self._progress: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._events: Broadcast[PartitionEvent] = self._broadcast("partition-event")

    def __repr__(self) -> str:
        return (
            f"<{self.exception_context} {self._lifecycle} {self.member_id!r} "
            f"{self.state.value} owned={len(self._owned)}/{len(self.items)} "
            f"members={len(self._member.member_ids())} {self._state.value}>"
        )

    # ---------------------------------------------------------------- reads (no I/O)

    @property
    def member(self) -> GroupMember[bytes]:
        """The group membership this partitioner runs on (its view of every member)."""
        return self._member

    def assigned(self) -> dict[str, int]:
        """The items this member owns now, each with its fencing token (sorted). No I/O."""
        return {item: token for item, (token, _) in sorted(self._owned.items())}

    def fencing_token(self, item: str) -> int:
        """The fencing token of an owned ``item`` (its owner key's create revision); raises
        :class:`ItemNotOwnedError` if this member does not own it now."""
        owned = self._owned.get(item)
        if owned is None:
            raise ItemNotOwnedError(f"{self.exception_context}: {item!r} is not owned here now")
        return owned[0]

    def compare(self, item: str) -> Compare:
        """The guard ``create_revision(<path>/owners/<item>) == token``: a transaction with it
        commits only while this member owns ``item`` (see the class example)."""
        return Cmp.create_revision(owner_key(self.path, item)) == self.fencing_token(item)

    def owner_key(self, item: str) -> str:
        """The owner key of ``item``: ``<path>/owners/<item>``."""
        return owner_key(self.path, item)

    def _desired(self) -> set[str] | None:
        """What this member should own as it sees the group; None while it is not in it."""
        members = tuple(self._member.member_ids())
        if not self._member.lease_id or self.member_id not in members:
            return None
        if self._assigned_for[0] != members:  # items x members hashes: only on a change
            mine = assignment(self.items, members, self.member_id)
            self._assigned_for = (members, frozenset(mine))
        return set(self._assigned_for[1])

    @property
    def state(self) -> PartitionState:
        """ACQUIRING, RELEASING or STABLE (see :class:`PartitionState`); NEW and CLOSED."""
        if self.is_closed:
            return PartitionState.CLOSED
        if not self.is_started:
            return PartitionState.NEW
        desired = self._desired()
        if self._releasing or (set(self._owned) - (desired or set())):
            return PartitionState.RELEASING
        if desired is None or desired - set(self._owned):
            return PartitionState.ACQUIRING
        return PartitionState.STABLE

    # ---------------------------------------------------------------- events

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[PartitionEvent]:
        """Each later :class:`ItemAssigned` / :class:`ItemReleased`, as an async iterator that
        ends when the partitioner is closed; bounded by ``maxsize`` (see
        :class:`~etcd_recipes.EventStream`). Create it before ``start()`` to see every item.

        Example::

            from etcd_recipes import ItemAssigned, SetPartitioner

            partitioner = SetPartitioner(client, f"{prefix}/p", ["x"])
            events = partitioner.events()
            async with partitioner:
                assert await anext(events) == ItemAssigned("x", partitioner.fencing_token("x"))
        """
        return self._events.stream(maxsize)

    def add_listener(self, listener: Callable[[PartitionEvent], Any]) -> None:
        """Call ``listener(event)`` for each event :meth:`events` reports, in order, from a
        task of its own (an item is handed over without waiting for the listener)."""
        self._events.add_listener(listener)

    def remove_listener(self, listener: Callable[[PartitionEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._events.remove_listener(listener)

    async def wait_stable(self, timeout: float | None = None) -> bool:
        """Wait until this member owns exactly what the group, as it sees it, assigns to it;
        ``False`` if ``timeout`` seconds pass first. Cancelling it changes nothing.

        Example::

            from etcd_recipes import PartitionState, SetPartitioner

            async with SetPartitioner(client, f"{prefix}/p", ["a", "b"]) as partitioner:
                assert await partitioner.wait_stable(timeout=10)
                assert partitioner.state is PartitionState.STABLE
        """
        timeout = check_timeout(timeout)
        self._check_started()
        with anyio.move_on_after(timeout):
            while self.state is not PartitionState.STABLE:
                self._check_started()
                if self._progress is None:
                    self._progress = asyncio.Event()
                await self._progress.wait()
            return True
        return False

    # ---------------------------------------------------------------- the rebalancer

    def _poke(self) -> None:
        self._wake.set()

    def _inner_failed(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rpartition(":")[2] or "inner")

    def _publish(self, event: PartitionEvent) -> None:
        if isinstance(event, ItemAssigned):
            self._meter.partition("assigned")
        else:
            self._meter.partition("lost" if event.lost else "released")
        self._events.publish(event)

    async def _run(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            # A timer, not asyncio.wait_for: on Python < 3.12 wait_for swallows a cancel that
            # arrives as the event is set, and the rebalancer would outlive close().
            timer = loop.call_later(_IDLE_CHECK, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
            self._wake.clear()
            try:
                await self._rebalance()
                failures = 0
            except EtcdRecipeError as exc:
                failures += 1
                self._record_exception(exc, "rebalance")
                await asyncio.sleep(min(0.05 * 2**failures, 2.0))
                self._wake.set()
            if self._progress is not None:
                self._progress.set()
                self._progress = None

    async def _rebalance(self) -> None:
        lease_id = self._member.lease_id
        desired = self._desired() or set()
        seen = self._owners.revision
        for item, (token, lease) in list(self._owned.items()):
            entry = self._owners.entry(owner_key(self.path, item))
            if lease != lease_id or (
                seen >= token and (entry is None or entry.create_revision != token)
            ):
                del self._owned[item]  # the lease or the key went: nothing to give back
                self._publish(ItemReleased(item, token, lost=True))
        for item in sorted(set(self._owned) - desired):
            token, _ = self._owned[item]
            # One read tells a hand-over from a loss the owner view has not shown yet (a lost
            # lease also removes our member key, and the member view may see that first).
            kv = await self._client.get(owner_key(self.path, item))
            del self._owned[item]
            if kv is None or kv.create_revision != token:
                self._publish(ItemReleased(item, token, lost=True))
                continue
            self._releasing[item] = token
            self._publish(ItemReleased(item, token))
            await self._released(item, token)  # the hook returns before the key goes
        for item, token in sorted(self._releasing.items()):
            key = owner_key(self.path, item)
            await self._client.txn([Cmp.create_revision(key) == token], [Op.delete(key)])
            self._releasing.pop(item, None)
        me = self.member_id.encode()
        for item in sorted(desired - set(self._owned)):
            if self._member.lease_id != lease_id:
                return  # the lease changed meanwhile: start over
            key = owner_key(self.path, item)
            entry = self._owners.entry(key)
            if entry is not None:
                if entry.value == me and entry.lease == lease_id:  # ours (an answer was lost)
                    self._take(item, entry.create_revision, lease_id)
                continue  # held by someone: taken once the watch sees it go
            r = await settled(
                self._client.txn([Cmp.create_revision(key) == 0], [Op.put(key, me, lease=lease_id)])
            )
            if r.succeeded:
                self._take(item, r.revision, lease_id)

    async def _released(self, item: str, token: int) -> None:
        """Run ``on_release(item, token)``, bounded by ``release_timeout``; a failure is
        recorded, and the item is given back either way."""
        hook = self._on_release
        if hook is None:
            return
        with anyio.move_on_after(self.release_timeout) as scope:
            try:
                await hook(item, token)
            except Exception as exc:
                self._record_exception(exc, "on_release")
        if scope.cancelled_caught:
            self._record_exception(
                EtcdTimeoutError(f"on_release({item!r}) took over {self.release_timeout}s"),
                "on_release",
            )

    def _take(self, item: str, token: int, lease_id: int) -> None:
        self._owned[item] = (token, lease_id)
        self._publish(ItemAssigned(item, token))

    # ---------------------------------------------------------------- lifecycle

    async def _do_start(self) -> None:
        await self._owners.start()
        try:
            await self._member.start()
        except BaseException:
            await self._owners.aclose()
            raise
        self._runner = self._spawn(self._run(), "rebalance")
        self._wake.set()

    async def _do_close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await runner
        owned, self._owned = self._owned, {}
        try:
            for item, (token, _) in sorted(owned.items()):
                self._publish(ItemReleased(item, token))
                await self._released(item, token)
            # Revoking the lease deletes every owner key at once (the ones still being given
            # back too); should the revoke fail, they expire with it, at the TTL.
            await self._member.aclose()
            self._releasing.clear()
        finally:
            await self._owners.aclose()
        if self._progress is not None:
            self._progress.set()
