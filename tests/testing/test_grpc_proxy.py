"""``etcd grpc-proxy`` as a test leg: the harness (EtcdGrpcProxy, fixtures) and the proxy's
measured behaviour, pinned (etcd 3.5.1). Each fact here is listed under "Known differences"
in :class:`~etcd_recipes.testing.EtcdGrpcProxy`; update both together.

Watch facts are pinned on the raw gRPC stream (what any client sees), because our client's
watches do not work through the proxy at all (see ``test_our_client_misroutes_...``).
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aetcd import rpc as pb

from etcd_recipes import Cmp, EtcdClient, Op, connect
from etcd_recipes.errors import AuthenticationError, NotStartedError, UsageError
from etcd_recipes.testing import EtcdGrpcProxy, EtcdServer, EtcdStartupError, ExternalEtcdServer
from etcd_recipes.testing._process import free_ports

WAIT = 5.0  # generous bound for things that do happen
SILENCE = 2.0  # how long "nothing arrives" is watched for


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- raw gRPC helpers


class RawWatch:
    """One raw Watch stream on a sync channel: ``send`` requests, ``next`` responses."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        self._requests: queue.Queue[Any] = queue.Queue()
        self._responses: queue.Queue[Any] = queue.Queue()
        self._call = pb.WatchStub(self.channel).Watch(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                self._responses.put(message)
            self._responses.put(EOFError("the watch stream ended"))
        except grpc.RpcError as exc:
            self._responses.put(exc)

    def create(self, key: bytes, **fields: Any) -> None:
        create = pb.WatchCreateRequest(key=key, **fields)
        self._requests.put(pb.WatchRequest(create_request=create))

    def request_progress(self) -> None:
        self._requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def next(self, timeout: float = WAIT) -> Any:
        """The next response, the stream's error (returned, not raised), or None on timeout."""
        try:
            return self._responses.get(timeout=timeout)
        except queue.Empty:
            return None

    def created(self, key: bytes, **fields: Any) -> Any:
        self.create(key, **fields)
        response = self.next()
        assert response is not None and response.created, response
        return response

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._reader.join(WAIT)
        self.channel.close()


@pytest.fixture
def raw_watches() -> Iterator[list[RawWatch]]:
    opened: list[RawWatch] = []
    yield opened
    for watch in opened:
        watch.close()


def open_watch(opened: list[RawWatch], endpoint: str) -> RawWatch:
    watch = RawWatch(endpoint)
    opened.append(watch)
    return watch


def kv(endpoint: str) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(endpoint)
    return channel, pb.KVStub(channel)


def put(stub: Any, key: bytes, value: bytes) -> int:
    """Put through a raw KV stub; return the new revision."""
    return int(stub.Put(pb.PutRequest(key=key, value=value), timeout=WAIT).header.revision)


def events(response: Any) -> list[tuple[str, bytes, bytes, int, bytes | None]]:
    return [
        (
            "DELETE" if e.type == pb.Event.DELETE else "PUT",
            bytes(e.kv.key),
            bytes(e.kv.value),
            int(e.kv.mod_revision),
            bytes(e.prev_kv.value) if e.HasField("prev_kv") else None,
        )
        for e in response.events
    ]


# --------------------------------------------------------------------------- the harness


def test_lifecycle_same_port_and_nothing_left(etcd_server: EtcdServer) -> None:
    proxy = EtcdGrpcProxy(etcd_server)
    with pytest.raises(NotStartedError):
        _ = proxy.endpoint
    proxy.start()
    pid = proxy.pid
    log_path = proxy.log_path
    assert pid is not None and log_path is not None and log_path.exists()
    assert proxy.upstream_endpoints == [etcd_server.endpoint]
    assert proxy.endpoints == [proxy.endpoint] and proxy.url == f"http://{proxy.endpoint}"
    assert proxy.client_kwargs() == {"endpoints": [proxy.url]}
    assert "running" in repr(proxy) and proxy.is_healthy()
    endpoint = proxy.endpoint

    proxy.kill()
    assert not proxy.is_running and not pid_alive(pid) and not proxy.is_healthy()
    proxy.restart()
    assert proxy.endpoint == endpoint and proxy.is_healthy() and proxy.pid != pid

    last = proxy.pid
    assert last is not None
    proxy.stop()
    proxy.stop()  # idempotent
    assert not pid_alive(last) and not log_path.parent.exists()
    with pytest.raises(UsageError):
        proxy.start()
    # A proxy never leaves a default.proxy data dir in the working directory.
    assert not Path("default.proxy").exists()


def test_startup_failures_report_the_log_and_clean_up() -> None:
    (dead_port,) = free_ports(1)  # nothing listens there
    proxy = EtcdGrpcProxy(ExternalEtcdServer([f"127.0.0.1:{dead_port}"]), startup_timeout=0.5)
    with pytest.raises(EtcdStartupError, match="did not become healthy") as info:
        proxy.start()
    assert "log tail" in str(info.value) and not proxy.is_running

    bad = EtcdGrpcProxy(ExternalEtcdServer(["127.0.0.1:1"]), extra_args=["--no-such-flag"])
    with pytest.raises(EtcdStartupError, match="no-such-flag"):
        bad.start()
    log_path = bad.log_path
    assert log_path is not None and not log_path.parent.exists()


def test_a_proxy_is_reaped_when_its_owner_dies_without_cleanup(etcd_server: EtcdServer) -> None:
    """The EtcdServer watchdog also guards the proxy: a SIGKILLed test worker leaves none."""
    script = (
        "import os\n"
        "from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer\n"
        f"p = EtcdGrpcProxy(ExternalEtcdServer([{etcd_server.endpoint!r}])).start()\n"
        "print(p.pid, p.log_path.parent, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    pid, temp_dir = int(out[0]), Path(out[1])
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, 9)
        raise AssertionError("the orphaned grpc-proxy was not reaped within 10 s")
    deadline = time.monotonic() + 5
    while temp_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not temp_dir.exists()


def test_fixtures_put_a_private_proxy_before_the_shared_server(
    etcd_grpc_proxy: EtcdGrpcProxy, etcd_server: EtcdServer
) -> None:
    assert etcd_grpc_proxy.upstream is etcd_server and etcd_grpc_proxy.is_healthy()
    etcd_grpc_proxy.kill()  # a private proxy: the shared server is untouched
    assert etcd_server.is_healthy()


async def test_etcd_leg_runs_on_both_legs(
    etcd_leg: EtcdClient, etcd_client: EtcdClient, etcd_prefix: str, request: Any
) -> None:
    leg = request.node.callspec.params["etcd_leg"]
    assert request.node.name.endswith(f"[{leg}]")
    await etcd_leg.put(etcd_prefix + "k", leg)
    assert (await etcd_client.get(etcd_prefix + "k")).text == leg  # type: ignore[union-attr]
    assert (etcd_leg.endpoints == etcd_client.endpoints) == (leg == "direct")


# --------------------------------------------------------------------------- (a), (f): unary


async def test_kv_txn_and_leases_pass_through(
    etcd_proxy_client: EtcdClient, etcd_client: EtcdClient, etcd_prefix: str
) -> None:
    proxied, direct = etcd_proxy_client, etcd_client
    rev = (await proxied.put(etcd_prefix + "k", b"v")).revision
    got = await direct.get(etcd_prefix + "k")
    assert got is not None and got.value == b"v" and got.mod_revision == rev

    key = etcd_prefix + "leader"
    assert (await proxied.txn([Cmp.missing(key)], [Op.put(key, b"me")])).succeeded
    r = await proxied.txn([Cmp.missing(key)], [Op.put(key, b"you")], [Op.get(key)])
    assert not r.succeeded and r.responses[0].kvs[0].value == b"me"  # type: ignore[union-attr]

    lease = await proxied.lease_grant(30)
    await proxied.put(etcd_prefix + "leased", b"x", lease=lease.id)
    info = await direct.lease_time_to_live(lease.id, keys=True)
    assert 0 < info.ttl <= 30 and info.keys == [(etcd_prefix + "leased").encode()]
    assert await proxied.lease_revoke(lease.id)
    assert await direct.get(etcd_prefix + "leased") is None


async def test_header_revisions_are_the_servers_but_serializable_reads_are_cached(
    etcd_proxy_client: EtcdClient, etcd_client: EtcdClient, etcd_prefix: str
) -> None:
    proxied, direct = etcd_proxy_client, etcd_client
    key = etcd_prefix + "k"
    await direct.put(key, b"1")
    assert (await proxied.range(key)).revision == (await direct.range(key)).revision
    status_p, status_d = await proxied.status(), await direct.status()
    assert status_p.member_id == status_d.member_id  # the header names etcd, not the proxy

    first = await proxied.range(key, serializable=True)  # fills the proxy's cache
    second = (await direct.put(key, b"2")).revision  # written around the proxy
    cached = await proxied.range(key, serializable=True)
    assert [kv.value for kv in cached] == [b"1"] and cached.revision == first.revision < second
    fresh = await proxied.range(key)  # a linearizable read goes to etcd
    assert [kv.value for kv in fresh] == [b"2"] and fresh.revision >= second
    await proxied.put(key, b"3")  # a write through the proxy invalidates its cache
    assert [kv.value for kv in await proxied.range(key, serializable=True)] == [b"3"]


# --------------------------------------------------------------------------- (b): watches


def test_proxy_numbers_watches_itself(
    etcd_grpc_proxy: EtcdGrpcProxy, etcd_server: EtcdServer, raw_watches: list[RawWatch]
) -> None:
    """The root cause of the client's trouble: the proxy ignores ``WatchCreateRequest.watch_id``
    and numbers the watches of each stream 0, 1, 2...; etcd itself honours the id."""
    for endpoint, expected in ((etcd_server.endpoint, [7, 9]), (etcd_grpc_proxy.endpoint, [0, 1])):
        stream = open_watch(raw_watches, endpoint)
        ids = [int(stream.created(b"/p/ids", watch_id=wid).watch_id) for wid in (7, 9)]
        assert ids == expected, endpoint


async def test_our_client_routes_watches_through_the_proxy(
    etcd_proxy_client: EtcdClient, etcd_prefix: str
) -> None:
    """The proxy numbers a stream's watches itself (0, 1, ...), ignoring requested ids; our
    client asks for "any id" and matches each "created" reply to the oldest waiting create
    (replies keep the requests' order), so a lone watch starts and two watches each get their
    own events -- also after one of them is closed and another created."""
    lone = await asyncio.wait_for(etcd_proxy_client.watch(etcd_prefix + "lone").start(), WAIT)
    await lone.aclose()
    watch_a = etcd_proxy_client.watch(etcd_prefix + "a")
    watch_b = etcd_proxy_client.watch(etcd_prefix + "b")
    await asyncio.wait_for(asyncio.gather(watch_a.start(), watch_b.start()), WAIT)
    try:
        await etcd_proxy_client.put(etcd_prefix + "b", b"for b")
        await etcd_proxy_client.put(etcd_prefix + "a", b"for a")
        event_a = await asyncio.wait_for(anext(watch_a), WAIT)
        event_b = await asyncio.wait_for(anext(watch_b), WAIT)
        assert event_a.kv.value == b"for a" and event_b.kv.value == b"for b"
    finally:
        await watch_a.aclose()
        await watch_b.aclose()


def test_raw_watches_deliver_events_prev_kv_prefixes_and_history(
    etcd_grpc_proxy: EtcdGrpcProxy, etcd_prefix: str, raw_watches: list[RawWatch]
) -> None:
    p = etcd_prefix.encode()
    channel, stub = kv(etcd_grpc_proxy.upstream.endpoint)
    with channel:
        base = put(stub, p + b"x", b"0")
        stream = open_watch(raw_watches, etcd_grpc_proxy.endpoint)
        stream.created(p, range_end=p[:-1] + bytes([p[-1] + 1]), prev_kv=True)  # a prefix
        put(stub, p + b"x", b"1")
        stub.DeleteRange(pb.DeleteRangeRequest(key=p + b"x"), timeout=WAIT)
        seen: list[Any] = []
        while len(seen) < 2:
            response = stream.next()
            assert response is not None and not isinstance(response, Exception), response
            seen += events(response)
        assert seen == [
            ("PUT", p + b"x", b"1", base + 1, b"0"),
            ("DELETE", p + b"x", b"", base + 2, b"1"),
        ]
        created = stream.created(p + b"x", start_revision=base)  # history from the past
        assert int(created.header.revision) == base + 2  # the head, as etcd says
        replay: list[Any] = []
        while len(replay) < 3:
            response = stream.next()
            assert response is not None and not isinstance(response, Exception), response
            replay += [(e[0], e[3]) for e in events(response)]
        assert replay == [("PUT", base), ("PUT", base + 1), ("DELETE", base + 2)]


# --------------------------------------------------------------------------- (c): progress


def test_progress_requests_go_unanswered_through_the_proxy(
    etcd_grpc_proxy: EtcdGrpcProxy, etcd_server: EtcdServer, raw_watches: list[RawWatch]
) -> None:
    direct = open_watch(raw_watches, etcd_server.endpoint)
    proxied = open_watch(raw_watches, etcd_grpc_proxy.endpoint)
    for stream in (direct, proxied):
        stream.created(b"/p/progress")  # from now: caught up at once
        stream.request_progress()
    answer = direct.next()
    assert answer is not None and int(answer.watch_id) == -1 and not answer.events  # etcd: yes
    assert proxied.next(timeout=SILENCE) is None  # the proxy: nothing


@pytest.mark.slow
def test_per_watch_progress_notifications_pass_through(raw_watches: list[RawWatch]) -> None:
    """``progress_notify=True`` watches do get etcd's periodic notifications through the proxy
    (at the server's --experimental-watch-progress-notify-interval, 10 min by default)."""
    with (
        EtcdServer(extra_args=["--experimental-watch-progress-notify-interval=200ms"]) as server,
        EtcdGrpcProxy(server) as proxy,
    ):
        stream = open_watch(raw_watches, proxy.endpoint)
        created = stream.created(b"/p/notify", progress_notify=True)
        notification = stream.next()
        assert notification is not None and not isinstance(notification, Exception)
        assert notification.watch_id == created.watch_id and not notification.events
        assert int(notification.header.revision) == int(created.header.revision)


# --------------------------------------------------------------------------- (d): compaction


def test_compaction_is_signalled_through_the_proxy(
    fresh_etcd_server: EtcdServer, raw_watches: list[RawWatch]
) -> None:
    with EtcdGrpcProxy(fresh_etcd_server) as proxy:
        channel, stub = kv(fresh_etcd_server.endpoint)
        with channel:
            first = put(stub, b"/d", b"1")
            put(stub, b"/d", b"2")
            last = put(stub, b"/d", b"3")
            stub.Compact(pb.CompactionRequest(revision=last), timeout=WAIT)
        for endpoint in (fresh_etcd_server.endpoint, proxy.endpoint):
            stream = open_watch(raw_watches, endpoint)
            stream.created(b"/d", start_revision=first)
            cancel = stream.next()
            assert cancel is not None and not isinstance(cancel, Exception), endpoint
            assert cancel.canceled and int(cancel.compact_revision) == last, endpoint


# --------------------------------------------------------------------------- (e): faults


def test_killing_the_proxy_fails_the_stream_and_a_new_one_resumes(
    etcd_grpc_proxy: EtcdGrpcProxy, etcd_prefix: str, raw_watches: list[RawWatch]
) -> None:
    key = etcd_prefix.encode() + b"k"
    stream = open_watch(raw_watches, etcd_grpc_proxy.endpoint)
    resume = int(stream.created(key).header.revision) + 1
    etcd_grpc_proxy.kill()
    error = stream.next()
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAVAILABLE
    channel, stub = kv(etcd_grpc_proxy.upstream.endpoint)
    with channel:
        written = put(stub, key, b"while down")
    etcd_grpc_proxy.restart()
    again = open_watch(raw_watches, etcd_grpc_proxy.endpoint)
    again.created(key, start_revision=resume)
    response = again.next()
    assert response is not None and not isinstance(response, Exception), response
    assert [(e[2], e[3]) for e in events(response)] == [(b"while down", written)]


@pytest.mark.slow
def test_a_server_restart_behind_a_live_proxy_is_hidden_from_the_client(
    fresh_etcd_server: EtcdServer, raw_watches: list[RawWatch]
) -> None:
    server = fresh_etcd_server
    with EtcdGrpcProxy(server) as proxy:
        channel, stub = kv(proxy.endpoint)
        with channel:
            put(stub, b"/e", b"1")
            stub.Range(pb.RangeRequest(key=b"/e", serializable=True), timeout=WAIT)  # cached
            stream = open_watch(raw_watches, proxy.endpoint)
            stream.created(b"/e")
            server.kill()
            assert stream.next(timeout=1.0) is None  # the stream stays open and silent
            with pytest.raises(grpc.RpcError) as info:  # unary calls wait for their deadline
                stub.Range(pb.RangeRequest(key=b"/e"), timeout=0.5)
            code = info.value.code()
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                code == grpc.StatusCode.UNKNOWN
                and "deadline exceeded" in (info.value.details() or "")
            ), info.value
            cached = stub.Range(pb.RangeRequest(key=b"/e", serializable=True), timeout=WAIT)
            assert [bytes(k.value) for k in cached.kvs] == [b"1"]  # served by the proxy alone
            assert not proxy.is_healthy()

            server.restart()
            direct_channel, direct = kv(server.endpoint)
            with direct_channel:
                written = put(direct, b"/e", b"2")
            response = stream.next(timeout=15.0)  # after the proxy's own reconnect backoff
            assert response is not None and not isinstance(response, Exception), response
            assert [(e[2], e[3]) for e in events(response)] == [(b"2", written)]


@pytest.mark.slow
async def test_tls_and_auth_upstreams(etcd_prefix: str) -> None:
    """A TLS upstream is dialled with a throwaway certificate without a Common Name; auth
    tokens pass through; mutual TLS with the harness's client certificate is refused."""
    with EtcdServer(tls=True, auth=True) as server, EtcdGrpcProxy(server) as proxy:
        kwargs = proxy.client_kwargs()
        assert kwargs == {"endpoints": [proxy.url], "user": "root", "password": "rootpw"}
        async with connect(**kwargs) as root:
            await root.put(etcd_prefix + "k", b"v")
        async with connect(endpoints=[proxy.url]) as anonymous:
            with pytest.raises(AuthenticationError):  # as directly: no token, no access
                await anonymous.put(etcd_prefix + "k", b"w")
    with EtcdServer(client_cert_auth=True) as mtls:
        with pytest.raises(EtcdStartupError, match="non empty Common Name"):
            EtcdGrpcProxy(mtls).start()
