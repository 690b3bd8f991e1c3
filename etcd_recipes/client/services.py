"""etcd's lock and election services, codec helpers and the maintenance reads (alarms,
compact revision): :class:`ServiceCalls`, a base of :class:`~etcd_recipes.EtcdClient` (so
``client.lock(...)``, ``client.election_campaign(...)``, ``client.alarms()``). Not public
itself.

Unary calls go through the client's funnel (per-attempt timeout, retries, auth refresh,
metrics, error mapping, cancellation kept intact); the ``Observe`` stream reads through
:func:`~etcd_recipes.client.rpc.await_stream_op` for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio
import grpc
from aetcd import rpc as pb

from .._core.keys import key_bytes
from .._core.logctx import library_logger
from .._core.shield import abort_guard
from .._core.txn import Cmp, Op
from .._core.validate import check_lease_id, check_timeout
from .._proto import Method, v3election, v3lock
from ..codecs import Codec, to_bytes
from ..errors import (
    CompactedError,
    EtcdServerError,
    EtcdTimeoutError,
    LockTimeoutError,
)
from ..types import Alarm, ElectionLeaderKey, KeyValue, PutResult
from .lease_calls import LeaseCalls
from .rpc import UNSET, await_stream_op, map_grpc_error

if TYPE_CHECKING:
    from .kv import KVCalls

__all__ = ["ServiceCalls"]

_MESSAGES = v3election.MESSAGES
T = TypeVar("T")
D = TypeVar("D")
log = library_logger("etcd_recipes.client")


def _call(
    client: KVCalls,
    op: str,
    method: Method,
    request: Any,
    *,
    retry: bool = True,
    timeout: float | Any | None = ...,
) -> Coroutine[Any, Any, Any]:
    """One unary call of a vendored service through the client's funnel; the multicallable
    is made once per client (like its aetcd stubs)."""
    channel = client._channel_or_raise()
    fn = client._stubs.get(method)
    if fn is None:
        fn = client._stubs[method] = method(channel)
    return client._runner.call(op, fn, request, retry=retry, timeout=timeout)


async def _lock(client: KVCalls, name: bytes | str, lease_id: int, timeout: Any) -> bytes:
    """The v3lock ``Lock`` RPC: never retried, no gRPC deadline (the wait is bounded here),
    the waiter key removed on timeout or cancellation."""
    check_lease_id(lease_id, call="server_lock()")
    timeout = check_timeout(timeout)
    name_bytes = key_bytes(name)
    key = name_bytes + b"/" + f"{lease_id:x}".encode()
    request = v3lock.LockRequest(name=client._k(name_bytes), lease=lease_id)

    async def cleanup() -> None:  # the lock may have been granted in the last instant
        await client.delete(key)

    async with abort_guard(cleanup, what=f"server_lock({name_bytes!r}): removing the waiter"):
        response: Any = None
        with anyio.move_on_after(timeout):
            response = await _call(client, "lock", v3lock.LOCK, request, retry=False, timeout=None)
        if response is None:
            raise LockTimeoutError(f"server_lock({name_bytes!r}): not acquired within {timeout}s")
    return client._strip(bytes(response.key))


async def _unlock(client: KVCalls, key: bytes | str) -> None:
    """The v3lock ``Unlock`` RPC (deletes ``key``)."""
    request = v3lock.UnlockRequest(key=client._k(key_bytes(key)))
    await _call(client, "unlock", v3lock.UNLOCK, request)


def _leader_key_pb(client: KVCalls, leader: ElectionLeaderKey) -> Any:
    return _MESSAGES["LeaderKey"](
        name=client._k(leader.name),
        key=client._k(leader.key),
        rev=leader.revision,
        lease=leader.lease,
    )


async def _campaign(
    client: KVCalls, name: bytes | str, value: bytes | str, lease: int, timeout: Any
) -> ElectionLeaderKey:
    """The ``Campaign`` RPC: never retried, ``timeout`` as its deadline, the campaign key
    withdrawn on timeout or cancellation."""
    check_lease_id(lease, what="lease", call="election_campaign()")
    timeout = check_timeout(timeout)
    raw_name = key_bytes(name)
    own_key = raw_name + b"/" + f"{lease:x}".encode()
    request = _MESSAGES["CampaignRequest"](
        name=client._k(raw_name), lease=lease, value=to_bytes(value)
    )

    async def withdraw() -> None:
        await client.txn([Cmp.lease(own_key) == lease], [Op.delete(own_key)])

    deadline = None if timeout == math.inf else timeout
    async with abort_guard(withdraw, what=f"election_campaign({raw_name!r}): withdraw"):
        try:
            resp = await _call(
                client,
                "election_campaign",
                v3election.CAMPAIGN,
                request,
                retry=False,
                timeout=deadline,
            )
        except EtcdServerError as exc:
            if "deadline exceeded" in exc.details.lower():
                raise EtcdTimeoutError(
                    f"election_campaign({raw_name!r}): not elected within {timeout}s"
                ) from exc
            raise
    won = resp.leader
    return ElectionLeaderKey(
        client._strip(bytes(won.name)), client._strip(bytes(won.key)), int(won.rev), int(won.lease)
    )


async def _proclaim(client: KVCalls, leader: ElectionLeaderKey, value: bytes | str) -> None:
    """The ``Proclaim`` RPC."""
    request = _MESSAGES["ProclaimRequest"](
        leader=_leader_key_pb(client, leader), value=to_bytes(value)
    )
    await _call(client, "election_proclaim", v3election.PROCLAIM, request)


async def _leader(client: KVCalls, name: bytes | str) -> KeyValue | None:
    """The ``Leader`` RPC; ``None`` for etcd's "election: no leader"."""
    request = _MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    try:
        resp = await _call(client, "election_leader", v3election.LEADER, request)
    except EtcdServerError as exc:
        if "election: no leader" in exc.details:
            return None
        raise
    return client._kv(resp.kv)


async def _observe(client: KVCalls, name: bytes | str) -> AsyncIterator[KeyValue]:
    """The ``Observe`` stream; the call is cancelled when the iteration ends or is cancelled."""
    request = _MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    call = v3election.OBSERVE(client._channel_or_raise())(
        request, metadata=client._runner.metadata()
    )
    try:
        while True:
            try:
                msg = await await_stream_op(call.read(), call)
            except grpc.aio.AioRpcError as exc:
                raise map_grpc_error(
                    exc, op="election_observe", endpoints=client.endpoints
                ) from None
            if msg is grpc.aio.EOF:
                return
            yield client._kv(msg.kv)
    finally:
        call.cancel()


async def _resign(client: KVCalls, leader: ElectionLeaderKey) -> None:
    """The ``Resign`` RPC."""
    request = _MESSAGES["ResignRequest"](leader=_leader_key_pb(client, leader))
    await _call(client, "election_resign", v3election.RESIGN, request)


_PROBE_KEY = b"\0"
"""The key the compact-revision probe reads (count only): the lowest key there is."""


async def _readable(client: KVCalls, revision: int, timeout: Any) -> bool:
    """Whether a read at ``revision`` is still answered (False: compacted away)."""
    req = pb.RangeRequest(key=_PROBE_KEY, revision=revision, count_only=True)
    try:
        await client._call("compact_revision", "Range", pb.KVStub, req, timeout=timeout)
    except CompactedError:
        return False
    return True


async def _compact_revision(client: KVCalls, timeout: Any) -> int:
    """Binary search for the lowest readable revision: etcd reports it nowhere else."""
    head = pb.RangeRequest(key=_PROBE_KEY, count_only=True)
    resp = await client._call("compact_revision", "Range", pb.KVStub, head, timeout=timeout)
    readable_rev = int(resp.header.revision)  # always readable: it is the current one
    if readable_rev <= 1 or await _readable(client, 1, timeout):
        return 0
    unreadable = 1
    while readable_rev - unreadable > 1:
        mid = (unreadable + readable_rev) // 2
        if await _readable(client, mid, timeout):
            readable_rev = mid
        else:
            unreadable = mid
    return readable_rev


class ServiceCalls(LeaseCalls):
    """The typed calls of etcd's lock and election services, the codec helpers and the lease
    handles, as methods of :class:`~etcd_recipes.EtcdClient` (its base class)."""

    # ------------------------------------------------------------------ lock service

    async def lock(
        self, name: bytes | str, lease_id: int, *, timeout: float | None = None
    ) -> bytes:
        """Acquire ``name`` through etcd's own lock service (the v3lock ``Lock`` RPC).

        The server queues ``<name>/<lease id in hex>`` and answers once it owns the lock; the
        key returned lives while the lease does. Keep ``lease_id`` alive yourself (for example
        with :meth:`lease`) and give the key to :meth:`unlock`. Never retried. On timeout (or
        cancellation) the waiter key is removed; a timeout raises
        :class:`~etcd_recipes.errors.LockTimeoutError`.

        Prefer :class:`~etcd_recipes.DistributedMutex` (same key layout): the server-side wait
        hands a contended lock over at most about every 100 ms, and loss is not reported.

        Example::

            async with client.lease(10) as lease:
                key = await client.lock(prefix + "/job", lease.id, timeout=5)
                try:
                    assert (await client.get(key)) is not None
                finally:
                    await client.unlock(key)
        """
        return await _lock(self, name, lease_id, timeout)

    async def unlock(self, key: bytes | str) -> None:
        """Release a lock taken with :meth:`lock` (the v3lock ``Unlock`` RPC: it deletes
        ``key``). Idempotent.

        Example::

            async with client.lease(10) as lease:
                key = await client.lock(prefix + "/job", lease.id)
                await client.unlock(key)
                await client.unlock(key)  # already released: nothing happens
                assert (await client.get(key)) is None
        """
        await _unlock(self, key)

    # ------------------------------------------------------------------ election service

    async def election_campaign(
        self,
        name: bytes | str,
        value: bytes | str,
        *,
        lease: int,
        timeout: float | None = None,
    ) -> ElectionLeaderKey:
        """Campaign in etcd's election service (``etcdctl elect``, Go's
        ``concurrency.Election``): blocks until this campaign leads ``name``, with ``value``
        proclaimed.

        ``lease`` must be a live lease you keep alive (:meth:`lease`); leadership ends when it
        does. ``timeout`` bounds the wait (:class:`~etcd_recipes.errors.EtcdTimeoutError`).
        Never retried. Cancelled or timed out, the campaign's key ``<name>/<lease hex>`` is
        deleted. Prefer :class:`~etcd_recipes.LeaderSelector` /
        :class:`~etcd_recipes.LeaderLatch`, which manage leases, loss and fencing.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix + "/jobs", "node-1",
                                                        lease=lease.id, timeout=5)
                assert leader.key == f"{prefix}/jobs/{lease.id:x}".encode()
                await client.election_resign(leader)
        """
        return await _campaign(self, name, value, lease, timeout)

    async def election_proclaim(self, leader: ElectionLeaderKey, value: bytes | str) -> None:
        """Publish a new ``value`` for a leadership won with :meth:`election_campaign`.

        Raises :class:`~etcd_recipes.errors.NotLeaderError` if that leadership is over.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                await client.election_proclaim(leader, "node-1 (draining)")
                assert (await client.election_leader(prefix)).text == "node-1 (draining)"
                await client.election_resign(leader)
        """
        await _proclaim(self, leader, value)

    async def election_leader(self, name: bytes | str) -> KeyValue | None:
        """The current leader's key and proclaimed value for ``name``, or ``None`` without one.

        Example::

            assert await client.election_leader(prefix) is None
            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                kv = await client.election_leader(prefix)
                assert kv is not None and kv.key == leader.key and kv.text == "node-1"
                await client.election_resign(leader)
        """
        return await _leader(self, name)

    async def election_observe(self, name: bytes | str) -> AsyncIterator[KeyValue]:
        """The leader of ``name`` (when there is one) and every later proclamation or new
        leader.

        etcd's ``Observe`` never reports that an election became vacant -- use
        :class:`~etcd_recipes.LeaderObserver` for that. The stream is cancelled when the
        iteration stops (or the iterator is closed).

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "v1", lease=lease.id)
                async for kv in client.election_observe(prefix):
                    if kv.text == "v1":
                        await client.election_proclaim(leader, "v2")
                    else:
                        assert kv.text == "v2"
                        break
                await client.election_resign(leader)
        """
        async for kv in _observe(self, name):
            yield kv

    async def election_resign(self, leader: ElectionLeaderKey) -> None:
        """Give up a leadership won with :meth:`election_campaign` (deletes its key; the next
        campaigner, if any, is elected). Resigning an ended leadership is a no-op.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                await client.election_resign(leader)
                await client.election_resign(leader)  # over already: nothing happens
                assert await client.election_leader(prefix) is None
        """
        await _resign(self, leader)

    # ------------------------------------------------------------------ maintenance

    async def alarms(self, *, timeout: float | None = UNSET) -> list[Alarm]:
        """The alarms raised on any member (``etcdctl alarm list``); ``[]`` when all is well.

        A ``NOSPACE`` alarm means a member's database reached its quota: the cluster then
        refuses writes (:class:`~etcd_recipes.errors.EtcdServerError`, "database space
        exceeded") until space is freed and the alarm disarmed (``etcdctl alarm disarm``).

        Example::

            assert await client.alarms() == []  # a healthy server
        """
        req = pb.AlarmRequest(action=pb.AlarmRequest.GET, memberID=0, alarm=pb.NONE)
        resp = await self._call("alarms", "Alarm", pb.MaintenanceStub, req, timeout=timeout)
        return [
            Alarm(member_id=int(a.memberID), alarm=pb.AlarmType.Name(a.alarm)) for a in resp.alarms
        ]

    async def compact_revision(self, *, timeout: float | None = UNSET) -> int:
        """The revision history was last compacted at (``0``: nothing compacted yet).

        Reads at or above it are answered; below it fail with
        :class:`~etcd_recipes.errors.CompactedError` (and watches starting below it cannot
        replay). etcd's Status does not report it, so this finds the lowest revision a read is
        still answered at, by bisection: about ``log2(revision)`` count-only reads of the key
        ``b"\\0"`` outside any namespace (the user needs read access to it; root has). A
        compaction running meanwhile can only move the answer up. A compaction at revision 1
        discards nothing and also reads as ``0``.

        Example::

            compacted = await client.compact_revision()
            assert 0 <= compacted <= (await client.status()).revision
            print(f"history kept from revision {compacted or 1}")
        """
        return await _compact_revision(self, timeout)

    # ------------------------------------------------------------------ typed helpers

    @overload
    async def get_value(self, key: bytes | str, codec: Codec[T]) -> T | None: ...

    @overload
    async def get_value(self, key: bytes | str, codec: Codec[T], *, default: D) -> T | D: ...

    async def get_value(
        self, key: bytes | str, codec: Codec[T], *, default: D | None = None
    ) -> T | D | None:
        """Read ``key`` and decode it with ``codec``; ``default`` (``None`` unless given) when
        absent. The result is typed by the codec: ``int`` for :data:`~etcd_recipes.INT64`,
        ``int | None`` without a default.

        A decode failure raises :class:`~etcd_recipes.errors.CodecError`.

        Example::

            from etcd_recipes import INT64

            assert await client.get_value(prefix + "/counters/x", INT64, default=0) == 0
            await client.put_value(prefix + "/counters/x", 41, INT64)
            assert await client.get_value(prefix + "/counters/x", INT64) == 41
        """
        return await self._unary_get_value(key, codec, default=default).send()

    async def put_value(
        self, key: bytes | str, value: T, codec: Codec[T], *, lease: int = 0
    ) -> PutResult:
        """Encode ``value`` with ``codec`` and write it at ``key``; ``value`` must be of the
        codec's type (``put_value(k, "7", INT64)`` is a type error).

        Example::

            from etcd_recipes import JSON

            await client.put_value(prefix + "/config", {"mode": "on"}, JSON)
            assert await client.get_value(prefix + "/config", JSON) == {"mode": "on"}
        """
        return await self._unary_put_value(key, value, codec, lease=lease).send()
