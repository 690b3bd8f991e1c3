"""contrib.grpc against real ``grpc.aio`` server processes registered in a real etcd.

Servers (``servers.py``) register themselves with a 2 s lease, serve the standard health
service and a raw-bytes ``/test.Who/Who`` method answering their id, and leave on SIGTERM by
unregistering, draining one second, then stopping with grace.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from etcd_recipes import (
    AlreadyStartedError,
    NoInstancesError,
    ServiceInstance,
    ServiceProvider,
    ServiceRegistry,
)
from etcd_recipes.contrib.grpc import DiscoveryChannel, build_target, discovery_channel
from tests.helpers import eventually

from .helpers import Server, Servers

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
    pytest.mark.xdist_group("contrib-servers"),
]

WORKERS = 4


def _in_target(channel: DiscoveryChannel, server: Server) -> bool:
    return f"127.0.0.1:{server.port}" in (channel.target or "")


class Load:
    """``WORKERS`` tasks calling ``Who`` back to back; every outcome is logged with its phase."""

    def __init__(self, channel: DiscoveryChannel) -> None:
        self.who = channel.unary_unary("/test.Who/Who")
        self.phase = "start"
        self.log: list[tuple[str, str, grpc.StatusCode | None]] = []  # (phase, id, error)
        self.tasks: list[asyncio.Task[None]] = []

    async def _worker(self) -> None:
        while True:
            phase = self.phase
            try:
                served = (await self.who(b"", timeout=5)).decode()
                self.log.append((phase, served, None))
            except grpc.aio.AioRpcError as exc:
                self.log.append((phase, "", exc.code()))

    def __enter__(self) -> Load:
        self.tasks = [asyncio.create_task(self._worker()) for _ in range(WORKERS)]
        return self

    def __exit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()

    def served(self, phase: str) -> set[str]:
        return {s for p, s, e in self.log if p == phase and e is None}

    def errors(self, phase: str | None = None) -> list[tuple[str, str, grpc.StatusCode | None]]:
        return [entry for entry in self.log if entry[2] is not None and phase in (None, entry[0])]


@pytest.mark.slow
async def test_servers_added_and_removed_under_load_fail_no_call(
    etcd_server, etcd_client, etcd_prefix
):
    path = etcd_prefix + "svc"
    servers = Servers(etcd_server.url, path, "who")
    try:
        a = await servers.start("grpc", "a")
        b = await servers.start("grpc", "b")
        async with ServiceProvider(etcd_client, path, "who") as provider:
            await eventually(lambda: len(provider.instances()) == 2, timeout=20, what="a, b")
            async with discovery_channel(provider, grace=5) as channel:
                assert channel.generation == 1
                with Load(channel) as load:
                    await eventually(lambda: load.served("start") == {"a", "b"}, what="a, b")

                    load.phase = "add"
                    c = await servers.start("grpc", "c")
                    await eventually(lambda: _in_target(channel, c), what="c in the target")
                    await eventually(lambda: "c" in load.served("add"), what="calls to c")

                    load.phase = "remove"
                    await a.leave()  # unregister, drain, graceful stop; the process exits 0
                    await eventually(lambda: not _in_target(channel, a), what="a gone")
                    load.phase = "without-a"
                    await eventually(
                        lambda: len([e for e in load.log if e[0] == "without-a"]) > 200,
                        what="calls after a left",
                    )
                    assert load.served("without-a") == {"b", "c"}
                    assert load.errors() == []  # adding and removing failed no call

                    # A generated stub works on the channel like on any grpc.aio channel.
                    stub = health_pb2_grpc.HealthStub(channel)
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING

                    load.phase = "kill"
                    b.kill()
                    await eventually(
                        lambda: not _in_target(channel, b), timeout=20, what="b's lease expired"
                    )
                    load.phase = "after"
                    await eventually(
                        lambda: len([e for e in load.log if e[0] == "after"]) > 200,
                        what="calls after b's expiry",
                    )
                generations = channel.generation
    finally:
        await servers.aclose()
    # Only calls in flight to the killed server may fail: at most one per worker, UNAVAILABLE.
    killed = load.errors("kill")
    assert len(killed) <= WORKERS, killed
    assert {code for _, _, code in killed} <= {grpc.StatusCode.UNAVAILABLE}
    assert load.errors("after") == [] and load.served("after") == {"c"}
    assert generations == 4  # a+b, a+b+c, b+c, c: one channel per membership


@pytest.mark.slow
async def test_a_swap_lets_the_old_channels_calls_finish(etcd_server, etcd_client, etcd_prefix):
    path = etcd_prefix + "svc"
    servers = Servers(etcd_server.url, path, "who")
    try:
        await servers.start("grpc", "a")
        async with ServiceProvider(etcd_client, path, "who") as provider:
            await eventually(lambda: len(provider.instances()) == 1, timeout=20, what="a")
            async with discovery_channel(provider, grace=5) as channel:
                who = channel.unary_unary("/test.Who/Who")
                slow = [asyncio.ensure_future(who(b"1500", timeout=10)) for _ in range(3)]
                await asyncio.sleep(0.2)  # the calls are on the first channel
                # A new member (registered here: it need not exist) makes the channel swap.
                async with ServiceRegistry(etcd_client, path) as registry:
                    await registry.register(ServiceInstance("who", "", address="127.0.0.9", port=9))
                    await eventually(lambda: channel.generation == 2, what="the swap")
                    assert "draining=1" in repr(channel)  # the old one waits for its calls
                    assert not any(call.done() for call in slow)
                    assert [await call for call in slow] == [b"a"] * 3
                    await eventually(lambda: "draining=0" in repr(channel), what="old closed")
    finally:
        await servers.aclose()


async def test_start_without_instances_raises_after_the_ready_timeout(etcd_client, etcd_prefix):
    async with ServiceProvider(etcd_client, etcd_prefix + "svc", "nobody") as provider:
        channel = discovery_channel(provider, ready_timeout=0.3)
        with pytest.raises(NoInstancesError):
            await channel.start()
        assert "closed" in repr(channel)
        with pytest.raises(Exception, match="closed"):
            channel.unary_unary("/x/y")(b"")


async def test_a_cancelled_start_leaves_nothing_running(etcd_client, etcd_prefix):
    async with ServiceProvider(etcd_client, etcd_prefix + "svc", "nobody") as provider:
        before = asyncio.all_tasks()  # the provider's are running already
        channel = discovery_channel(provider, ready_timeout=None)  # would wait for ever
        starting = asyncio.ensure_future(channel.start())
        await asyncio.sleep(0.2)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert "closed" in repr(channel) and channel.target is None
        ours = [
            t
            for t in asyncio.all_tasks() - before
            if any("contrib" in f.f_code.co_filename for f in t.get_stack())
            or t.get_name() == "discovery-channel-follower"
        ]
        assert ours == []  # (the provider's own tasks come and go)
        with pytest.raises(AlreadyStartedError):
            await channel.start()
    # A provider that is closed ends its lists: a start fails at once, it does not hang.
    with pytest.raises(NoInstancesError, match="ended"):
        await asyncio.wait_for(discovery_channel(provider, ready_timeout=None).start(), 5)


async def test_targets_are_sorted_deduplicated_and_typed():
    from types import SimpleNamespace as I

    def inst(address: str, port: int, ssl_port: int = -1) -> object:
        return I(address=address, port=port, ssl_port=ssl_port)

    assert await build_target([inst("10.0.0.2", 1), inst("10.0.0.1", 2), inst("10.0.0.2", 1)]) == (
        "ipv4:10.0.0.1:2,10.0.0.2:1"
    )
    assert await build_target([inst("10.0.0.1", 1, 443)], secure=True) == "ipv4:10.0.0.1:443"
    assert await build_target([inst("10.0.0.1", 1)], secure=True) is None  # no ssl port
    assert await build_target([inst("", 1), inst("10.0.0.1", -1)]) is None
    assert await build_target([inst("::1", 5), inst("127.0.0.1", 6)]) == (
        "ipv6:[::1]:5,[::ffff:7f00:1]:6"
    )
    assert await build_target([inst("[::1]", 5)]) == "ipv6:[::1]:5"
    assert (await build_target([inst("localhost", 7)])) in (
        "ipv4:127.0.0.1:7",
        "ipv6:[::1]:7,[::ffff:7f00:1]:7",
    )
    assert await build_target([inst("no-such-host.invalid", 7)]) is None


async def test_a_mixed_ipv4_ipv6_list_is_dialled_as_one_ipv6_target(etcd_client, etcd_prefix):
    server = grpc.aio.server()
    names = {}

    def who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return names[context.peer().startswith("ipv6:%5B::1%5D")].encode()

    handler = grpc.unary_unary_rpc_method_handler(who)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Who", {"Who": handler})]
    )
    port4 = server.add_insecure_port("127.0.0.1:0")
    try:
        port6 = server.add_insecure_port("[::1]:0")
    except RuntimeError:
        pytest.skip("no IPv6 loopback on this host")
    names.update({True: "v6", False: "v4"})
    await server.start()
    path = etcd_prefix + "svc"
    try:
        async with (
            ServiceRegistry(etcd_client, path) as registry,
            ServiceProvider(etcd_client, path, "who") as provider,
        ):
            await registry.register(ServiceInstance("who", "", address="127.0.0.1", port=port4))
            await registry.register(ServiceInstance("who", "", address="::1", port=port6))
            await eventually(lambda: len(provider.instances()) == 2, what="both")
            async with discovery_channel(provider) as channel:
                assert channel.target == f"ipv6:[::1]:{port6},[::ffff:7f00:1]:{port4}"
                who_call = channel.unary_unary("/test.Who/Who")
                assert {(await who_call(b"", timeout=5)) for _ in range(6)} == {b"v4", b"v6"}
    finally:
        await server.stop(None)
