"""GroupMember: join a named group with a payload; see every member, and their changes.

Key layout: ``<path>/members/<member_id>`` holds the member's payload (bytes, or encoded by
``codec``) on the member's own **self-healing** lease of ``lease_ttl`` seconds.

Guaranteed:

* joining writes only if the key does not exist: a live member with the same id makes
  ``start()`` raise :class:`DuplicateMemberError`, and nothing is written;
* after a lease loss the key is re-created on a new lease, with the **latest** payload
  (``update`` and a heal are serialised), through a compare-and-swap -- a heal never takes a
  key another process wrote meanwhile (then ``LeaseFailed``: this member is out of the group);
* ``aclose()`` (or ``leave()``) revokes the lease, so the key vanishes at once; a cancelled
  ``start()`` leaves nothing behind;
* :meth:`GroupMember.members` is a snapshot of a :class:`~etcd_recipes.PrefixCache` of
  ``<path>/members/`` (read at one revision, watched from the next, re-read and reconciled
  after a compaction or a restore) -- no I/O; :meth:`GroupMember.events` reports each change
  once, in revision order, and the recovery (:class:`GroupResynced`, lease events);
* each loss of the member's lease is one ``lease_lost`` metrics event; the view's loads are
  the cache's ``cache_synced`` / ``cache_size_changed`` (``name`` label: ``metrics_name``).

A member key deleted out of band while its lease lives is re-created at once (as Curator's
persistent nodes are), through the same compare-and-swap.

Not guaranteed: between a lease loss and its heal this member is absent (others see it leave
and join again); a member that died stays listed until its lease expires (``lease_ttl``);
``events()`` replays nothing that happened before it was called (read :meth:`members` first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._core.logctx import library_logger
from .._core.shield import run_shielded, settled
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Op
from .._core.validate import check_path_segment, check_ttl
from .._recipe.outcomes import lease_lost_kind
from .._recipe.recipe import Recipe
from ..caches.events import BatchKind, CacheBatch, CacheEventType
from ..caches.prefix import PrefixCache
from ..client.lease import SelfHealingLease
from ..codecs import Codec, ValueT, as_codec, to_bytes
from ..errors import EtcdRecipeError, LeaseEventError, UsageError
from ..events import LeaseEvent, LeaseFailed, LeaseRestored, LeaseResumed
from ..types import RangeResult, TxnResult
from ._keys import member_key, members_prefix
from .events import GroupEvent, GroupResynced, MemberJoined, MemberLeft, MemberUpdated

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DEFAULT_TTL", "DuplicateMemberError", "GroupMember"]

log = library_logger("etcd_recipes.groups")

DEFAULT_TTL = 2
"""Default lease TTL (seconds) of a member's key."""


class DuplicateMemberError(UsageError):
    """Another live member of the group already uses this ``member_id``.

    Example::

        from etcd_recipes import DuplicateMemberError, GroupMember

        async with GroupMember(client, f"{prefix}/g", member_id="node-1"):
            twin = GroupMember(client, f"{prefix}/g", member_id="node-1")
            try:
                await twin.start()
            except DuplicateMemberError:
                pass  # two processes were configured with the same member id
            await twin.aclose()
    """


def _read_kvs(result: TxnResult) -> list[Any]:
    first = result.responses[0] if result.responses else None
    return first.kvs if isinstance(first, RangeResult) else []


class GroupMember(Recipe, Generic[ValueT]):
    """This process's membership of the group at ``path``, and a live view of all members.

    ``payload`` is bytes or str, or any value with ``codec=`` (which also decodes the other
    members' payloads). ``member_id`` defaults to the ``client_id`` (random); give a stable
    one to recognise a process across restarts.

    Example::

        from etcd_recipes import GroupMember

        async with (
            GroupMember(client, f"{prefix}/workers", b"10.0.0.1", member_id="a") as a,
            GroupMember(client, f"{prefix}/workers", b"10.0.0.2", member_id="b") as b,
        ):
            await a.wait_for_revision(b.joined_revision)
            assert a.members() == {"a": b"10.0.0.1", "b": b"10.0.0.2"}  # no I/O
        assert await client.get(f"{prefix}/workers/members/a") is None  # left at once
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        payload: ValueT | bytes | str = b"",
        *,
        member_id: str | None = None,
        codec: Codec[ValueT] | None = None,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.member_id: str = check_path_segment(
            member_id if member_id is not None else self.client_id, what="member_id"
        )
        """This member's id: the last segment of its key."""
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        """The TTL of the member's lease, in whole seconds."""
        self._codec: Codec[ValueT] = as_codec(codec)
        self._typed = codec is not None
        self._data = self._encode(payload)
        self.payload: ValueT | bytes | str = payload
        """The payload as last given (to the constructor or :meth:`update`)."""
        self.joined_revision: int = 0
        """The revision at which the member key was last written by this member."""
        self._prefix = members_prefix(self.path)
        self._cache: PrefixCache[ValueT] = PrefixCache(
            client, self._prefix, codec=self._codec, metrics_name=metrics_name
        )
        self._cache.add_exception_listener(self._inner_failed)
        self._cache.add_connection_state_listener(lambda new, old: self._set_state(new))
        self._cache.add_listener(self._on_batch)
        self._lease: SelfHealingLease | None = None
        self._owned = 0  # the lease the key was last written on by us
        self._write_lock = asyncio.Lock()  # serialises update() with a heal's establish
        self._events: Broadcast[GroupEvent] = self._broadcast("group-event")

    def __repr__(self) -> str:
        joined = "joined" if self._lease is not None and self._lease.is_healthy else "absent"
        return (
            f"<{self.exception_context} {self._lifecycle} {self.member_id!r} {joined} "
            f"members={len(self._cache)} revision={self._cache.revision} {self._state.value}>"
        )

    def _encode(self, payload: Any) -> bytes:
        return self._codec.encode(payload) if self._typed else to_bytes(payload)

    # ---------------------------------------------------------------- reads (no I/O)

    @property
    def key(self) -> str:
        """This member's key: ``<path>/members/<member_id>``."""
        return member_key(self.path, self.member_id)

    @property
    def lease_id(self) -> int:
        """The lease the member key is on now (0 before start, while healing, after close)."""
        return self._lease.current_lease_id if self._lease is not None else 0

    @property
    def is_member(self) -> bool:
        """Whether this member's key is in place (started, not healing, not closed)."""
        return self._lease is not None and self._lease.is_healthy and not self.is_closed

    def members(self) -> dict[str, ValueT]:
        """Every member's payload, by member id (sorted), as the view last saw it. No I/O.

        A payload the codec cannot decode is left out (and recorded once as a background
        exception)."""
        start = len(self._prefix)
        return {
            entry.key[start:]: entry.value
            for entry in self._cache.entries()
            if entry.error is None and entry.value is not None and "/" not in entry.key[start:]
        }

    def member_ids(self) -> list[str]:
        """The ids of every member, sorted, as the view last saw them. No I/O."""
        start = len(self._prefix)
        ids = (entry.key[start:] for entry in self._cache.entries())
        return [member for member in ids if "/" not in member]

    @property
    def revision(self) -> int:
        """The revision the member view reflects."""
        return self._cache.revision

    async def wait_for_revision(self, revision: int, timeout: float | None = 10.0) -> int:
        """Wait until the member view reflects ``revision`` (see
        :meth:`PrefixCache.wait_for_revision <etcd_recipes.PrefixCache.wait_for_revision>`)."""
        return await self._cache.wait_for_revision(revision, timeout)

    # ---------------------------------------------------------------- events

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[GroupEvent]:
        """Each later change of the group (:class:`MemberJoined`, :class:`MemberUpdated`,
        :class:`MemberLeft`, :class:`GroupResynced`) and each lease event of this member, as
        an async iterator that ends when the member is closed; bounded by ``maxsize`` (see
        :class:`~etcd_recipes.EventStream`). Nothing before the call is replayed. A watch that
        is suspended and resubscribes (a reconnect) loses nothing and reports no event here:
        it moves :attr:`connection_state` (and :meth:`connection_states`).

        Example::

            from etcd_recipes import GroupMember, MemberLeft

            async with GroupMember(client, f"{prefix}/g", member_id="a") as a:
                events = a.events()
                async with GroupMember(client, f"{prefix}/g", member_id="b"):
                    print(await anext(events))  # MemberJoined(member_id='b', ...)
                left = await anext(events)
                assert isinstance(left, MemberLeft) and left.member_id == "b"
        """
        return self._events.stream(maxsize)

    def add_listener(self, listener: Callable[[GroupEvent], Any]) -> None:
        """Call ``listener(event)`` for each event :meth:`events` reports, in order, from a
        task of its own."""
        self._events.add_listener(listener)

    def remove_listener(self, listener: Callable[[GroupEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._events.remove_listener(listener)

    def _on_batch(self, batch: CacheBatch[ValueT]) -> None:
        if batch.kind is BatchKind.INITIAL or batch.kind is BatchKind.RESYNCING:
            return
        if batch.kind is BatchKind.RESYNCED:
            self._events.publish(GroupResynced(batch.revision))
            return
        start = len(self._prefix)
        for event in batch:
            member = event.key[start:]
            if "/" in member:
                continue
            if event.type is CacheEventType.DELETED:
                self._events.publish(MemberLeft(member, event.revision, event.synthetic))
                if member == self.member_id and self.is_member:  # deleted out of band
                    self._spawn(self._rejoin(), "re-create the member key")
            elif event.type is CacheEventType.CREATED:
                self._events.publish(
                    MemberJoined(member, event.value, event.revision, event.synthetic)
                )
            else:
                self._events.publish(
                    MemberUpdated(member, event.value, event.revision, event.synthetic)
                )

    def _inner_failed(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rpartition(":")[2] or "view")

    def _on_lease_event(self, event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        kind = lease_lost_kind(event)
        if kind is not None:
            self._meter.lease_lost(kind)
        if not isinstance(event, (LeaseRestored, LeaseResumed)):
            self._record_exception(LeaseEventError(event), "lease")
        if isinstance(event, LeaseFailed):
            log.warning(
                "%s: %s could not re-join; out of the group", self.exception_context, self.key
            )
        self._events.publish(event)

    # ---------------------------------------------------------------- writes

    async def _establish(self, lease_id: int) -> bool:
        """Create the member key on ``lease_id``; take it over only from our own old lease."""
        client, key = self._client, self.key
        async with self._write_lock:
            for _ in range(3):  # the key may vanish between our two transactions
                data = self._data
                r = await settled(
                    client.txn(
                        [Cmp.missing(key)], [Op.put(key, data, lease=lease_id)], [Op.get(key)]
                    )
                )
                if r.succeeded:
                    self._owned, self.joined_revision = lease_id, r.revision
                    return True
                kvs = _read_kvs(r)
                if not kvs:
                    continue
                if not (self._owned and kvs[0].lease == self._owned):
                    return False  # someone else's key: never overwrite it
                r = await settled(
                    client.txn(
                        [Cmp.mod_revision(key) == kvs[0].mod_revision],
                        [Op.put(key, data, lease=lease_id)],
                    )
                )
                if r.succeeded:
                    old, self._owned, self.joined_revision = self._owned, lease_id, r.revision
                    self._spawn(client.lease_revoke(old), f"revoke {old:x}")
                    return True
            return False

    async def _rejoin(self) -> None:
        """Re-create our key, deleted while our lease lives (by an operator, say): only if it
        is still missing, on the lease we hold (a lease that just expired fails the write)."""
        async with self._write_lock:
            owned = self._owned
            if not owned or not self.is_member or self.lease_id != owned:
                return  # healing or closing: the heal or nobody writes it
            try:
                r = await self._client.txn(
                    [Cmp.missing(self.key)], [Op.put(self.key, self._data, lease=owned)]
                )
            except EtcdRecipeError as exc:
                log.info("%s: could not re-create %s: %s", self.exception_context, self.key, exc)
                return
            if r.succeeded:
                self.joined_revision = r.revision
                log.info("%s: %s was deleted; re-created", self.exception_context, self.key)

    async def _do_start(self) -> None:
        await self._cache.start()
        lease = self._client.self_healing_lease(self.lease_ttl, self._establish)
        lease.add_listener(self._on_lease_event)
        try:
            if not await lease.start():
                raise DuplicateMemberError(
                    f"{self.key} already exists: another live member uses {self.member_id!r}"
                )
        except BaseException:
            await run_shielded(lease.aclose, what=f"undoing the join of {self.key}")
            await run_shielded(self._cache.aclose, what="closing the member view")
            raise
        self._lease = lease

    async def update(self, payload: ValueT | bytes | str) -> None:
        """Replace this member's payload (a heal from now on writes this one). While the lease
        is healing the key is not written here: the heal writes it.

        Example::

            from etcd_recipes import JSON, GroupMember

            async with GroupMember(client, f"{prefix}/g", {"load": 1}, codec=JSON) as me:
                await me.update({"load": 7})
                assert (await client.get(me.key)).value == b'{"load":7}'
        """
        self._check_started()
        data = self._encode(payload)
        key = self.key
        async with self._write_lock:
            self.payload, self._data = payload, data
            lease = self._lease
            owned = self._owned
            if lease is None or not lease.is_healthy or not owned:
                return  # healing: the heal writes the latest payload
            r = await settled(
                self._client.txn(
                    [Cmp.lease(key) == owned], [Op.put(key, data, lease=owned)], [Op.get(key)]
                )
            )
            if r.succeeded:
                self.joined_revision = r.revision
                return
            kvs = _read_kvs(r)
            if kvs:
                raise DuplicateMemberError(
                    f"{key} is now held by lease {kvs[0].lease:x}, not ours ({owned:x})"
                )
            r = await settled(
                self._client.txn([Cmp.missing(key)], [Op.put(key, data, lease=owned)])
            )
            if r.succeeded:
                self.joined_revision = r.revision

    async def leave(self) -> None:
        """Leave the group: the same as :meth:`aclose` (the key vanishes at once)."""
        await self.aclose()

    async def _do_close(self) -> None:
        lease, self._lease = self._lease, None
        try:
            if lease is not None:
                owned = self._owned
                await lease.aclose()  # revokes: the key goes with the lease
                if owned:  # belt and braces, should the revoke not have reached etcd
                    await self._client.txn([Cmp.lease(self.key) == owned], [Op.delete(self.key)])
        finally:
            await self._cache.aclose()
