"""Streams that stay open but silent (issue 31, item 2): the connection is alive -- gRPC
keepalive is set far beyond the test, so only the library's own check can notice -- but the
watch or keep-alive stream delivers nothing. ``TcpProxy.stall()`` holds every byte of one
endpoint; the client also knows a second, healthy one."""

from __future__ import annotations

import asyncio
import time

from etcd_recipes import ResilienceConfig, WatchResilience, connect
from etcd_recipes.client.lease_keeper import unanswered_bound
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

NO_KEEPALIVE = {"keepalive_time": 300.0, "keepalive_timeout": 300.0}


async def test_a_silent_watch_stream_is_reopened_and_loses_nothing(etcd_server, etcd_prefix):
    key = etcd_prefix + "/stall/w"
    quick = ResilienceConfig(watch=WatchResilience(stall_timeout=2.0))
    with (
        TcpProxy.for_endpoint(etcd_server.endpoint) as a,
        TcpProxy.for_endpoint(etcd_server.endpoint) as b,
    ):
        async with (
            connect([a.endpoint, b.endpoint], resilience=quick, **NO_KEEPALIVE) as client,
            connect(etcd_server.endpoint) as writer,
        ):
            first = (await writer.put(key, b"0")).revision
            async with client.watch(key, start_revision=first) as watch:
                it = watch.__aiter__()
                assert (await anext(it)).kv.value == b"0"
                hub = client._watch_hub
                await eventually(lambda: hub.answers_progress, what="the probe answered")
                # Stall the endpoint the stream is on (both: round robin may use either, and
                # one of them is restored at once so the stream has somewhere to go).
                a.stall()
                b.stall()
                b.restore()
                started = time.monotonic()
                for i in range(1, 4):
                    await writer.put(key, str(i).encode())
                try:
                    got = [(await asyncio.wait_for(anext(it), 30)).kv.value for _ in range(3)]
                except TimeoutError:
                    raise AssertionError((hub.stalls_detected, hub.streams_opened)) from None
                elapsed = time.monotonic() - started
                assert got == [b"1", b"2", b"3"]  # in order, none lost, none twice
                # Either the stream was on b (restored at once) or the silence was noticed.
                assert hub.stalls_detected >= 1 or elapsed < 1.0, (hub.stalls_detected, elapsed)
                a.restore()
                await writer.put(key, b"4")
                assert (await asyncio.wait_for(anext(it), 10)).kv.value == b"4"


async def test_a_stall_is_noticed_within_the_bound(etcd_server, etcd_prefix):
    key = etcd_prefix + "/stall/only"
    quick = ResilienceConfig(watch=WatchResilience(stall_timeout=2.0))
    with TcpProxy.for_endpoint(etcd_server.endpoint) as proxy:
        async with connect(proxy.endpoint, resilience=quick, **NO_KEEPALIVE) as client:
            async with client.watch(key) as watch:
                hub = client._watch_hub
                await eventually(lambda: hub.answers_progress, what="the probe answered")
                opened = hub.streams_opened
                proxy.stall()
                started = time.monotonic()
                await eventually(lambda: hub.stalls_detected >= 1, timeout=10, what="detected")
                detected = time.monotonic() - started
                assert detected < 2.0 + 1.5, detected  # the bound, plus a timer's slack
                proxy.restore()
                await eventually(lambda: hub.streams_opened > opened, what="re-opened")
                assert watch.is_synced or hub.watcher_count == 1


async def test_an_idle_healthy_stream_is_never_failed(etcd_server, etcd_prefix):
    quick = ResilienceConfig(watch=WatchResilience(stall_timeout=0.6))
    async with connect(etcd_server.endpoint, resilience=quick, **NO_KEEPALIVE) as client:
        async with client.watch(etcd_prefix + "/stall/idle"):
            await asyncio.sleep(3.0)  # five bounds of silence, each answered by a probe
            hub = client._watch_hub
            assert hub.answers_progress and hub.stalls_detected == 0 and hub.streams_opened == 1


async def test_a_server_that_never_answers_progress_is_not_probed_to_death(
    etcd_grpc_proxy, etcd_prefix
):
    # etcd grpc-proxy answers no progress request: its silence proves nothing.
    quick = ResilienceConfig(watch=WatchResilience(stall_timeout=0.6))
    async with connect(etcd_grpc_proxy.endpoint, resilience=quick) as client:
        async with client.watch(etcd_prefix + "/stall/proxy"):
            await asyncio.sleep(2.5)
            hub = client._watch_hub
            assert not hub.answers_progress
            assert hub.stalls_detected == 0 and hub.streams_opened == 1


async def test_an_unanswered_renewal_reopens_the_keep_alive_stream(etcd_server, etcd_prefix):
    key = etcd_prefix + "/stall/lease"
    with TcpProxy.for_endpoint(etcd_server.endpoint) as proxy:
        async with connect(proxy.endpoint, **NO_KEEPALIVE) as client:
            async with client.lease(9) as lease:
                await client.put(key, b"held", lease=lease.id)
                keeper = client._leases
                opened = keeper.streams_opened
                proxy.stall()
                started = time.monotonic()
                # A renewal is sent every 3 s; one unanswered for unanswered_bound(9) = 3 s
                # fails the stream, long before the lease's own deadline (9 s).
                await eventually(lambda: keeper.stalls_detected >= 1, timeout=8, what="noticed")
                assert time.monotonic() - started < 3.0 + 3.0 + 1.0
                await eventually(lambda: keeper.streams_opened > opened, what="re-opened")
                assert not lease.is_lost
                proxy.restore()
                await asyncio.sleep(3.5)  # a renewal answered on the re-opened stream
                assert not lease.is_lost, lease.lost_cause
                assert (await client.lease_time_to_live(lease.id)).ttl > 0
                assert unanswered_bound(9) == 3.0 and unanswered_bound(3) == 2.0
