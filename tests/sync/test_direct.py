"""The facade's plain KV calls (``get``, ``put``, ``delete``, ``range``, ``get_prefix``,
``count``, a ``txn`` that writes, ``get_value``, ``put_value``) are sent from the caller's
thread (``Runtime.direct``): no hand-off to the loop, yet the same results, errors, deadlines,
retries, auth, TLS and metrics as the calls that run on the loop (real etcd)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from etcd_recipes import EtcdMetrics
from etcd_recipes.sync import (
    JSON,
    ClientClosedError,
    Cmp,
    EtcdClient,
    EtcdRecipeError,
    EtcdTimeoutError,
    Op,
    ResilienceConfig,
    RetryPolicy,
    RpcResilience,
    TimeoutRetriesExhaustedError,
    UsageError,
    ValueTooLargeError,
    connect,
    fail_after,
)
from etcd_recipes.testing import EtcdServer

from .conftest import raised_by_closing

PLAIN = ("put", "get", "range", "get_prefix", "count", "delete")


class RpcSink(EtcdMetrics):
    """Records every ``rpc_finished`` event with the thread that reported it."""

    deliver_inline = True

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, threading.Thread]] = []

    def rpc_finished(self, operation: str, duration: float, attempts: int, outcome: str) -> None:
        self.events.append((operation, attempts, outcome, threading.current_thread()))


class Hops:
    """Counts what the calling thread hands to the client's loop (every hop goes through
    ``Runtime._submit``)."""

    def __init__(self, client: EtcdClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        submit = client._rt._submit

        def counted(*args: Any) -> None:
            self.count += 1
            submit(*args)

        monkeypatch.setattr(client._rt, "_submit", counted)


@pytest.fixture
def paused(fresh_etcd_server: EtcdServer) -> Iterator[EtcdServer]:
    """A private server, resumed at the end whatever the test did with it."""
    yield fresh_etcd_server
    if fresh_etcd_server.is_paused:
        fresh_etcd_server.resume()


def _every_plain_call(client: EtcdClient, p: str) -> None:
    first = client.put(p + "a", "1")
    assert client.put(p + "a", b"2", prev_kv=True).prev_kv.value == b"1"  # type: ignore[union-attr]
    client.put(p + "b", "3")
    kv = client.get(p + "a")
    assert kv is not None
    assert (kv.value, kv.version) == (b"2", 2)
    assert client.get(p + "a", revision=first.revision).value == b"1"  # type: ignore[union-attr]
    assert client.get(p + "missing") is None
    assert [k.value for k in client.range(p + "a", range_end=p + "c")] == [b"2", b"3"]
    assert client.get_prefix(p, keys_only=True).count == 2
    assert client.count(p) == 2
    assert client.delete(p, prefix=True, prev_kv=True).deleted == 2
    assert client.count(p) == 0


def test_plain_kv_calls_make_no_hand_off(
    client: EtcdClient, etcd_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = Hops(client, monkeypatch)
    _every_plain_call(client, etcd_prefix)
    key = etcd_prefix + "t"
    assert client.txn([Cmp.missing(key)], [Op.put(key, "x")]).succeeded
    assert not client.txn([Cmp.missing(key)], [Op.put(key, "y")], [Op.delete(key)]).succeeded
    client.put_value(key, {"n": 1}, JSON)
    assert client.get_value(key, JSON) == {"n": 1}
    assert client.get_value(key + "/missing", JSON, default=0) == 0
    assert hops.count == 0
    # The counter does count: a read-only transaction is never sent from here (it must not be
    # cancelled server-side), nor is anything but a plain KV call.
    read = client.txn([Cmp.missing(key)], [], [Op.get(key)])
    assert JSON.decode(read.responses[0].kvs[0].value) == {"n": 1}  # type: ignore[union-attr]
    assert hops.count == 1
    client.lease_grant(5)
    assert hops.count == 2


def test_results_errors_and_namespace_match_the_loop(etcd_server: Any, etcd_prefix: str) -> None:
    with connect(**etcd_server.client_kwargs(), namespace=etcd_prefix + "ns") as app:
        rev = app.put("/k", "v").revision
        kv = app.get("/k")
        assert kv is not None
        assert kv.key == b"/k"  # the namespace is stripped from results ...
        assert app.get_prefix("/").kvs == [kv]
        with connect(**etcd_server.client_kwargs()) as plain:
            raw = plain.txn([], [Op.get(etcd_prefix + "ns/k")]).responses[0]
            assert raw.kvs[0].mod_revision == rev  # ... and added on the wire
        with pytest.raises(ValueTooLargeError, match="nothing was sent"):
            app.put("/big", b"x" * (2 * 1024 * 1024))
        assert app.get("/big") is None


def test_fail_after_bounds_a_direct_call(paused: EtcdServer) -> None:
    sink = RpcSink()
    with connect(**paused.client_kwargs(), resilience=ResilienceConfig(metrics=sink)) as c:
        c.put("/k", "v")
        paused.pause()
        started = time.monotonic()
        with pytest.raises(EtcdTimeoutError, match=r"fail_after\(\) deadline"), fail_after(0.3):
            c.get("/k")
        assert 0.25 < time.monotonic() - started < 2
        with pytest.raises(EtcdTimeoutError), fail_after(0):  # already past: nothing sent
            c.get("/k")
        paused.resume()
        assert c.get("/k").value == b"v"  # type: ignore[union-attr]
    outcomes = [(op, outcome) for op, _, outcome, _ in sink.events]
    assert outcomes == [("put", "ok"), ("get", "cancelled"), ("get", "cancelled"), ("get", "ok")]
    assert {thread for *_, thread in sink.events} == {threading.current_thread()}


def test_retries_and_their_exhaustion_are_the_loop_funnel_s(paused: EtcdServer) -> None:
    rpc = RpcResilience(retry_policy=RetryPolicy.bounded(3, delay=0.05), operation_timeout=0.2)
    sink = RpcSink()
    config = ResilienceConfig(rpc=rpc, metrics=sink)
    # No keepalive ping within the test: every attempt ends at its own deadline (a ping timeout
    # would end one as UNAVAILABLE instead, depending on when the ping went out).
    kwargs = paused.client_kwargs() | {"keepalive_time": 60.0, "keepalive_timeout": 30.0}
    with connect(**kwargs, resilience=config) as c:
        c.put("/k", "v")
        paused.pause()
        with pytest.raises(TimeoutRetriesExhaustedError) as direct:
            c.get("/k")
        with pytest.raises(TimeoutRetriesExhaustedError) as looped:  # the same get, on the loop
            c._rt.call(c._a.get, "/k")
        attempts = direct.value.attempts
        assert attempts == looped.value.attempts == 4  # bounded(3): three retries
        assert str(direct.value).split(":")[0] == str(looped.value).split(":")[0]
        # A transaction is never retried (a commit may have landed), here as on the loop.
        with pytest.raises(EtcdTimeoutError) as txn:
            c.txn([], [Op.put("/k", "w")])
        assert not isinstance(txn.value, TimeoutRetriesExhaustedError)
        paused.resume()
        assert c.get("/k").value in (b"v", b"w")  # type: ignore[union-attr]
    assert [(op, attempts, outcome) for op, attempts, outcome, _ in sink.events][1:] == [
        ("get", 4, "deadline_exceeded"),
        ("get", 4, "deadline_exceeded"),
        ("txn", 1, "deadline_exceeded"),
        ("get", 1, "ok"),
    ]


@pytest.mark.skipif(
    not hasattr(signal, "pthread_kill"),
    reason="sends SIGINT to the main thread with signal.pthread_kill (POSIX only; not on Windows)",
)
def test_ctrl_c_interrupts_a_direct_call(paused: EtcdServer) -> None:
    sink = RpcSink()
    with connect(**paused.client_kwargs(), resilience=ResilienceConfig(metrics=sink)) as c:
        c.put("/k", "v")
        paused.pause()
        main = threading.main_thread().ident
        assert main == threading.get_ident()
        timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
        started = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            c.get("/k", timeout=30)
        assert time.monotonic() - started < 5
        paused.resume()
        assert c.get("/k").value == b"v"  # type: ignore[union-attr]  # still usable
    assert sink.events[1][2] == "cancelled"


def test_close_fails_a_call_in_flight_and_every_later_one(paused: EtcdServer) -> None:
    c = connect(**paused.client_kwargs())
    c.__enter__()
    c.put("/k", "v")
    paused.pause()
    raised = raised_by_closing(c, lambda: c.get("/k", timeout=30), 0.3)
    assert isinstance(raised, ClientClosedError)
    paused.resume()
    for name in PLAIN:
        with pytest.raises(ClientClosedError):
            getattr(c, name)("/k", *(["v"] if name == "put" else []))


def test_a_running_event_loop_is_refused(client: EtcdClient, etcd_prefix: str) -> None:
    async def inside() -> None:
        client.get(etcd_prefix + "k")

    with pytest.raises(UsageError, match="running event loop"):
        asyncio.run(inside())

    def on_the_loop_thread() -> None:
        client.get(etcd_prefix + "k")

    with pytest.raises(UsageError, match="own event-loop thread"):
        client._rt.call_sync(on_the_loop_thread)


def test_a_forked_child_is_refused(client: EtcdClient, etcd_prefix: str) -> None:
    client.put(etcd_prefix + "k", "v")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            client.get(etcd_prefix + "k")
            message = b"no error"
        except Exception as exc:
            message = type(exc).__name__.encode()
        os.write(write, message)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"ForkedProcessError"
    os.close(read)
    assert client.get(etcd_prefix + "k").value == b"v"  # type: ignore[union-attr]


@pytest.mark.slow
def test_tls() -> None:
    with EtcdServer(tls=True) as server, connect(**server.client_kwargs()) as c:
        c.put("/k", "v")
        assert c.get("/k").value == b"v"  # type: ignore[union-attr]
        assert c.count("/") == 1


@pytest.mark.slow
def test_an_expired_auth_token_is_refreshed() -> None:
    with EtcdServer(auth=True, auth_token_ttl=1) as server, connect(**server.client_kwargs()) as c:
        c.put("/k", "v")
        generation = c._a._auth.generation  # type: ignore[union-attr]
        time.sleep(2.5)  # the token expires while idle
        assert c.get("/k").value == b"v"  # type: ignore[union-attr]
        assert c._a._auth.generation > generation  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_restarted_server_is_reached_again(fresh_etcd_server: EtcdServer) -> None:
    with connect(**fresh_etcd_server.client_kwargs()) as c:
        c.put("/k", "v")
        fresh_etcd_server.restart()
        assert c.get("/k").value == b"v"  # type: ignore[union-attr]  # reconnected, retried
        c.put("/k", "w")
        assert c.get("/k").value == b"w"  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_leader_of_a_cluster_dies(etcd_cluster: Any) -> None:
    """The direct channel has the client's endpoints and round robin: a dead leader costs the
    plain calls retries, and every acknowledged write is there afterwards."""
    fast = {"keepalive_time": 1.0, "keepalive_timeout": 0.5}
    with connect(**etcd_cluster.client_kwargs(), **fast) as c:
        for i in range(5):
            c.put(f"/f/pre{i}", "v")
        etcd_cluster.leader().kill()
        started = time.monotonic()
        written = 0
        while written < 20:  # each call bounded; a failed attempt in the election is retried
            try:
                c.put(f"/f/post{written}", "v", timeout=1.0)
                written += 1
            except EtcdRecipeError:
                assert time.monotonic() - started < 10
        assert c.count("/f/") == 25
        assert c.get("/f/post19").value == b"v"  # type: ignore[union-attr]
