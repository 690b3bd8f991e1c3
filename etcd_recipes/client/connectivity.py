"""The connection-state surface of :class:`~etcd_recipes.EtcdClient`: the state, its
listeners and stream, and the readiness/liveness probes (``ping``, ``check``, ``is_live``).
The state itself is followed from the gRPC channel by
:class:`~etcd_recipes.client.channel_state.ChannelState`, whose module says what is and is
not guaranteed.
"""

from __future__ import annotations

import math

from aetcd import rpc as pb

from .._core.streams import EventStream
from .._core.validate import check_timeout
from ..errors import EtcdRecipeError
from ..events import ConnectionState
from .base import ClientBase
from .channel_state import ClientStateListener

__all__ = ["ClientStateListener", "ConnectionStateCalls"]


class ConnectionStateCalls(ClientBase):
    """The connection-state surface of :class:`~etcd_recipes.EtcdClient` (its base class),
    kept here so that ``client/`` stays readable. Not public."""

    @property
    def connection_state(self) -> ConnectionState:
        """``CONNECTED`` once :meth:`open` got an answer, ``SUSPENDED`` while no server can
        be reached, ``RECONNECTED`` when one can again (see :meth:`connection_states`)."""
        return self._conn.sample()

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
        self._conn.listeners.add(listener)
        self._conn.follow()

    def remove_connection_state_listener(self, listener: ClientStateListener) -> None:
        """Stop calling ``listener``."""
        self._conn.listeners.remove(listener)

    async def ping(self, *, timeout: float = 2.0) -> bool:
        """Whether etcd answers a count-only read of ``health-check-probe`` within
        ``timeout`` seconds: one attempt, never retried, ``False`` instead of raising (also on
        a closed client) -- a readiness probe, bounded even against a hung server.

        Example::

            assert await client.ping()
            assert await client.ping(timeout=0.5)
        """
        seconds = check_timeout(timeout, what="timeout", optional=False)
        try:
            req = self._range_request("health-check-probe", count_only=True)
            deadline = None if seconds == math.inf else seconds
            await self._call("ping", "Range", pb.KVStub, req, retry=False, timeout=deadline)
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
            self._check()
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
        self._check()
        return self._conn.stream()
