"""The client's lifecycle checks, out of ``client.py``: the first contact on ``open()``, the
misuse errors (not open, forked, wrong event loop) and the one-off keep-alive. Not public."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
from aetcd import rpc as pb

from ..errors import (
    ClientClosedError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdTimeoutError,
    ForkedProcessError,
    TlsHandshakeError,
    WrongEventLoopError,
)
from .lease_pool import close_lease_pools
from .rpc import await_call, await_stream_op
from .wire import Wire

__all__ = ["close_lease_pools", "keep_alive_once", "misuse_error", "verify"]


async def verify(wire: Wire, connect_timeout: float) -> None:
    """Authenticate (if configured) and wait until a member answers ``Status``, retrying
    connection failures for up to ``connect_timeout`` seconds."""
    # Deadlines are gRPC's own: grpc.aio turns an outer cancel scope's cancellation into
    # a fresh CancelledError that anyio would not recognise as its timeout.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + connect_timeout
    last: EtcdRecipeError | None = None
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise EtcdConnectionError(
                f"no etcd endpoint answered within {connect_timeout}s: "
                f"[{wire.endpoints}]" + (f"; last error: {last}" if last else "")
            ) from last
        try:
            if wire.auth is not None:
                await wire.auth.refresh(timeout=remaining)
            await await_call(
                pb.MaintenanceStub(wire.channel()).Status(
                    pb.StatusRequest(), timeout=remaining, metadata=wire.metadata()
                )
            )
            return
        except grpc.aio.AioRpcError as exc:
            mapped = wire.error(exc, op="connect")
            retriable = isinstance(mapped, (EtcdConnectionError, EtcdTimeoutError))
            if not retriable or isinstance(mapped, TlsHandshakeError):
                raise mapped from None
            last = mapped
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))


def misuse_error(state: str, pid: int, loop: asyncio.AbstractEventLoop | None) -> EtcdRecipeError:
    """The error for using a client that is not open, or from another process or loop."""
    if state != "open":
        return ClientClosedError(
            "the client is not open: use 'async with connect(...)' or 'await client.open()'"
            if state == "new"
            else "the client was closed"
        )
    if os.getpid() != pid:
        return ForkedProcessError(
            "this client was created in another process (before fork()); gRPC channels "
            "cannot cross fork: create a new client in the child"
        )
    if asyncio._get_running_loop() is None:
        return WrongEventLoopError("EtcdClient methods must be awaited in its event loop")
    return WrongEventLoopError(
        "this client belongs to another event loop; create one client per loop "
        "(or use etcd_recipes.sync from threads)"
    )


async def keep_alive_once(wire: Wire, lease_id: int) -> int:
    """One renewal on a short-lived keep-alive stream; the new TTL (``0``: lease gone)."""
    call = pb.LeaseStub(wire.channel()).LeaseKeepAlive(metadata=wire.metadata())

    async def exchange() -> Any:
        await call.write(pb.LeaseKeepAliveRequest(ID=lease_id))
        return await call.read()

    try:
        msg = await await_stream_op(exchange(), call)
    except grpc.aio.AioRpcError as exc:
        raise wire.error(exc, op="lease_keep_alive") from None
    finally:
        call.cancel()
    return 0 if msg is grpc.aio.EOF else int(msg.TTL)
