"""The client's connection state, followed from its gRPC channel's connectivity.

The watcher task keeps the channel connecting (``get_state(try_to_connect=True)``) and maps:

* ``TRANSIENT_FAILURE`` (no endpoint accepts a connection, or an open one failed) ->
  ``SUSPENDED``;
* ``READY`` after that -> ``RECONNECTED``;
* ``IDLE`` and ``CONNECTING`` -> no change (they are steps of a reconnect, or gRPC's own idle
  timeout, not failures).

The channel is followed by a watcher task only while a listener or a stream exists (a gRPC
call always in flight would make a forked child crash inside gRPC); without one,
``connection_state`` is read from the channel when asked.

Not guaranteed: a stopped server is seen at once, but a hung or partitioned one only while a
call, watch or keep-alive keeps the channel busy (the keepalive pings detect it within
``keepalive_time + keepalive_timeout``; etcd rejects pings on an idle connection, so none are
sent then). ``LOST`` is never reported: the client has no session to lose -- leases and holds
are lost per recipe, which reports that itself.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc as pb

from ..errors import EtcdRecipeError
from ..events import ConnectionState
from .listeners import ListenerSet
from .logctx import library_logger
from .streams import Broadcast, EventStream
from .validate import check_timeout

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["ChannelState", "ClientStateListener", "ConnectionStateCalls"]

log = library_logger("etcd_recipes.client")

ClientStateListener = Callable[[ConnectionState, ConnectionState], Any]
"""Called as ``listener(new_state, previous_state)``."""

_FAILURE = grpc.ChannelConnectivity.TRANSIENT_FAILURE
_READY = grpc.ChannelConnectivity.READY


class ChannelState:
    """One client's connection state, its listeners and streams, and the channel watcher."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.state = ConnectionState.CONNECTED
        self.listeners = ListenerSet("client-connection-state")
        self._stream: Broadcast[ConnectionState] = Broadcast(
            "client-connection-state", current=lambda: self.state
        )
        self._task: asyncio.Task[None] | None = None
        self._channel: Any = None

    @property
    def stream_count(self) -> int:
        return self._stream.stream_count

    def stream(self) -> EventStream[ConnectionState]:
        self.sample()
        found = self._stream.stream(1, conflate=True)
        self.follow()
        return found

    def start(self, channel: Any) -> None:
        """The channel is open. Its state is followed by a watcher task only while someone
        listens or streams: a watcher is a gRPC call always in flight, and a process that
        forks while one is (a web server's workers, multiprocessing) gets a child that
        crashes inside gRPC."""
        self._channel = channel
        if len(self.listeners):
            self.follow()

    def follow(self) -> None:
        """Start the watcher task, if the channel is open and it does not run yet."""
        if self._channel is None or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(
            self._watch(self._channel), name="etcd-recipes-channel-state"
        )

    def sample(self) -> ConnectionState:
        """The state now: followed by the watcher, or else read from the channel (no I/O)."""
        if self._channel is not None and (self._task is None or self._task.done()):
            self._apply(self._channel.get_state(try_to_connect=False))
        return self.state

    async def aclose(self) -> None:
        """Stop the watcher and end every stream (the listeners stay, and hear nothing)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        await self._stream.aclose()

    async def _watch(self, channel: Any) -> None:
        try:
            while True:
                connectivity = channel.get_state(try_to_connect=True)
                if connectivity is grpc.ChannelConnectivity.SHUTDOWN:
                    return
                self._apply(connectivity)
                await channel.wait_for_state_change(connectivity)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # pragma: no cover - grpc failed to report
            log.warning("%s: watching the channel state failed: %r", self._name, exc)

    def _apply(self, connectivity: Any) -> None:
        if connectivity is _FAILURE:
            self._set(ConnectionState.SUSPENDED)
        elif connectivity is _READY and self.state is ConnectionState.SUSPENDED:
            self._set(ConnectionState.RECONNECTED)

    def _set(self, new: ConnectionState) -> None:
        old, self.state = self.state, new
        if old is new:
            return
        log.info("%s: connection state %s -> %s", self._name, old.value, new.value)
        self.listeners.emit(new, old)
        self._stream.publish(new)


class ConnectionStateCalls:
    """The connection-state surface of :class:`~etcd_recipes.EtcdClient` (its base class),
    kept here so that ``client.py`` stays readable. Not public."""

    def _me(self) -> EtcdClient:
        return self  # type: ignore[return-value]  # only ever a base of EtcdClient

    @property
    def connection_state(self) -> ConnectionState:
        """``CONNECTED`` once :meth:`open` got an answer, ``SUSPENDED`` while no server can
        be reached, ``RECONNECTED`` when one can again (see :meth:`connection_states`)."""
        return self._me()._conn.sample()

    def add_connection_state_listener(self, listener: ClientStateListener) -> None:
        """Call ``listener(new_state, previous_state)`` once per change of
        :attr:`connection_state` (Curator's connection-state listener); may be added before
        :meth:`open`.

        Example::

            from etcd_recipes import ConnectionState, connect

            def on_change(new: ConnectionState, old: ConnectionState) -> None:
                print(f"etcd connection: {old.value} -> {new.value}")

            app = connect(endpoints)
            app.add_connection_state_listener(on_change)  # before open(): sees every change
            async with app:
                assert app.connection_state is ConnectionState.CONNECTED
            app.remove_connection_state_listener(on_change)
        """
        self._me()._conn.listeners.add(listener)
        self._me()._conn.follow()

    def remove_connection_state_listener(self, listener: ClientStateListener) -> None:
        """Stop calling ``listener``."""
        self._me()._conn.listeners.remove(listener)

    async def ping(self, *, timeout: float = 2.0) -> bool:
        """Whether etcd answers a count-only read of ``health-check-probe`` within
        ``timeout`` seconds: one attempt, never retried, ``False`` instead of raising (also on
        a closed client) -- a readiness probe, bounded even against a hung server.

        Example::

            assert await client.ping()
            assert await client.ping(timeout=0.5)
        """
        seconds = check_timeout(timeout, what="timeout", optional=False)
        me = self._me()
        try:
            req = me._range_request("health-check-probe", count_only=True)
            deadline = None if seconds == math.inf else seconds
            await me._call("ping", "Range", pb.KVStub, req, retry=False, timeout=deadline)
        except EtcdRecipeError:
            return False
        return True

    async def check(self, timeout: float = 1.0) -> bool:
        """Readiness: whether etcd answers within ``timeout`` seconds -- :meth:`ping` with a
        tighter default, for health endpoints (one attempt, never retried, ``False`` instead
        of raising). A paused or unreachable server makes it ``False`` within the deadline.

        Example::

            assert await client.check(timeout=0.5)
        """
        return await self.ping(timeout=timeout)

    def is_live(self) -> bool:
        """Liveness, without an RPC: whether this client is open and usable here (this
        process, this event loop). It says nothing about etcd, so a liveness probe built on it
        does not restart a process because etcd is down; :meth:`check` tells readiness.

        Example::

            assert client.is_live() and await client.check()
        """
        try:
            self._me()._check()
        except EtcdRecipeError:
            return False
        return True

    def connection_states(self) -> EventStream[ConnectionState]:
        """The connection state now, then each change, as an async iterator that ends when the
        client is closed; conflated (a consumer that falls behind skips to the newest state).

        It follows the gRPC channel (kept connecting): a failed or refused connection is
        ``SUSPENDED``, ready again is ``RECONNECTED``. A hung server is noticed only while
        calls, watches or leases keep the channel busy (keepalive pings); ``LOST`` is never
        reported (leases and holds are lost per recipe, which reports it).

        Example::

            from etcd_recipes import ConnectionState

            async with client.connection_states() as states:
                assert await anext(states) is ConnectionState.CONNECTED
        """
        self._me()._check()
        return self._me()._conn.stream()
