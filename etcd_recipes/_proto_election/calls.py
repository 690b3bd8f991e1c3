"""Calls to etcd's election service through the client's channel, retry funnel and error map.

Kept next to the protos so that the recipe modules never touch gRPC (DESIGN §1): unary calls
go through the client's :class:`~etcd_recipes._core.rpc.RpcRunner` (per-attempt timeout,
retries, auth refresh, metrics, error mapping, cancellation kept intact); the ``Observe``
stream reads through :func:`~etcd_recipes._core.rpc.await_stream_op` for the same reason.

Example::

    resp = await unary(client, "Leader", MESSAGES["LeaderRequest"](name=b"job"), op="leader")
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import EllipsisType
from typing import TYPE_CHECKING, Any

import grpc

from .._core.rpc import await_stream_op, map_grpc_error
from . import method, stream_method

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["stream", "unary"]


async def unary(
    client: EtcdClient,
    rpc: str,
    request: Any,
    *,
    op: str,
    retry: bool = True,
    timeout: float | EllipsisType | None = ...,
) -> Any:
    """One unary election RPC through the client's funnel (``timeout=...``: the default).

    Example::

        resp = await unary(client, "Campaign", req, op="election_campaign", retry=False,
                           timeout=None)
    """
    fn = method(client._channel_or_raise(), rpc)
    response: Any = await client._runner.call(op, fn, request, retry=retry, timeout=timeout)
    return response


async def stream(client: EtcdClient, rpc: str, request: Any, *, op: str) -> AsyncIterator[Any]:
    """The messages of a server-streaming election RPC (``Observe``); the call is cancelled
    when the iteration ends or is cancelled.

    Example::

        async for resp in stream(client, "Observe", req, op="election_observe"):
            print(resp.kv.value)
    """
    call = stream_method(client._channel_or_raise(), rpc)(
        request, metadata=client._runner.metadata()
    )
    try:
        while True:
            try:
                msg = await await_stream_op(call.read(), call)
            except grpc.aio.AioRpcError as exc:
                raise map_grpc_error(exc, op=op, endpoints=client.endpoints) from None
            if msg is grpc.aio.EOF:
                return
            yield msg
    finally:
        call.cancel()
