"""TLS, mutual TLS and user/password auth against real etcd servers started for this module."""

from __future__ import annotations

import asyncio
import time

import pytest
import trustme

from etcd_recipes import (
    AuthenticationError,
    EtcdConnectionError,
    TlsHandshakeError,
    WatchEvent,
    connect,
)
from etcd_recipes.testing import EtcdServer


@pytest.fixture(scope="module")
def tls_server():
    with EtcdServer(tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server():
    with EtcdServer(client_cert_auth=True) as server:
        yield server


@pytest.fixture(scope="module")
def auth_server():
    with EtcdServer(auth=True) as server:
        yield server


@pytest.fixture
def other_ca_pem() -> bytes:
    return trustme.CA().cert_pem.bytes()


# --------------------------------------------------------------------------- TLS


async def test_tls_with_the_right_ca(tls_server):
    kwargs = tls_server.client_kwargs()
    assert kwargs["endpoints"][0].startswith("https://")
    async with connect(**kwargs) as client:
        await client.put("/tls/k", b"secret")
        assert (await client.get("/tls/k")).value == b"secret"  # type: ignore[union-attr]
        async with client.watch("/tls/k") as watch:
            await client.put("/tls/k", b"2")
            item = await asyncio.wait_for(watch.__anext__(), 5)
            assert isinstance(item, WatchEvent)
            assert item.kv.value == b"2"


async def test_tls_ca_as_pem_bytes_and_plain_endpoint(tls_server):
    # ca_cert= alone turns TLS on for a scheme-less endpoint; PEM bytes work like a path.
    pem = tls_server.tls.ca_cert.read_bytes()
    async with connect(tls_server.endpoint, ca_cert=pem) as client:
        st = await client.status()
        assert st.version.startswith("3.")


async def test_tls_hostname_endpoints_in_a_list(tls_server):
    # Several endpoints, one by host name: the channel resolves it and verifies the server
    # certificate against that name (its SANs are 127.0.0.1 and localhost).
    port = tls_server.endpoint.rsplit(":", 1)[1]
    endpoints = [f"https://localhost:{port}", tls_server.url]
    async with connect(endpoints, ca_cert=str(tls_server.tls.ca_cert)) as client:
        await client.put("/tls/multi", b"v")
        assert (await client.get("/tls/multi")).value == b"v"  # type: ignore[union-attr]


async def test_tls_wrong_ca_is_a_handshake_error(tls_server, other_ca_pem):
    t0 = time.monotonic()
    with pytest.raises(TlsHandshakeError) as info:
        async with connect(tls_server.url, ca_cert=other_ca_pem, connect_timeout=3):
            pass
    assert time.monotonic() - t0 < 5
    assert "ca_cert" in str(info.value)


async def test_plain_client_against_tls_server_hints_at_tls(tls_server):
    plain = "http://" + tls_server.endpoint
    with pytest.raises(EtcdConnectionError) as info:
        async with connect(plain, connect_timeout=2):
            pass
    message = str(info.value)
    assert tls_server.endpoint in message
    assert "https://" in message or "TLS" in message, message


async def test_mutual_tls_with_client_certificate(mtls_server):
    kwargs = mtls_server.client_kwargs()
    assert "cert" in kwargs
    assert "key" in kwargs
    async with connect(**kwargs) as client:
        await client.put("/mtls/k", b"v")
        assert (await client.get("/mtls/k")).value == b"v"  # type: ignore[union-attr]
        members = await client.member_list()
        assert members[0].client_urls == [mtls_server.url]


async def test_mutual_tls_without_client_certificate_fails(mtls_server):
    with pytest.raises(TlsHandshakeError):
        async with connect(
            mtls_server.url, ca_cert=str(mtls_server.tls.ca_cert), connect_timeout=3
        ):
            pass


async def test_mutual_tls_with_a_foreign_client_certificate_fails(mtls_server):
    foreign = trustme.CA().issue_cert("intruder")
    with pytest.raises(TlsHandshakeError):
        async with connect(
            mtls_server.url,
            ca_cert=str(mtls_server.tls.ca_cert),
            cert=b"".join(b.bytes() for b in foreign.cert_chain_pems),
            key=foreign.private_key_pem.bytes(),
            connect_timeout=3,
        ):
            pass


# --------------------------------------------------------------------------- auth


async def test_auth_right_password(auth_server):
    async with connect(**auth_server.client_kwargs()) as client:
        await client.put("/auth/k", b"v")
        assert (await client.get("/auth/k")).value == b"v"  # type: ignore[union-attr]
        assert client._auth is not None
        assert client._auth.token


async def test_auth_wrong_password(auth_server):
    t0 = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        async with connect(auth_server.url, user="root", password="not-the-password"):
            pass
    assert time.monotonic() - t0 < 3
    assert "password" in str(info.value)


async def test_auth_unknown_user(auth_server):
    with pytest.raises(AuthenticationError):
        async with connect(auth_server.url, user="nobody", password="x"):
            pass


async def test_no_credentials_on_an_auth_server(auth_server):
    async with connect(auth_server.url) as client:  # Status needs no token
        with pytest.raises(AuthenticationError):
            await client.put("/auth/anon", b"v")


async def _next_event(watch, timeout: float = 10.0) -> WatchEvent:
    async def run() -> WatchEvent:
        while True:
            item = await watch.__anext__()
            if isinstance(item, WatchEvent):
                return item

    return await asyncio.wait_for(run(), timeout)


@pytest.mark.slow
async def test_auth_token_refresh_after_expiry():
    with EtcdServer(auth=True, auth_token_ttl=1) as server:
        async with (
            connect(**server.client_kwargs()) as client,
            connect(**server.client_kwargs()) as writer,
        ):
            await client.put("/ttl/k", b"1")
            held = await client.lease(2).grant()  # kept alive across every expiry below
            await client.put("/ttl/held", b"x", lease=held.id)
            first_token = client._auth.token
            generation = client._auth.generation
            await asyncio.sleep(3)  # the token expires while idle
            kv = await client.get("/ttl/k")
            assert kv is not None
            assert kv.value == b"1"
            assert client._auth.generation > generation
            assert client._auth.token != first_token

            # A watch created after an idle period (a new stream, whose token is stale) works.
            await asyncio.sleep(2)
            async with client.watch("/ttl/k") as first:
                r2 = await writer.put("/ttl/k", b"2", timeout=5)
                assert (await _next_event(first)).revision == r2.revision
                # Another idle period: a watch added to the open stream still works, and the
                # first one is undisturbed.
                await asyncio.sleep(2)
                async with client.watch("/ttl/k") as second:
                    r3 = await writer.put("/ttl/k", b"3", timeout=5)
                    assert (await _next_event(second)).revision == r3.revision
                    assert (await _next_event(first)).revision == r3.revision
            # And unary calls keep working after yet another expiry.
            await asyncio.sleep(1.5)
            await client.put("/ttl/k", b"4")
            assert (await writer.get("/ttl/k")).value == b"4"  # type: ignore[union-attr]
            assert not held.is_lost
            assert (await writer.get("/ttl/held")) is not None
            await held.revoke()
            assert (await writer.get("/ttl/held")) is None
