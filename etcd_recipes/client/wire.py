"""What the client's long-lived streams need from it, in one small object.

The watch hub and the lease keeper own a gRPC stream each; they used to reach into the
client's internals (channel, runner, auth, spec, namespace). :class:`Wire` is that contract:
the client builds it once, when it opens, and hands it to both. Not public.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EtcdRecipeError
from ..metrics import EtcdMetrics
from .rpc import AuthManager, map_grpc_error

__all__ = ["REQUIRE_LEADER", "StreamMoved", "Wire", "task_cancelling"]


# Go's clientv3.WithRequireLeader: a member that loses its leader ends the stream
# ("etcdserver: no leader") instead of keeping it open and silent, so the client re-opens it,
# on another endpoint when it has one. Sent on the watch and keep-alive streams.
REQUIRE_LEADER = ("hasleader", "true")


def task_cancelling() -> bool:
    """Whether the running task itself is being cancelled, not only a call it awaited (a
    gRPC call cancelled by the client raises ``CancelledError`` in its reader too)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return bool(cancelling()) if cancelling is not None else False


class StreamMoved(EtcdRecipeError):
    """A stream the client ended on purpose to re-open it on a new channel (its endpoints
    changed): no failure -- nothing is reported as suspended, and it re-opens at once."""


@dataclass(frozen=True, eq=False)
class Wire:
    """The channel getter, call metadata, auth, endpoints, namespace and metrics of a client."""

    channel: Callable[[], Any]
    """The open channel; raises the client's misuse errors (closed, wrong loop, forked)."""
    metadata: Callable[[], tuple[tuple[str, str], ...] | None]
    """The metadata (auth token) to attach to a new call or stream."""
    auth: AuthManager | None
    endpoints: str
    namespace: bytes
    metrics: EtcdMetrics

    def strip(self, key: bytes) -> bytes:
        """``key`` without the namespace (the same object when there is none to strip)."""
        ns = self.namespace
        if ns and key.startswith(ns):
            return key[len(ns) :]
        return key

    def error(self, exc: BaseException, *, op: str) -> EtcdRecipeError:
        """The library error for a gRPC failure of ``op``."""
        return map_grpc_error(exc, op=op, endpoints=self.endpoints)

    async def refresh_auth(self) -> None:
        """Re-authenticate (a stream's token went stale); no-op without auth."""
        if self.auth is not None:
            await self.auth.refresh()
