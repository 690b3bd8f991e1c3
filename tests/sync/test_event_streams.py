"""Event streams in the blocking facade: plain iterators read from a thread, closed by
``with``/``close()``/``break``, ended by the recipe's (or client's) ``close()``."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest

from etcd_recipes.sync import (
    ConnectionState,
    DistributedMutex,
    EtcdClient,
    LeaderLatch,
    LockLostError,
    connect,
)


def test_lock_loss_read_from_a_thread(client: EtcdClient, etcd_prefix: str) -> None:
    path = etcd_prefix + "m"
    mutex = DistributedMutex(client, path)
    losses = mutex.lock_lost_events()
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(losses))  # until the stream ends
    reader.start()
    assert mutex.acquire()
    client.delete(f"{path}/{mutex.hold.lease_id:x}")  # out of band: the hold is lost
    with mutex.lock_lost_events() as second:
        pass  # closed at once by `with`
    deadline = time.monotonic() + 10
    while mutex.is_held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mutex.release() is False
    mutex.close()  # ends the reader's iteration
    reader.join(10)
    assert not reader.is_alive()
    assert len(got) == 1 and isinstance(got[0], LockLostError)
    assert list(second) == []
    assert client._rt.call_sync(lambda: mutex._a._lost_events.stream_count) == 0
    assert client.count(path + "/") == 0


def test_breaking_out_of_a_blocking_loop_unregisters(client: EtcdClient, etcd_prefix: str) -> None:
    with LeaderLatch(client, etcd_prefix + "election") as latch:
        for leading in latch.leadership_events():
            if leading:
                break
        gc.collect()
        assert client._rt.call_sync(lambda: latch._a._leadership_events.stream_count) == 0


@pytest.mark.slow
def test_client_connection_states_across_a_restart(fresh_etcd_server: Any) -> None:
    with connect(**fresh_etcd_server.client_kwargs()) as client:
        states = client.connection_states()
        seen: list[ConnectionState] = []
        changed = threading.Condition()

        def read() -> None:
            for state in states:
                with changed:
                    seen.append(state)
                    changed.notify_all()

        reader = threading.Thread(target=read)
        reader.start()
        with changed:
            assert changed.wait_for(lambda: seen == [ConnectionState.CONNECTED], 10)
        fresh_etcd_server.kill()
        with changed:
            assert changed.wait_for(lambda: seen[-1] is ConnectionState.SUSPENDED, 10)
        fresh_etcd_server.restart()
        with changed:
            assert changed.wait_for(lambda: seen[-1] is ConnectionState.RECONNECTED, 20)
        assert client.ping()
    reader.join(10)  # close() ended the iteration
    assert not reader.is_alive()
    assert seen == [
        ConnectionState.CONNECTED,
        ConnectionState.SUSPENDED,
        ConnectionState.RECONNECTED,
    ]
