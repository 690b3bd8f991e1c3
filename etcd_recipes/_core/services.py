"""etcd's lock and election services, behind :class:`~etcd_recipes.EtcdClient`'s typed methods
(``lock``/``unlock``, ``election_*``), which document them. Not public.

Unary calls go through the client's funnel (per-attempt timeout, retries, auth refresh,
metrics, error mapping, cancellation kept intact); the ``Observe`` stream reads through
:func:`~etcd_recipes._core.rpc.await_stream_op` for the same reason.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import grpc

from .._proto import Method, v3election, v3lock
from ..codecs import to_bytes
from ..errors import EtcdServerError, EtcdTimeoutError, LockTimeoutError
from ..types import ElectionLeaderKey, KeyValue
from .keys import key_bytes
from .rpc import await_stream_op, map_grpc_error
from .txn import Cmp, Op
from .validate import check_lease_id, check_timeout
from .waiting import abort_guard

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["campaign", "leader", "lock", "observe", "proclaim", "resign", "unlock"]

_MESSAGES = v3election.MESSAGES


def _call(
    client: EtcdClient,
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


async def lock(client: EtcdClient, name: bytes | str, lease_id: int, timeout: Any) -> bytes:
    """The v3lock ``Lock`` RPC: never retried, no gRPC deadline (the wait is bounded here),
    the waiter key removed on timeout or cancellation."""
    check_lease_id(lease_id, what="server_lock()")
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


async def unlock(client: EtcdClient, key: bytes | str) -> None:
    """The v3lock ``Unlock`` RPC (deletes ``key``)."""
    request = v3lock.UnlockRequest(key=client._k(key_bytes(key)))
    await _call(client, "unlock", v3lock.UNLOCK, request)


def _leader_key_pb(client: EtcdClient, leader: ElectionLeaderKey) -> Any:
    return _MESSAGES["LeaderKey"](
        name=client._k(leader.name),
        key=client._k(leader.key),
        rev=leader.revision,
        lease=leader.lease,
    )


async def campaign(
    client: EtcdClient, name: bytes | str, value: bytes | str, lease: int, timeout: Any
) -> ElectionLeaderKey:
    """The ``Campaign`` RPC: never retried, ``timeout`` as its deadline, the campaign key
    withdrawn on timeout or cancellation."""
    check_lease_id(lease, what="election_campaign()")
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


async def proclaim(client: EtcdClient, leader: ElectionLeaderKey, value: bytes | str) -> None:
    """The ``Proclaim`` RPC."""
    request = _MESSAGES["ProclaimRequest"](
        leader=_leader_key_pb(client, leader), value=to_bytes(value)
    )
    await _call(client, "election_proclaim", v3election.PROCLAIM, request)


async def leader(client: EtcdClient, name: bytes | str) -> KeyValue | None:
    """The ``Leader`` RPC; ``None`` for etcd's "election: no leader"."""
    request = _MESSAGES["LeaderRequest"](name=client._k(key_bytes(name)))
    try:
        resp = await _call(client, "election_leader", v3election.LEADER, request)
    except EtcdServerError as exc:
        if "election: no leader" in exc.details:
            return None
        raise
    return client._kv(resp.kv)


async def observe(client: EtcdClient, name: bytes | str) -> AsyncIterator[KeyValue]:
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


async def resign(client: EtcdClient, leader: ElectionLeaderKey) -> None:
    """The ``Resign`` RPC."""
    request = _MESSAGES["ResignRequest"](leader=_leader_key_pb(client, leader))
    await _call(client, "election_resign", v3election.RESIGN, request)
