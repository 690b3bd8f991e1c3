"""etcd down, hung or killed: one error type per kind of failure whatever the retry policy,
no TLS hint unless the failure looks like TLS, a bounded ``ping(timeout=)``, and closed-object
errors that name the method the caller has (``aclose()`` async, ``close()`` blocking)."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcd_recipes import (
    ClientClosedError,
    ConnectionRetriesExhaustedError,
    DistributedAtomicLong,
    EtcdConnectionError,
    EtcdTimeoutError,
    RecipeClosedError,
    ResilienceConfig,
    RetriesExhaustedError,
    RetryPolicy,
    RpcResilience,
    TimeoutRetriesExhaustedError,
    WatchSuspended,
    connect,
)
from etcd_recipes import sync as blocking
from tests.helpers import eventually

SLOW_KEEPALIVE = {"keepalive_time": 60, "keepalive_timeout": 20}


def _policy(retry: RetryPolicy, timeout: float = 10.0) -> ResilienceConfig:
    return ResilienceConfig(rpc=RpcResilience(retry_policy=retry, operation_timeout=timeout))


@pytest.mark.slow
async def test_etcd_down_is_an_etcd_connection_error_whatever_the_retry_policy(
    fresh_etcd_server,
):
    server = fresh_etcd_server
    for retry in (RetryPolicy.never(), RetryPolicy.bounded(3, delay=0.05), None):
        resilience = _policy(retry) if retry is not None else None
        async with connect(server.url, resilience=resilience) as client:
            await client.put("/down/k", b"v")
            server.kill()
            try:
                with pytest.raises(EtcdConnectionError) as info:
                    await client.get("/down/k")
                exc = info.value
                assert "TLS" not in str(exc) and "https" not in str(exc)
                if isinstance(retry, type(RetryPolicy.never())):
                    assert not isinstance(exc, RetriesExhaustedError)
                else:
                    # Retried: still an EtcdConnectionError, and the last failure is chained.
                    assert isinstance(exc, ConnectionRetriesExhaustedError)
                    assert isinstance(exc, RetriesExhaustedError) and exc.attempts > 1
                    assert isinstance(exc.__cause__, EtcdConnectionError)
            finally:
                server.restart()


@pytest.mark.slow
async def test_a_hung_server_is_a_timeout_whatever_the_retry_policy(fresh_etcd_server):
    server = fresh_etcd_server
    for retry in (RetryPolicy.never(), RetryPolicy.bounded(2, delay=0.05)):
        async with connect(
            server.url, resilience=_policy(retry, timeout=0.3), **SLOW_KEEPALIVE
        ) as client:
            await client.put("/hung/k", b"v")
            server.pause()
            try:
                with pytest.raises(EtcdTimeoutError) as info:
                    await client.get("/hung/k")
                assert isinstance(info.value, TimeoutError)
                if isinstance(retry, type(RetryPolicy.never())):
                    assert not isinstance(info.value, RetriesExhaustedError)
                else:
                    assert isinstance(info.value, TimeoutRetriesExhaustedError)
                    assert info.value.attempts == 3
            finally:
                server.resume()


@pytest.mark.slow
async def test_a_killed_server_does_not_suggest_tls(fresh_etcd_server):
    # SIGKILL closes the open watch stream ("Socket closed"): that is no TLS problem.
    server = fresh_etcd_server
    async with connect(server.url) as client:
        events = []
        async with client.watch("/killed/k") as watch:
            watch.add_recovery_listener(events.append)
            await client.put("/killed/other", b"v")  # the stream is open
            server.kill()
            try:
                await eventually(
                    lambda: any(isinstance(e, WatchSuspended) for e in events),
                    what="the watch to be suspended",
                )
            finally:
                server.restart()
        causes = [str(e.cause) for e in events if isinstance(e, WatchSuspended)]
        assert causes
        assert not any("TLS" in c or "https" in c for c in causes), causes


async def test_plain_text_against_a_tls_server_still_suggests_tls():
    from etcd_recipes.testing import EtcdServer

    with EtcdServer(tls=True) as tls_server:
        with pytest.raises(EtcdConnectionError) as info:
            async with connect(tls_server.endpoint, connect_timeout=1):
                pass
        assert "https://" in str(info.value) and "ca_cert=" in str(info.value)


@pytest.mark.slow
async def test_ping_is_bounded_by_its_timeout_against_a_hung_server(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(server.url, **SLOW_KEEPALIVE) as client:
        assert await client.ping(timeout=1)
        server.pause()
        try:
            t0 = time.monotonic()
            assert await client.ping(timeout=0.5) is False
            assert time.monotonic() - t0 < 1.5
            t0 = time.monotonic()
            assert await client.ping() is False  # the default bound: 2 s, one attempt
            assert 1.5 < time.monotonic() - t0 < 3.5
        finally:
            server.resume()
        assert await client.ping()
    assert await client.ping() is False  # closed: False, not an exception


async def test_ping_rejects_a_bad_timeout(etcd_client):
    for bad in (0, -1, float("nan"), "1", None):
        with pytest.raises(ValueError, match="timeout"):
            await etcd_client.ping(timeout=bad)


async def test_closed_errors_name_aclose_in_async_code(etcd_server, etcd_prefix):
    client = await connect(**etcd_server.client_kwargs()).open()
    counter = await DistributedAtomicLong(client, etcd_prefix + "c").start()
    await counter.aclose()
    with pytest.raises(RecipeClosedError) as recipe_error:
        await counter.get()
    assert "aclose()" in str(recipe_error.value)
    await client.aclose()
    with pytest.raises(ClientClosedError) as client_error:
        await asyncio.wait_for(client.get(etcd_prefix + "k"), 5)
    assert "aclose()" in str(client_error.value)


def test_closed_errors_name_close_in_the_blocking_facade(etcd_server, etcd_prefix):
    with blocking.connect(**etcd_server.client_kwargs()) as client:
        counter = blocking.DistributedAtomicLong(client, etcd_prefix + "c").start()
        counter.close()
        with pytest.raises(RecipeClosedError) as info:
            counter.get()
        message = str(info.value)
        assert "close()" in message and "aclose()" not in message
