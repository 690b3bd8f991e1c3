"""The client's lifecycle checks, out of ``client/``: the first contact on ``open()``, the
misuse errors (not open, forked, wrong event loop) and the one-off keep-alive. Not public."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc as pb

from .._core.caller import close_method
from .._core.logctx import library_logger
from ..errors import (
    ClientClosedError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdTimeoutError,
    ForkedProcessError,
    TlsHandshakeError,
    WrongEventLoopError,
)
from ..resilience import RetryPolicy, RpcResilience
from .endpoints import ChannelSpec, parse_endpoints
from .rpc import await_call, await_stream_op
from .wire import Wire

if TYPE_CHECKING:
    from .base import ClientBase

__all__ = ["keep_alive_once", "misuse_error", "verify", "without_learners"]

log = library_logger("etcd_recipes.client")


TLS_SUSPICION = 1.0
"""Seconds of connections closed at once (and nothing else) after which a plain-text client
stops waiting and names the likely TLS mismatch."""

_TLS_HINT = " (if the server uses TLS, connect with https:// or ca_cert=)"


async def verify(wire: Wire, connect_timeout: float, *, secure: bool = False) -> None:
    """Authenticate (if configured) and wait until a member answers ``Status``, retrying
    connection failures for up to ``connect_timeout`` seconds.

    A plain-text client that never got an answer, whose connections the server closes at
    once ("Socket closed"), is most likely talking to a TLS server: only then does the error
    suggest TLS (a server killed later closes sockets too, and says nothing about TLS)."""
    # Deadlines are gRPC's own: grpc.aio turns an outer cancel scope's cancellation into
    # a fresh CancelledError that anyio would not recognise as its timeout.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + connect_timeout
    last: EtcdRecipeError | None = None
    hint = ""
    closed_since: float | None = None  # every answer since then: the socket closed at once
    while True:
        remaining = deadline - loop.time()
        tls_like = closed_since is not None and loop.time() - closed_since >= TLS_SUSPICION
        if tls_like:
            raise EtcdConnectionError(
                f"[{wire.endpoints}] closes every connection at once, as a TLS server does for "
                f"a plain-text client: connect with https:// or ca_cert= (last error: {last})"
            ) from last
        if remaining <= 0:
            raise EtcdConnectionError(
                f"no etcd endpoint answered within {connect_timeout}s: "
                f"[{wire.endpoints}]" + (f"; last error: {last}" if last else "") + hint
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
            if not secure and "socket closed" in str(mapped).lower():
                hint = _TLS_HINT
                closed_since = loop.time() if closed_since is None else closed_since
            else:
                closed_since = None
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))


def misuse_error(state: str, pid: int, loop: asyncio.AbstractEventLoop | None) -> EtcdRecipeError:
    """The error for using a client that is not open, or from another process or loop."""
    if state != "open":
        return ClientClosedError(
            "the client is not open: use 'async with connect(...)' or 'await client.open()'"
            if state == "new"
            else f"the client was closed ({close_method()} was called)"
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


async def without_learners(client: ClientBase) -> ChannelSpec | None:
    """The client's channel settings without the endpoints that are learners, or ``None`` to
    keep them all.

    A learner serves no writes and no linearizable reads ("rpc not supported for learner"), so
    a round-robin channel must not send calls there (Go's client drops learners the same way
    when it syncs endpoints). Asked once, when the client opens, and only with several
    endpoints; an endpoint matches a member by the ``host:port`` of its advertised client
    URLs. etcd 3.5 learners refuse ``MemberList`` too: it is retried over the endpoints
    whatever the client's retry policy. When every endpoint is a learner, or the member list
    cannot be read, nothing changes (calls then fail with an error naming the learner)."""
    spec = client._spec
    if len(spec.endpoints) < 2:
        return None
    policy = RpcResilience(
        retry_policy=RetryPolicy.bounded(2 * len(spec.endpoints), delay=0.01),
        operation_timeout=client._connect_timeout,
    )
    try:
        resp = await client._call(
            "member_list", "MemberList", pb.ClusterStub, pb.MemberListRequest(), resilience=policy
        )
    except EtcdRecipeError as exc:
        log.debug("member list unavailable, learners not excluded: %s", exc)
        return None
    learners: set[tuple[str, int]] = set()
    for member in resp.members:
        if member.isLearner and member.clientURLs:
            with contextlib.suppress(EtcdRecipeError):
                urls = [str(u) for u in member.clientURLs]
                learners.update((e.host, e.port) for e in parse_endpoints(urls))
    kept = tuple(e for e in spec.endpoints if (e.host, e.port) not in learners)
    if not kept or len(kept) == len(spec.endpoints):
        return None
    skipped = [str(e) for e in spec.endpoints if e not in kept]
    log.info("not sending calls to learner endpoints: %s", ", ".join(skipped))
    return dataclasses.replace(spec, endpoints=kept)
