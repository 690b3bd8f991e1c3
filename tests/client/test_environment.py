"""connect() without endpoints reads etcdctl's variables (and $ETCD_ENDPOINTS first); explicit
arguments win, and explicit endpoints read nothing from the environment."""

from __future__ import annotations

import socket

import pytest

from etcd_recipes import AuthenticationError, InvalidArgumentError, InvalidEndpointError, connect
from etcd_recipes.testing import EtcdServer

VARIABLES = (
    "ETCD_ENDPOINTS",
    "ETCDCTL_ENDPOINTS",
    "ETCDCTL_CACERT",
    "ETCDCTL_CERT",
    "ETCDCTL_KEY",
    "ETCDCTL_USER",
    "ETCDCTL_PASSWORD",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def mtls_server():
    with EtcdServer(client_cert_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def auth_server():
    with EtcdServer(auth=True) as server:
        yield server


def _dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def test_etcdctl_endpoints(env, etcd_server, etcd_prefix):
    env.setenv("ETCDCTL_ENDPOINTS", etcd_server.url)
    async with connect() as client:
        await client.put(etcd_prefix + "k", b"v")
        assert client.endpoints == etcd_server.endpoint


async def test_etcd_endpoints_comes_before_etcdctl_endpoints(env, etcd_server):
    env.setenv("ETCD_ENDPOINTS", etcd_server.url)
    env.setenv("ETCDCTL_ENDPOINTS", _dead_endpoint())
    async with connect(connect_timeout=2) as client:
        assert await client.ping()


async def test_etcdctl_tls_variables(env, mtls_server, etcd_prefix):
    tls = mtls_server.tls
    env.setenv("ETCDCTL_ENDPOINTS", mtls_server.url)
    env.setenv("ETCDCTL_CACERT", str(tls.ca_cert))
    env.setenv("ETCDCTL_CERT", str(tls.client_cert))
    env.setenv("ETCDCTL_KEY", str(tls.client_key))
    async with connect() as client:
        await client.put(etcd_prefix + "k", b"over mTLS")
    assert mtls_server.etcdctl("get", etcd_prefix + "k", "--print-value-only").stdout == (
        "over mTLS\n"
    )


async def test_explicit_endpoints_read_nothing_from_the_environment(env, etcd_server):
    # Certificates and credentials set up for another cluster are not sent to this one.
    env.setenv("ETCDCTL_CACERT", "/nonexistent/ca.pem")
    env.setenv("ETCDCTL_USER", "root:secret")
    async with connect(etcd_server.url) as client:  # plain text, no auth: works
        assert await client.ping()


async def test_an_explicit_argument_wins_over_its_variable(env, mtls_server):
    tls = mtls_server.tls
    env.setenv("ETCDCTL_ENDPOINTS", mtls_server.url)
    env.setenv("ETCDCTL_CACERT", "/nonexistent/ca.pem")  # overridden below
    env.setenv("ETCDCTL_CERT", str(tls.client_cert))
    env.setenv("ETCDCTL_KEY", str(tls.client_key))
    async with connect(ca_cert=tls.ca_cert) as client:
        assert await client.ping()


@pytest.mark.parametrize("form", ["inline", "separate"])
async def test_etcdctl_user_forms(env, auth_server, etcd_prefix, form):
    env.setenv("ETCDCTL_ENDPOINTS", auth_server.url)
    if form == "inline":
        env.setenv("ETCDCTL_USER", f"root:{auth_server.root_password}")
    else:
        env.setenv("ETCDCTL_USER", "root")
        env.setenv("ETCDCTL_PASSWORD", auth_server.root_password)
    async with connect() as client:
        await client.put(etcd_prefix + form, b"authenticated")
        assert (await client.get(etcd_prefix + form)).value == b"authenticated"


async def test_explicit_credentials_win_over_etcdctl_user(env, auth_server):
    env.setenv("ETCDCTL_ENDPOINTS", auth_server.url)
    env.setenv("ETCDCTL_USER", f"root:{auth_server.root_password}")
    with pytest.raises(AuthenticationError):
        async with connect(user="root", password="wrong", connect_timeout=2):
            pass


@pytest.mark.parametrize(
    ("variables", "match"),
    [
        ({"ETCDCTL_USER": "root"}, "ETCDCTL_PASSWORD"),
        ({"ETCDCTL_PASSWORD": "pw"}, "ETCDCTL_USER is not"),
        ({"ETCDCTL_USER": "root:pw", "ETCDCTL_PASSWORD": "pw"}, "must not include"),
        ({"ETCDCTL_USER": ":pw"}, "no user"),
        ({"ETCDCTL_CERT": "/c.pem"}, "cert= and key="),
    ],
)
def test_incomplete_etcdctl_settings_are_rejected(env, variables, match):
    env.setenv("ETCDCTL_ENDPOINTS", "127.0.0.1:2379")
    for name, value in variables.items():
        env.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match=match):
        connect()


def test_no_endpoints_anywhere(env):
    env.setenv("ETCD_ENDPOINTS", "  ")  # empty counts as unset
    with pytest.raises(InvalidEndpointError, match=r"\$ETCDCTL_ENDPOINTS"):
        connect()
