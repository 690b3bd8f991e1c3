"""contrib.httpx against real uvicorn servers on loopback, registered in a real etcd.

Each server is its own process (``servers.py``) that registers itself with a 2 s lease; the
client side is a started ServiceProvider and an ``httpx`` client with the transport mounted.
"""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
import pytest

from etcd_recipes import ServiceProvider
from etcd_recipes.contrib.httpx import (
    INSTANCE_EXTENSION,
    DiscoveryTransport,
    SyncDiscoveryTransport,
)
from tests.helpers import eventually

from .helpers import Servers, SyncServers

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
    pytest.mark.xdist_group("contrib-servers"),
]

THRESHOLD = 3


async def _ids(provider: ServiceProvider) -> set[str]:
    return {i.id for i in provider.instances()}


@pytest.mark.slow
async def test_a_killed_instance_fails_at_most_the_threshold_then_gets_no_traffic(
    etcd_server, etcd_client, etcd_prefix
):
    path = etcd_prefix + "svc"
    servers = Servers(etcd_server.url, path, "orders")
    try:
        for ident in ("a", "b", "c"):
            await servers.start("http", ident)
        async with ServiceProvider(
            etcd_client, path, "orders", error_threshold=THRESHOLD
        ) as provider:
            await eventually(
                lambda: len(provider.instances()) == 3, timeout=20, what="three instances"
            )
            transport = DiscoveryTransport(provider)
            async with httpx.AsyncClient(mounts={"http://orders": transport}, timeout=5) as http:
                # One request at a time, so "in flight to the killed server" is at most one.
                log: list[tuple[str, str | None]] = []  # (phase, id served or None)

                async def one(phase: str) -> None:
                    try:
                        response = await http.get("http://orders/")
                    except httpx.TransportError:
                        log.append((phase, None))
                        return
                    assert response.status_code == 200
                    served = response.json()["id"]
                    assert response.extensions[INSTANCE_EXTENSION].id == served
                    log.append((phase, served))

                for _ in range(30):
                    await one("before")
                assert {s for _, s in log} == {"a", "b", "c"}  # round-robin over all three

                servers.started[2].kill()  # SIGKILL "c" mid-load
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                # Keep going until its lease has expired (the provider forgot it), then more.
                while "c" in await _ids(provider):
                    await one("after")
                    assert loop.time() < deadline, "c's lease did not expire"
                for _ in range(30):
                    await one("after")
    finally:
        await servers.aclose()
    after = [s for phase, s in log if phase == "after"]
    failures = [i for i, s in enumerate(after) if s is None]
    assert 1 <= len(failures) <= THRESHOLD, after  # "c" is picked again within 3 requests
    rest = after[failures[-1] + 1 :]
    # After the last failure, nothing went to "c" (an attempt would have failed): only the
    # survivors served, through its down window and after its lease expired.
    assert len(rest) >= 30 and set(rest) == {"a", "b"}, after


@pytest.mark.slow
async def test_5xx_answers_are_reported_and_take_the_instance_out(
    etcd_server, etcd_client, etcd_prefix
):
    path = etcd_prefix + "svc"
    servers = Servers(etcd_server.url, path, "orders")
    try:
        await servers.start("http", "good")
        await servers.start("http", "bad", "--fail")
        async with ServiceProvider(
            etcd_client, path, "orders", error_threshold=THRESHOLD
        ) as provider:
            await eventually(lambda: len(provider.instances()) == 2, timeout=20, what="both")
            async with httpx.AsyncClient(
                mounts={"http://orders": DiscoveryTransport(provider)}
            ) as http:
                codes = [(await http.get("http://orders/")).status_code for _ in range(20)]
            # "bad" is inside its down window now: every pick is "good".
            assert {provider.get_instance().id for _ in range(6)} == {"good"}
    finally:
        await servers.aclose()
    assert codes.count(503) == THRESHOLD, codes
    assert codes[-10:] == [200] * 10


@pytest.mark.slow
async def test_no_instance_is_a_connect_error_caused_by_no_instances(etcd_client, etcd_prefix):
    from etcd_recipes import NoInstancesError

    async with ServiceProvider(etcd_client, etcd_prefix + "svc", "nobody") as provider:
        async with httpx.AsyncClient(
            mounts={"http://nobody": DiscoveryTransport(provider)}
        ) as http:
            with pytest.raises(httpx.ConnectError) as info:
                await http.get("http://nobody/x")
    assert isinstance(info.value.__cause__, NoInstancesError)
    assert "nobody" in str(info.value)


@pytest.mark.slow
def test_the_sync_transport_with_the_blocking_provider(etcd_server, etcd_prefix):
    from etcd_recipes.sync import ServiceProvider as SyncServiceProvider
    from etcd_recipes.sync import connect

    path = etcd_prefix + "svc"
    servers = SyncServers(etcd_server.url, path, "orders")
    try:
        servers.start("http", "good")
        servers.start("http", "bad", "--fail")
        with (
            connect(etcd_server.endpoint) as client,
            SyncServiceProvider(client, path, "orders", error_threshold=THRESHOLD) as provider,
        ):
            deadline = time.monotonic() + 20
            while len(provider.instances()) < 2:
                assert time.monotonic() < deadline, "both instances"
                time.sleep(0.05)
            transport = SyncDiscoveryTransport(provider)
            with httpx.Client(mounts={"http://orders": transport}) as http:
                responses = [http.get("http://orders/") for _ in range(20)]
    finally:
        servers.close()
    codes = [r.status_code for r in responses]
    assert codes.count(503) == THRESHOLD, codes
    assert [r.json()["id"] for r in responses[-10:]] == ["good"] * 10
    assert all(r.request.url == "http://orders/" for r in responses)  # the caller's URL


@pytest.mark.parametrize(
    ("address", "scheme", "url", "expected"),
    [
        (
            "10.0.0.1",
            "http",
            "http://orders/a%20b/c?q=1&r=%2F",
            "http://10.0.0.1:8080/a%20b/c?q=1&r=%2F",
        ),
        ("::1", "http", "http://orders/x", "http://[::1]:8080/x"),
        ("[::1]", "https", "http://orders/x", "https://[::1]:8443/x"),
        ("host.example", "https", "http://orders", "https://host.example:8443/"),
    ],
)
async def test_the_url_is_rewritten_to_the_instance(address, scheme, url, expected):
    # Pure URL logic: an in-memory provider and inner transport are enough here.
    from etcd_recipes import ServiceInstance

    instance = ServiceInstance("orders", "", address=address, port=8080, ssl_port=8443)
    seen: list[httpx.Request] = []

    class OneInstance:
        def get_instance(self):
            return instance

        def note_error(self, instance):
            raise AssertionError("no error expected")

    def network(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    transport = DiscoveryTransport(
        OneInstance(), scheme=scheme, transport=httpx.MockTransport(network)
    )  # type: ignore[arg-type]
    async with httpx.AsyncClient(mounts={"http://orders": transport}) as http:
        response = await http.post(url, content=b"body", headers={"X-Trace": "1"})
    assert str(seen[0].url) == expected
    assert seen[0].headers["host"] == "orders" and seen[0].headers["x-trace"] == "1"
    assert seen[0].read() == b"body" and seen[0].method == "POST"
    assert str(response.request.url) == str(httpx.URL(url))  # the caller's request is untouched
