"""The client's connection state (the gRPC channel's connectivity): CONNECTED after open,
SUSPENDED while the server is down, RECONNECTED once it is back; the stream is conflated and
cold, and aclose() ends it and its watcher task."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import ClientClosedError, ConnectionState, connect
from tests.helpers import eventually, first_item_then_break

CONNECTED, SUSPENDED, RECONNECTED = (
    ConnectionState.CONNECTED,
    ConnectionState.SUSPENDED,
    ConnectionState.RECONNECTED,
)


def _watchers() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "etcd-recipes-channel-state"]


@pytest.mark.slow
async def test_kill_and_restart_read_as_suspended_then_reconnected(fresh_etcd_server):
    server = fresh_etcd_server
    changes: list[tuple[ConnectionState, ConnectionState]] = []
    client = connect(**server.client_kwargs())
    client.add_connection_state_listener(lambda new, old: changes.append((old, new)))
    async with client:
        states = client.connection_states()
        seen: list[ConnectionState] = []

        async def consume() -> None:
            async for state in states:
                seen.append(state)

        consumer = asyncio.create_task(consume())
        await eventually(lambda: seen == [CONNECTED], what="the current state first")
        server.kill()
        await eventually(lambda: seen[-1:] == [SUSPENDED], what="SUSPENDED")
        assert client.connection_state is SUSPENDED
        await asyncio.to_thread(server.restart)
        await eventually(lambda: seen[-1:] == [RECONNECTED], timeout=20, what="RECONNECTED")
        assert seen == [CONNECTED, SUSPENDED, RECONNECTED]
        assert await client.ping()
        await eventually(lambda: len(changes) == 2, what="the listener")
        assert changes == [(CONNECTED, SUSPENDED), (SUSPENDED, RECONNECTED)]
    await asyncio.wait_for(consumer, 5)  # aclose() ended the iteration
    assert _watchers() == []  # and the channel watcher


async def test_connection_states_are_cold_and_end_on_close(etcd_server):
    before = len(_watchers())
    async with connect(**etcd_server.client_kwargs()) as client:
        # No listener, no stream: no watcher task (a gRPC call always in flight would make a
        # forked child crash inside gRPC); the state is read from the channel when asked.
        assert len(_watchers()) == before
        assert client.connection_state is CONNECTED
        assert await first_item_then_break(client.connection_states()) is CONNECTED
        assert len(_watchers()) == before + 1  # a stream starts it
        gc.collect()
        assert client._conn.stream_count == 0  # breaking out unregistered it
        waiting = client.connection_states()
        assert await anext(waiting) is CONNECTED
        pending = asyncio.create_task(anext(waiting))
        await asyncio.sleep(0.05)
        assert not pending.done()  # nothing changed: it waits
    await asyncio.wait({pending}, timeout=5)
    with pytest.raises(StopAsyncIteration):
        await pending
    with pytest.raises(ClientClosedError):
        client.connection_states()
