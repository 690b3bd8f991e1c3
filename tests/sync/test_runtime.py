"""The private loop thread: deadlock guard, deadlines, shutdown and thread hygiene."""

from __future__ import annotations

import asyncio
import gc
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from etcd_recipes.sync import (
    ClientClosedError,
    Cmp,
    EtcdClient,
    EtcdConnectionError,
    EtcdTimeoutError,
    InvalidEndpointError,
    LockLostError,
    Op,
    UsageError,
    connect,
    fail_after,
)
from etcd_recipes.sync._runtime.twin import SyncContextManager

from .conftest import raised_by_closing


def _threads() -> set[threading.Thread]:
    # gRPC's own process-wide poller thread comes and goes with gRPC's global state.
    return {t for t in threading.enumerate() if "_poll_wrapper" not in t.name}


@pytest.fixture
def quiet_threads(etcd_server: Any) -> set[threading.Thread]:
    """The threads alive once gRPC's process-wide poller exists (open and close one client)."""
    with connect(**etcd_server.client_kwargs()) as warm:
        warm.get("/warm-up")
    time.sleep(0.05)
    return _threads()


USES: dict[str, Callable[[EtcdClient], Any]] = {
    "call": lambda c: c.get("/k"),
    "property": lambda c: c.is_open,
    "plain method": lambda c: c.watch("/k"),
    "with": lambda c: c.lease(5).__enter__(),
    "iteration": lambda c: next(c.watch("/k")),
    "close": lambda c: c.close(),
    "listener": lambda c: c.lease(5).add_listener(print),
}


@pytest.mark.parametrize("use", sorted(USES))
def test_running_event_loop_is_refused(client: EtcdClient, use: str) -> None:
    async def inside() -> None:
        USES[use](client)

    with pytest.raises(UsageError, match="running event loop"):
        asyncio.run(inside())
    assert client.ping()  # nothing was broken by the refused call


def test_connect_in_a_running_loop_is_refused(etcd_server: Any) -> None:
    before = _threads()

    async def inside() -> None:
        connect(**etcd_server.client_kwargs())

    with pytest.raises(UsageError):
        asyncio.run(inside())
    assert _threads() == before


def test_the_loop_thread_itself_is_refused(client: EtcdClient) -> None:
    with pytest.raises(UsageError, match="own event-loop thread"):
        client._rt.call_sync(client.get, "/k")  # runs client.get on the loop thread


def test_close_stops_every_thread(etcd_server: Any, quiet_threads: set[threading.Thread]) -> None:
    with connect(**etcd_server.client_kwargs()) as client:
        loop_thread = client._rt.loop_thread
        with client.lease(5) as lease:
            lease.add_listener(print)
            client.lease_revoke(lease.id)
            lease.wait_lost()  # the listener thread ran
        shl = client.self_healing_lease(5, lambda lease_id: True)
        assert shl.start()  # a hook thread ran
        shl.close()
        assert len(_threads() - quiet_threads) >= 3
    assert not loop_thread.is_alive()
    assert _threads() == quiet_threads


def test_forgotten_client_is_closed_by_gc(
    etcd_server: Any, quiet_threads: set[threading.Thread]
) -> None:
    client = connect(**etcd_server.client_kwargs())
    client.open()
    client.put("/gc", "1")
    thread = client._rt.loop_thread
    watch = client.watch("/gc")
    watch.start()
    del client
    gc.collect()
    assert thread.is_alive()  # the watch keeps its client (and loop) alive
    del watch
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert _threads() == quiet_threads


FORGETFUL = """
import sys
from etcd_recipes.sync import connect
client = connect(sys.argv[1])
client.open()
client.put("/forgetful", "1")
watch = client.watch("/forgetful", prefix=True)
watch.start()
lease = client.lease(30)
lease.grant()
lease.add_listener(print)
shl = client.self_healing_lease(30, lambda lease_id: True)
shl.start()
print("ok", flush=True)
"""


def test_forgotten_close_exits_cleanly(etcd_server: Any) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", FORGETFUL, etcd_server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"
    assert proc.stderr == ""


def test_closed_client(etcd_server: Any) -> None:
    client = connect(**etcd_server.client_kwargs())
    with client:
        watch = client.watch("/closed")
        lease = client.lease(5)
    assert not client.is_open
    assert not watch.is_closed  # never started; readable after the loop stopped
    for call in (lambda: client.get("/k"), lambda: lease.grant(), lambda: watch.start()):
        with pytest.raises(ClientClosedError):
            call()
    client.close()
    watch.close()  # close-like calls are no-ops once the client is gone
    with pytest.raises(ClientClosedError):
        client.open()


def test_blocked_thread_gets_client_closed(client: EtcdClient) -> None:
    lease = client.lease(5)
    lease.grant()
    assert isinstance(raised_by_closing(client, lease.wait_lost, 0.1), ClientClosedError)


def test_fail_after_bounds_a_blocking_call(client: EtcdClient) -> None:
    with client.lease(5) as lease:
        started = time.monotonic()
        with pytest.raises(EtcdTimeoutError) as info, fail_after(0.3):
            lease.wait_lost()
        assert 0.29 < time.monotonic() - started < 2
        assert isinstance(info.value, TimeoutError)
        with fail_after(5), fail_after(0.2), pytest.raises(TimeoutError):
            lease.wait_lost()  # the earliest deadline wins
        with fail_after(0.2):
            assert client.get("/fast") is None  # calls that finish in time are unaffected
        assert not lease.is_lost


def test_fail_after_waits_for_the_cleanup(client: EtcdClient, etcd_prefix: str) -> None:
    """A call timed out mid-wait returns only after its shielded cleanup revoked the lease."""
    key = etcd_prefix + "me"
    granted: list[int] = []

    def slow_establish(lease_id: int) -> bool:
        granted.append(lease_id)
        client.txn([Cmp.missing(key)], [Op.put(key, b"me", lease=lease_id)])
        time.sleep(1.0)  # the deadline passes while the hook runs
        return True

    lease = client.self_healing_lease(30, slow_establish)
    started = time.monotonic()
    with pytest.raises(EtcdTimeoutError), fail_after(0.3):
        lease.start()
    assert time.monotonic() - started >= 0.9  # it waited for the hook and the revoke
    assert client.get(key) is None  # cleaned up before the error reached us
    assert client.lease_time_to_live(granted[0]).ttl == -1


def test_fail_after_arguments() -> None:
    with pytest.raises(ValueError, match="fail_after"), fail_after(-1):
        pass
    with pytest.raises(ValueError, match="fail_after"), fail_after(True):
        pass


def test_connect_errors_leave_no_thread(quiet_threads: set[threading.Thread]) -> None:
    with pytest.raises(InvalidEndpointError):
        connect("http://")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here
    with pytest.raises(EtcdConnectionError), connect(f"127.0.0.1:{port}", connect_timeout=0.3):
        pass
    time.sleep(0.05)
    assert _threads() == quiet_threads


def test_sync_call_overhead(client: EtcdClient, etcd_prefix: str) -> None:
    """Report the facade's per-call cost next to the raw RPC (printed with ``-s``)."""
    n = 200
    client.put(etcd_prefix + "k", "v")
    started = time.perf_counter()
    for _ in range(n):
        client.get(etcd_prefix + "k")
    facade = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        client._rt.call(asyncio.sleep, 0)
    hop = (time.perf_counter() - started) / n
    print(f"\nsync get: {facade * 1e6:.0f} µs/call; bare loop round trip: {hop * 1e6:.0f} µs")
    assert hop < 0.01


@pytest.mark.parametrize("where", ["listener", "hook"])
def test_close_from_a_listener_or_a_hook(etcd_server: Any, where: str) -> None:
    client = connect(**etcd_server.client_kwargs())
    client.open()
    thread = client._rt.loop_thread
    done = threading.Event()

    def close_it(*args: Any) -> bool:
        client.close()  # cannot wait for itself: it starts the shutdown and returns
        done.set()
        return True

    if where == "listener":
        lease = client.lease(2)
        lease.grant()
        lease.add_listener(close_it)
        client.lease_revoke(lease.id)
    else:
        with pytest.raises(ClientClosedError):
            client.self_healing_lease(5, close_it).start()
    assert done.wait(10)
    thread.join(15)
    assert not thread.is_alive()
    assert not client.is_open


class ScopedHold:
    """Like a lock's scoped hold: ``__aenter__`` opens a task group and a cancel scope that
    ``__aexit__`` closes; losing the hold cancels the scope and ``__aexit__`` raises."""

    def __init__(self, lose_after: float | None = None) -> None:
        self.lose_after = lose_after

    async def __aenter__(self) -> str:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._scope = anyio.CancelScope()
        self._scope.__enter__()
        if self.lose_after is not None:
            self._tg.start_soon(self._lose, self.lose_after)
        return "held"

    async def _lose(self, delay: float) -> None:
        await anyio.sleep(delay)
        self._scope.cancel()

    async def __aexit__(self, *exc_info: Any) -> bool:
        suppressed = bool(self._scope.__exit__(*exc_info))
        lost = self._scope.cancelled_caught
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        if lost:
            raise LockLostError("the hold was lost while the block ran")
        return suppressed


def test_with_block_over_scoped_context_manager(client: EtcdClient) -> None:
    hold: SyncContextManager[str] = SyncContextManager(client._rt, ScopedHold())
    with hold as value:
        assert value == "held"
        assert client.ping()


def test_lost_hold_is_raised_when_the_block_ends(client: EtcdClient) -> None:
    started = time.monotonic()
    with pytest.raises(LockLostError), SyncContextManager(client._rt, ScopedHold(0.1)):
        time.sleep(0.4)  # sync code cannot be interrupted; the loss surfaces at the exit
    assert time.monotonic() - started >= 0.4


def test_client_closed_while_a_block_is_open(etcd_server: Any) -> None:
    client = connect(**etcd_server.client_kwargs())
    client.open()
    with SyncContextManager(client._rt, ScopedHold()):
        client.close()  # cancels the open block (its __aexit__ runs), then stops the loop
    assert not client._rt.loop_thread.is_alive()


def test_the_facade_waits_as_long_as_the_longest_async_cleanup() -> None:
    from etcd_recipes._core.shield import CLEANUP_TIMEOUT
    from etcd_recipes.sync._runtime.runtime import FACADE_CLEANUP_WAIT

    # A recipe's aclose() is bounded at twice one cleanup (_recipe/recipe.py): 10 s today.
    assert FACADE_CLEANUP_WAIT == 2 * CLEANUP_TIMEOUT == 10.0
