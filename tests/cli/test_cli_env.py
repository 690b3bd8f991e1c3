"""The command reads etcdctl's environment variables, as the library does: ETCDCTL_ENDPOINTS,
ETCDCTL_CACERT/CERT/KEY against a mutual-TLS server, ETCDCTL_USER (``user:password``, or
``user`` with ETCDCTL_PASSWORD) against an auth-enabled one; an explicit option beats the
variable. Every run is a subprocess with a scrubbed environment, as a shell would start it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

pytest.importorskip("typer")

from etcd_recipes import INT64, connect
from etcd_recipes.cli import Exit
from etcd_recipes.testing import EtcdServer

from .proc import one_line_error, run_cli


def run(env: dict[str, str], *args: str):
    """``python -m etcd_recipes.cli ARGS`` with only ``env`` of the etcd(ctl) variables set."""
    return run_cli(*args, env=env, timeout=60)


def member_urls(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    return [url for m in doc["data"]["members"] for url in m["client_urls"]]


def test_etcdctl_endpoints_alone_reaches_the_server(etcd_server) -> None:
    proc = run({"ETCDCTL_ENDPOINTS": etcd_server.endpoint}, "-o", "json", "status")
    assert member_urls(proc) == [etcd_server.url]


def test_without_any_endpoint_it_says_which_variables_it_read() -> None:
    line = one_line_error(run({}, "status"), Exit.USAGE)
    assert "ETCDCTL_ENDPOINTS" in line


def test_an_explicit_endpoints_option_beats_the_variable(etcd_server) -> None:
    env = {"ETCDCTL_ENDPOINTS": "127.0.0.1:1"}  # a closed port
    one_line_error(run(env, "status"), Exit.ERROR)
    proc = run(env, "--endpoints", etcd_server.endpoint, "-o", "json", "status")
    assert member_urls(proc) == [etcd_server.url]


def test_etcdctl_tls_variables_against_a_mutual_tls_server() -> None:
    with EtcdServer(tls=True, client_cert_auth=True) as server:
        tls = server.tls
        assert tls is not None
        env = {
            "ETCDCTL_ENDPOINTS": server.url,
            "ETCDCTL_CACERT": str(tls.ca_cert),
            "ETCDCTL_CERT": str(tls.client_cert),
            "ETCDCTL_KEY": str(tls.client_key),
        }
        assert member_urls(run(env, "-o", "json", "status")) == [server.url]
        # Without the client certificate the server refuses the connection.
        no_cert = {k: v for k, v in env.items() if k not in ("ETCDCTL_CERT", "ETCDCTL_KEY")}
        one_line_error(run(no_cert, "status"), Exit.ERROR)
        # An explicit --cacert beats the variable: a wrong CA makes the handshake fail.
        one_line_error(run(env, "--cacert", str(tls.client_cert), "status"), Exit.ERROR)


def test_tls_options_after_the_command_against_a_mutual_tls_server() -> None:
    with EtcdServer(tls=True, client_cert_auth=True) as server:
        tls = server.tls
        assert tls is not None
        files = ("--cacert", str(tls.ca_cert), "--cert", str(tls.client_cert))
        key = ("--key", str(tls.client_key))
        proc = run({}, "status", "-o", "json", "--endpoints", server.url, *files, *key)
        assert member_urls(proc) == [server.url]
        proc = run({}, "--endpoints", server.url, *files, "counter", "set", "/tls/n", "2", *key)
        assert proc.returncode == 0, proc.stderr
        assert server.etcdctl("get", "/tls/n", "--print-value-only").stdout.strip()
        # Plain text against the TLS server: one line that names the likely mismatch.
        plain = server.url.replace("https://", "http://")
        line = one_line_error(run({}, "status", "--endpoints", plain), Exit.ERROR)
        assert "TLS" in line and len(line) < 200


@pytest.fixture(scope="module")
def auth_server():
    """Auth enabled; user ``app`` (password ``s3cret``) may read and write ``/app/`` only."""
    with EtcdServer(auth=True) as server:
        for args in (
            ("user", "add", "app:s3cret"),
            ("role", "add", "app-rw"),
            ("role", "grant-permission", "app-rw", "--prefix=true", "readwrite", "/app/"),
            ("user", "grant-role", "app", "app-rw"),
        ):
            server.etcdctl(*args, check=True)
        yield server


def test_etcdctl_user_with_password_authenticates_as_that_user(auth_server) -> None:
    env = {"ETCDCTL_ENDPOINTS": auth_server.endpoint, "ETCDCTL_USER": "app:s3cret"}
    proc = run(env, "-o", "json", "counter", "set", "/app/n", "7")
    assert proc.returncode == 0, proc.stderr
    assert auth_server.etcdctl("get", "/app/n", "--print-value-only").returncode == 0
    proc = run(env, "-o", "json", "counter", "get", "/app/n")
    assert json.loads(proc.stdout)["data"]["value"] == 7
    # The same user outside its permission: refused by etcd, so it really is "app".
    line = one_line_error(run(env, "counter", "get", "/other/n"), Exit.ERROR)
    assert "permission denied" in line.lower()


def test_user_options_after_the_command(auth_server) -> None:
    ep = ("--endpoints", auth_server.endpoint)
    proc = run({}, "counter", "set", "/app/late", "5", *ep, "--user", "app:s3cret")
    assert proc.returncode == 0, proc.stderr

    async def read() -> int:
        async with connect(auth_server.endpoint, user="app", password="s3cret") as client:
            kv = await client.get("/app/late")
            assert kv is not None
            return INT64.decode(kv.value)

    assert asyncio.run(read()) == 5
    proc = run({}, "counter", "get", "/app/late", *ep, "--user", "app", "--password", "s3cret")
    assert (proc.returncode, proc.stdout.strip()) == (0, "5"), proc.stderr
    # The same user, given after the command, outside its permission: it really is "app".
    line = one_line_error(run({}, "counter", "get", "/x", *ep, "--user=app:s3cret"), Exit.ERROR)
    assert "permission denied" in line.lower()


def test_etcdctl_user_and_password_in_two_variables(auth_server) -> None:
    env = {
        "ETCDCTL_ENDPOINTS": auth_server.endpoint,
        "ETCDCTL_USER": "app",
        "ETCDCTL_PASSWORD": "s3cret",
    }
    proc = run(env, "counter", "set", "/app/m", "3")
    assert proc.returncode == 0, proc.stderr


def test_a_wrong_password_is_one_line_and_an_explicit_user_beats_the_variable(
    auth_server,
) -> None:
    env = {"ETCDCTL_ENDPOINTS": auth_server.endpoint, "ETCDCTL_USER": "app:wrong"}
    line = one_line_error(run(env, "counter", "get", "/app/n"), Exit.ERROR)
    assert "authentication failed" in line.lower() or "invalid" in line.lower()
    proc = run(env, "--user", "app:s3cret", "counter", "set", "/app/o", "1")
    assert proc.returncode == 0, proc.stderr


def test_etcd_endpoints_wins_over_etcdctl_endpoints_as_in_the_library(etcd_server) -> None:
    from etcd_recipes.client.settings import ENDPOINT_VARIABLES

    assert ENDPOINT_VARIABLES == ("ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS")
    closed = "127.0.0.1:1"
    both = {"ETCD_ENDPOINTS": etcd_server.endpoint, "ETCDCTL_ENDPOINTS": closed}
    assert member_urls(run(both, "-o", "json", "status")) == [etcd_server.url]
    # Swapped: the closed port in ETCD_ENDPOINTS is the one used (not a fallback order).
    swapped = {"ETCD_ENDPOINTS": closed, "ETCDCTL_ENDPOINTS": etcd_server.endpoint}
    line = one_line_error(run(swapped, "status"), Exit.ERROR)
    assert closed in line


def test_explicit_endpoints_read_no_credentials_from_the_environment(auth_server) -> None:
    """As connect(): certificates and credentials set for the environment's cluster are never
    sent to another one named on the command line."""

    from etcd_recipes import connect

    env = {"ETCDCTL_ENDPOINTS": auth_server.endpoint, "ETCDCTL_USER": "app:s3cret"}
    assert run(env, "counter", "set", "/app/env", "1").returncode == 0
    explicit = run(env, "--endpoints", auth_server.endpoint, "counter", "set", "/app/env", "2")
    one_line_error(explicit, Exit.ERROR)  # no user sent: etcd refuses

    async def library_write() -> None:
        async with connect(auth_server.endpoint) as client:  # explicit, like --endpoints
            await client.put("/app/env", b"3")

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with pytest.raises(Exception, match=r"(?i)user name is empty|permission denied"):
            asyncio.run(library_write())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    value = auth_server.etcdctl("--user", "app:s3cret", "get", "/app/env", "--print-value-only")
    assert value.stdout.strip() != "2"  # the explicit-endpoints write never happened
