"""Several endpoints: a 3-member cluster losing its leader and then the member in use, a dead
first endpoint at connect time, and every endpoint dead."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from etcd_recipes import EtcdConnectionError, EtcdRecipeError, connect
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _time_until_put_succeeds(client, key: str, limit: float = 10.0) -> float:
    """Seconds until a put goes through (each attempt bounded, failures retried)."""
    t0 = time.monotonic()
    while True:
        try:
            await client.put(key, b"v", timeout=1.0)
            return time.monotonic() - t0
        except EtcdRecipeError:
            if time.monotonic() - t0 > limit:
                raise
            await asyncio.sleep(0.02)


def _member_by_id(cluster, member_id: int):
    for m in cluster.members:
        if m.is_running and int(m.status(timeout=1).header.member_id) == member_id:
            return m
    raise AssertionError(f"no running member with id {member_id:x}")


@pytest.mark.slow
async def test_cluster_failover_leader_then_member_in_use(etcd_cluster):
    async with connect(**etcd_cluster.client_kwargs(), **FAST) as client:
        assert len(client.endpoints.split(",")) == 3
        # Round robin over all three: every member serves the client.
        served = {(await client.status()).member_id for _ in range(12)}
        assert len(served) == 3
        for i in range(5):
            await client.put(f"/f/pre{i}", b"v")

        leader = etcd_cluster.leader()
        leader.kill()
        took = await _time_until_put_succeeds(client, "/f/after-leader")
        assert took < 5.0, f"first put after the leader died took {took:.2f}s"
        new_leader = etcd_cluster.wait_for_leader()
        assert new_leader is not leader
        for i in range(10):  # and keeps working
            await client.put(f"/f/post-leader{i}", b"v", timeout=2)

        # Bring the old leader back (a quorum must survive the next kill), then kill the
        # member that is serving this client right now.
        leader.restart()
        etcd_cluster.wait_for_leader()
        in_use = _member_by_id(etcd_cluster, (await client.status()).member_id)
        in_use.kill()
        took = await _time_until_put_succeeds(client, "/f/after-in-use")
        assert took < 5.0, f"first put after the member in use died took {took:.2f}s"
        for i in range(10):
            await client.put(f"/f/post-member{i}", b"v", timeout=2)

        # Every acknowledged write is there, read through the survivors.
        total = await client.count("/f/")
        assert total == 5 + 1 + 10 + 1 + 10

        # Round robin picks the restarted member up again: both survivors serve.
        async def both_serve() -> bool:
            return len({(await client.status()).member_id for _ in range(6)}) == 2

        await eventually(both_serve, timeout=5, what="both surviving members to serve")


async def test_first_endpoint_dead_at_connect(etcd_server, etcd_prefix):
    dead = f"http://127.0.0.1:{_dead_port()}"
    t0 = time.monotonic()
    async with connect([dead, etcd_server.url], connect_timeout=5) as client:
        assert time.monotonic() - t0 < 3.0
        await client.put(etcd_prefix + "k", b"v")
        assert (await client.get(etcd_prefix + "k")).value == b"v"  # type: ignore[union-attr]
        # Repeated calls keep succeeding through the live endpoint.
        for _ in range(10):
            assert await client.get(etcd_prefix + "k") is not None


async def test_all_endpoints_dead_fails_fast_and_clearly():
    ports = [_dead_port(), _dead_port()]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    t0 = time.monotonic()
    with pytest.raises(EtcdConnectionError) as info:
        async with connect(endpoints, connect_timeout=2):
            pass
    elapsed = time.monotonic() - t0
    assert elapsed < 6.0, f"took {elapsed:.1f}s"
    message = str(info.value)
    assert all(str(p) in message for p in ports), message  # names what it tried


async def test_single_dead_endpoint_fails_fast():
    endpoint = f"127.0.0.1:{_dead_port()}"
    t0 = time.monotonic()
    with pytest.raises(EtcdConnectionError, match=endpoint):
        await connect(endpoint, connect_timeout=1).open()
    assert time.monotonic() - t0 < 4.0


@pytest.mark.slow
async def test_a_member_without_a_leader_ends_the_watch_stream(etcd_cluster):
    """The watch stream carries etcd's require-leader metadata (``hasleader: true``, Go's
    ``WithRequireLeader``): a member that loses its leader ends it instead of keeping it open
    and silent, so the watch reports the outage and comes back once there is a leader."""
    from etcd_recipes import WatchEvent, WatchResubscribed, WatchSuspended

    leader = etcd_cluster.leader()
    member = next(m for m in etcd_cluster.members if m is not leader)
    others = [m for m in etcd_cluster.members if m is not member]
    async with (
        connect(member.endpoint, **FAST) as client,
        connect([m.endpoint for m in others]) as majority,
    ):
        items: list[object] = []
        async with client.watch("/nl/k") as watch:

            async def consume() -> None:
                async for item in watch.items():
                    items.append(item)

            consumer = asyncio.create_task(consume())
            for other in others:
                other.pause()  # SIGSTOP: the member loses its leader, its links stay up
            try:
                t0 = time.monotonic()
                await eventually(
                    lambda: any(isinstance(i, WatchSuspended) for i in items),
                    timeout=10,
                    what="the leaderless member to end the stream",
                )
                detected = time.monotonic() - t0
                (suspended,) = [i for i in items if isinstance(i, WatchSuspended)]
                assert "leader" in str(suspended.cause), suspended
            finally:
                for other in others:
                    other.resume()
            written = await _put_eventually(majority, "/nl/k")
            await eventually(
                lambda: any(isinstance(i, WatchEvent) and i.revision == written for i in items),
                timeout=10,
                what="the write made on the majority",
            )
            assert any(isinstance(i, WatchResubscribed) for i in items)
            consumer.cancel()
        print(f"no-leader detected after {detected:.2f}s")


async def _put_eventually(client, key: str) -> int:
    deadline = time.monotonic() + 10
    while True:
        try:
            return (await client.put(key, b"after", timeout=1.0)).revision
        except EtcdRecipeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
