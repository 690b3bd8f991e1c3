"""Acquisition leases are a client resource (issue 16 item 1): a mutex made per request (and
never closed) costs no lease of its own, the uncontended cycle costs no extra RPC, two holders
on one path never share a lease, a lost pooled lease is lost for every hold on it and never
handed out again, and nothing is leaked -- idle leases are revoked after the idle window, all
of them when the client closes, and a cancellation at any point leaves none (read back from
etcd's own lease list)."""

from __future__ import annotations

import asyncio
import gc
import random
import time

import anyio
import pytest

from etcd_recipes import DistributedMutex, DistributedReadWriteLock, DistributedSemaphore, connect
from etcd_recipes.client.lease_pool import pooled_lease_ids
from tests.helpers import eventually

from .helpers import keys, lease_keys, server_leases, short_idle_window, traffic


@pytest.fixture
async def own_client(etcd_server, monkeypatch):
    """A client of the test's own, whose lease grants are recorded (``client.granted``)."""
    short_idle_window(monkeypatch, 0.5)
    async with connect(**etcd_server.client_kwargs()) as client:
        granted: list[int] = []
        grant = client._grant_lease  # every grant goes through it (lease_grant too)

        async def recording_grant(ttl, **kwargs):
            result = await grant(ttl, **kwargs)
            granted.append(result.id)
            return result

        client._grant_lease = recording_grant  # type: ignore[method-assign]
        client.granted = granted  # type: ignore[attr-defined]
        yield client


async def _alive(client, lease_ids) -> set[int]:
    """Which of ``lease_ids`` etcd still has (its LeaseLeases list)."""
    return set(lease_ids) & await server_leases(client)


@pytest.mark.slow
async def test_ten_thousand_per_request_mutexes_leave_a_bounded_number_of_leases(
    own_client, etcd_prefix
):
    """10,000 request handlers, 8 at a time, each with a mutex of its own (every third never
    closed, just dropped) on one of 200 paths: the live leases are bounded by the concurrency
    (8), not by the instances -- and all are revoked once idle. (~100 s on a loaded 2-core
    machine.)"""
    client = own_client
    workers, requests, paths = 8, 10_000, 200
    rng = random.Random(16)
    peak = 0
    counter = iter(range(requests))

    async def handler(n: int) -> None:
        nonlocal peak
        mutex = DistributedMutex(client, f"{etcd_prefix}p{rng.randrange(paths)}")
        async with mutex:
            peak = max(peak, len(pooled_lease_ids(client)))
        if n % 3:
            await mutex.aclose()  # every third is never closed: dropped, garbage collected

    async def worker() -> None:
        for n in counter:
            await handler(n)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.monotonic() - started
    gc.collect()
    alive = await _alive(client, client.granted)
    print(
        f"\n{requests} mutexes, {workers} at a time: {len(client.granted)} leases granted, "
        f"peak pooled {peak}, alive after the run {len(alive)}, {elapsed:.1f}s"
    )
    # Live leases at any time <= the concurrency (grants over the run may be more: a lease
    # grown for a moment of contention idles out and is revoked).
    assert peak <= workers and len(alive) <= workers
    assert await keys(client, etcd_prefix) == []
    # Idle: revoked after the idle window, though the client stays open.
    await eventually(lambda: _none_alive(client), timeout=10, what="idle leases revoked")
    assert pooled_lease_ids(client) == []


async def _none_alive(client) -> bool:
    return not await _alive(client, client.granted)


async def test_per_request_mutexes_share_one_lease(own_client, etcd_prefix):
    """The quick form of the above: 200 instances one after another, 50 never closed."""
    client = own_client
    for n in range(200):
        mutex = DistributedMutex(client, f"{etcd_prefix}m{n % 7}")
        async with mutex:
            pass
        if n % 4:
            await mutex.aclose()
        del mutex
    # Read the pool at once, with no RPC in between: on a loaded box a round trip to etcd
    # after gc.collect() can come later than the idle window (3 s), when the pool has
    # already revoked the lease as it should.
    assert pooled_lease_ids(client) == client.granted
    gc.collect()
    assert len(client.granted) == 1  # the old code: one lease per instance, 150 revoked
    await eventually(lambda: _none_alive(client), timeout=10, what="the idle lease revoked")
    assert pooled_lease_ids(client) == []


@pytest.mark.parametrize("kind", ["mutex", "read-write lock", "semaphore"])
async def test_uncontended_cycle_of_a_fresh_instance_costs_no_extra_rpc(
    own_client, etcd_prefix, kind
):
    client = own_client

    def make():
        path = etcd_prefix + "l"
        if kind == "mutex":
            return DistributedMutex(client, path)
        if kind == "read-write lock":
            return DistributedReadWriteLock(client, path)
        return DistributedSemaphore(client, path, 2)

    def side(recipe):
        return recipe.write_lock if kind == "read-write lock" else recipe

    warm = make()
    async with side(warm):
        pass  # the pool has a lease now (and the semaphore its permit count)
    for _ in range(5):
        recipe = make()
        if kind == "semaphore":
            recipe._validated = True  # the permit count check is a read of its own, once
        with traffic(client) as seen:
            async with side(recipe):
                pass
            await recipe.aclose()
        # One transaction to take it, one guarded delete to give it back: no grant, no revoke.
        assert dict(seen.rpcs) == {"txn:Txn": 2}, kind
    assert len(client.granted) == 1
    await warm.aclose()


async def test_two_holders_on_one_path_never_share_a_lease(own_client, etcd_prefix):
    """A lost hold keeps its lease until it is released; the next holder on the path -- let
    through at the loss -- queues its key (``<path>/<its lease>``) on another lease."""
    client = own_client
    a, b = (DistributedMutex(client, etcd_prefix + "same") for _ in range(2))
    other = DistributedMutex(client, etcd_prefix + "other")
    assert await a.acquire(timeout=5)
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(0.2)
    # Parked on the local line: no lease, no key of its own yet.
    assert not waiting.done() and b._session.leases == []
    assert len(await keys(client, etcd_prefix + "same/")) == 1
    assert await other.acquire(timeout=5)
    assert other.hold.lease_id == a.hold.lease_id  # another path: the lease is shared
    await client.delete(a.hold.key)  # out of band: a's hold is lost, b's turn comes
    assert await asyncio.wait_for(waiting, 5)
    assert not a.is_held and a._session.leases == [a.hold.lease_id]  # until released
    assert b.hold.lease_id != a.hold.lease_id
    assert b._session.leases == [b.hold.lease_id]
    assert not await a.release()
    for m in (a, b, other):
        await m.aclose()


async def test_a_lost_pooled_lease_is_lost_for_every_hold_and_never_reused(own_client, etcd_prefix):
    client = own_client
    m1 = DistributedMutex(client, etcd_prefix + "a")
    m2 = DistributedMutex(client, etcd_prefix + "b")
    sem = DistributedSemaphore(client, etcd_prefix + "s", 1)
    lost: list[str] = []
    m1.add_lock_lost_listener(lambda cause: lost.append("a"))
    m2.add_lock_lost_listener(lambda cause: lost.append("b"))
    sem.add_permit_lost_listener(lambda cause: lost.append("s"))
    assert await m1.acquire() and await m2.acquire() and await sem.acquire()
    shared = m1.hold.lease_id
    assert m2.hold.lease_id == shared == sem.hold.lease_id
    await client.lease_revoke(shared)  # out of band
    await eventually(lambda: sorted(lost) == ["a", "b", "s"], what="every hold told")
    await eventually(lambda: shared not in pooled_lease_ids(client), what="dropped from the pool")
    assert await m1.release() is False and await m2.release() is False
    assert await sem.release() is False
    assert await m1.acquire(timeout=5)
    assert m1.hold.lease_id != shared  # never handed out again
    await m1.release()
    for r in (m1, m2, sem):
        await r.aclose()


async def test_a_lease_unknown_to_etcd_is_lost_for_every_hold(own_client, etcd_server, etcd_prefix):
    """A write with the pooled lease that etcd reports unknown (the keep-alive has not
    noticed yet) marks it lost for every hold on it, and the acquisition takes a new one."""
    client = own_client
    holder = DistributedMutex(client, etcd_prefix + "a", lease_ttl=30)
    causes: list[object] = []
    holder.add_lock_lost_listener(causes.append)
    assert await holder.acquire()
    shared = holder.hold.lease_id
    async with connect(**etcd_server.client_kwargs()) as other:
        await other.lease_revoke(shared)
    second = DistributedMutex(client, etcd_prefix + "b", lease_ttl=30)
    assert await second.acquire(timeout=5)  # on the dead lease first: LeaseNotFound, requeue
    assert second.hold.lease_id != shared
    await eventually(lambda: len(causes) == 1, what="the first hold told")
    assert await holder.release() is False
    await second.release()
    await holder.aclose()
    await second.aclose()


async def test_client_close_revokes_the_pooled_leases(etcd_server, etcd_client, etcd_prefix):
    async with connect(**etcd_server.client_kwargs()) as client:
        mutex = DistributedMutex(client, etcd_prefix + "m")
        async with mutex:
            lease = mutex.hold.lease_id
        assert lease in await server_leases(etcd_client)  # idle in the pool
    assert lease not in await server_leases(etcd_client)  # revoked by the client's aclose()


@pytest.mark.parametrize("kind", ["mutex", "read-write lock", "semaphore"])
async def test_cancelled_at_any_point_leaves_no_lease(own_client, etcd_prefix, kind):
    """Waiters cancelled after random delays (mid-grant, mid-transaction, mid-wait) on a held
    lock: once idle, etcd's lease list has none of their leases, and no key of theirs."""
    client = own_client
    path = etcd_prefix + "l"

    def make():
        if kind == "mutex":
            return DistributedMutex(client, path)
        if kind == "read-write lock":
            return DistributedReadWriteLock(client, path).write_lock
        return DistributedSemaphore(client, path, 1)

    holder = make()
    assert await holder.acquire(timeout=5)
    held = holder.hold.lease_id
    rng = random.Random(22)
    for _ in range(12):
        waiter = make()
        with pytest.raises(TimeoutError):
            with anyio.fail_after(rng.choice([0.0005, 0.002, 0.005, 0.02, 0.1])):
                await waiter.acquire()
    left = await client.range(path + "/", prefix=True, keys_only=True)
    assert [kv.key for kv in left.kvs if not kv.key.endswith(b"/permits")] == [holder.hold.key]
    others = [lease for lease in client.granted if lease != held]
    for lease in others:
        assert await lease_keys(client, lease) == []
    await eventually(
        lambda: _alive_is(client, {held}), timeout=10, what="the waiters' leases revoked"
    )
    await holder.release()
    await eventually(lambda: _alive_is(client, set()), timeout=10, what="all revoked")


async def _alive_is(client, expected: set[int]) -> bool:
    return await _alive(client, client.granted) == expected
