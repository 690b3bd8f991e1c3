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
from collections.abc import Callable
from typing import Any

import grpc

from .._core.listeners import ListenerSet
from .._core.logctx import library_logger
from .._core.streams import Broadcast, EventStream
from ..events import ConnectionState

__all__ = ["ChannelState", "ClientStateListener"]

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

    def switch(self, channel: Any) -> None:
        """Follow ``channel`` instead of the one before (the client's endpoints changed)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self.start(channel)

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
