"""DistributedBarrierWithCount and DistributedDoubleBarrier against a real etcd: release
together, timeouts and cancellation stop counting, rounds, late arrivals, close, and the
enter/leave phases of four members."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from etcd_recipes import (
    DistributedBarrierWithCount,
    DistributedDoubleBarrier,
    RecipeClosedError,
    connect,
)
from tests.helpers import eventually


async def _keys(client, prefix: str) -> list[str]:
    return sorted(kv.key_text.removeprefix(prefix) for kv in await client.get_prefix(prefix))


async def test_members_are_released_together(etcd_client, etcd_prefix):
    path = etcd_prefix + "b"
    barriers = [DistributedBarrierWithCount(etcd_client, path, 3) for _ in range(3)]
    arrived: list[float] = []
    last_may_come = asyncio.Event()

    async def member(i: int) -> float:
        await asyncio.sleep(0.15 * i)
        if i == 2:
            await last_may_come.wait()
        arrived.append(time.monotonic())
        assert await barriers[i].wait_on_barrier(timeout=10) is True
        return time.monotonic()

    tasks = [asyncio.create_task(member(i)) for i in range(3)]
    await eventually(lambda: _count_is(barriers[0], 2), what="two waiting")
    assert (await etcd_client.get(path + "/ready")) is not None
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in tasks)
    last_may_come.set()
    released = await asyncio.gather(*tasks)
    assert min(released) >= max(arrived)
    assert max(released) - min(released) < 0.3
    assert await _keys(etcd_client, path + "/") == []  # round over: nothing left
    for b in barriers:
        await b.aclose()


async def test_timeout_returns_false_and_stops_counting(etcd_client, etcd_prefix):
    path = etcd_prefix + "b"
    async with DistributedBarrierWithCount(etcd_client, path, 2) as barrier:
        leases = etcd_client._leases.lease_count
        assert await barrier.wait_on_barrier(timeout=0.3) is False
        assert await barrier.waiter_count() == 0
        assert await _keys(etcd_client, path + "/") == ["ready"]  # the open round, no waiters
        assert etcd_client._leases.lease_count == leases


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
async def test_a_cancelled_member_does_not_count(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "b"
    barrier = DistributedBarrierWithCount(etcd_client, path, 3)
    first = asyncio.create_task(barrier.wait_on_barrier(timeout=20))
    await eventually(lambda: _count_is(barrier, 1), what="first waiting")
    if how == "task-cancel":
        task = asyncio.create_task(barrier.wait_on_barrier())
        await eventually(lambda: _count_is(barrier, 2), what="second waiting")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif how == "anyio-fail-after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.4):
                await barrier.wait_on_barrier()
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.4):
                await barrier.wait_on_barrier()
    assert await barrier.waiter_count() == 1  # the cancelled member's key is gone
    # A second real member makes two: still short of three.
    second = asyncio.create_task(barrier.wait_on_barrier(timeout=20))
    await eventually(lambda: _count_is(barrier, 2), what="second real member")
    await asyncio.sleep(0.2)
    assert not first.done() and not second.done()
    assert await barrier.wait_on_barrier(timeout=10) is True  # the third
    assert await first is True and await second is True
    await barrier.aclose()


async def _count_is(barrier: DistributedBarrierWithCount, n: int) -> bool:
    return await barrier.waiter_count() == n


async def test_rounds_and_late_arrivals(etcd_client, etcd_prefix):
    path = etcd_prefix + "b"
    barrier = DistributedBarrierWithCount(etcd_client, path, 2)
    rounds: list[int] = []
    for _ in range(3):  # reusable: three rounds of two
        first = asyncio.create_task(barrier.wait_on_barrier(5))
        await eventually(lambda: _count_is(barrier, 1), what="first of the round")
        rounds.append((await etcd_client.get(path + "/ready")).create_revision)
        assert await barrier.wait_on_barrier(5) is True
        assert await first is True
        assert await barrier.waiter_count() == 0  # the release removed the round's keys
    assert rounds == sorted(set(rounds))  # a new ready key (round) each time
    # A member arriving after a release belongs to the next round: alone, it waits.
    assert await barrier.wait_on_barrier(timeout=0.5) is False
    await barrier.aclose()


async def test_aclose_releases_a_parked_waiter_with_false(etcd_client, etcd_prefix):
    path = etcd_prefix + "b"
    barrier = DistributedBarrierWithCount(etcd_client, path, 2)
    waiter = asyncio.create_task(barrier.wait_on_barrier())
    await eventually(lambda: _count_is(barrier, 1), what="waiting")
    await barrier.aclose()
    assert await asyncio.wait_for(waiter, 5) is False
    assert await _keys(etcd_client, path + "/") == ["ready"]
    with pytest.raises(RecipeClosedError):
        await barrier.wait_on_barrier()


async def test_double_barrier_with_four_members(etcd_client, etcd_server, etcd_prefix):
    path = etcd_prefix + "db"
    async with connect(**etcd_server.client_kwargs()) as other:
        clients = [etcd_client, other, etcd_client, other]
        barriers = [DistributedDoubleBarrier(c, path, 4) for c in clients]
        log: list[tuple[str, int, float]] = []

        last_may_come = asyncio.Event()

        async def member(i: int) -> None:
            await asyncio.sleep(0.1 * i)
            if i == 3:
                await last_may_come.wait()
            log.append(("arrive", i, time.monotonic()))
            assert await barriers[i].enter(timeout=10)
            log.append(("entered", i, time.monotonic()))
            await asyncio.sleep(0.1 * (3 - i))  # the first to enter works longest
            log.append(("leaving", i, time.monotonic()))
            assert await barriers[i].leave(timeout=10)
            log.append(("left", i, time.monotonic()))

        tasks = [asyncio.create_task(member(i)) for i in range(4)]
        await eventually(lambda: _enter_count(barriers[0], 3), what="three entering")
        await asyncio.sleep(0.1)
        assert not any(k == "entered" for k, _, _ in log)  # three of four: nobody enters
        last_may_come.set()
        await asyncio.gather(*tasks)

        def times(kind: str) -> list[float]:
            return [t for k, _, t in log if k == kind]

        assert min(times("entered")) >= max(times("arrive"))
        assert min(times("left")) >= max(times("leaving"))
        assert max(times("entered")) - min(times("entered")) < 0.3
        assert await barriers[0].enter_waiter_count() == 0
        assert await barriers[0].leave_waiter_count() == 0
        for b in barriers:
            assert b.client_id and b.member_count == 4 and b.lease_ttl == 2
            await b.aclose()
        assert await _keys(etcd_client, path + "/") == []


async def _enter_count(barrier: DistributedDoubleBarrier, n: int) -> bool:
    return await barrier.enter_waiter_count() == n


async def test_misuse(etcd_client, etcd_prefix):
    with pytest.raises(ValueError):
        DistributedBarrierWithCount(etcd_client, etcd_prefix + "b", 0)
    with pytest.raises(ValueError):
        DistributedBarrierWithCount(etcd_client, etcd_prefix + "b", True)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DistributedDoubleBarrier(etcd_client, etcd_prefix + "b", -1)
    barrier = DistributedBarrierWithCount(etcd_client, etcd_prefix + "b", 2)
    with pytest.raises(ValueError):
        await barrier.wait_on_barrier(timeout=0)
    await barrier.aclose()
    double = DistributedDoubleBarrier(etcd_client, etcd_prefix + "d", 2)
    await double.aclose()
    with pytest.raises(RecipeClosedError):
        await double.enter()


async def test_a_waiting_key_whose_lease_is_lost_is_restored(etcd_client, etcd_prefix):
    path = etcd_prefix + "b"
    async with DistributedBarrierWithCount(etcd_client, path, 2) as barrier:
        first = asyncio.create_task(barrier.wait_on_barrier(20))
        await eventually(lambda: _count_is(barrier, 1), what="waiting")
        kv = (await etcd_client.get_prefix(path + "/waiting/")).kvs[0]
        await etcd_client.lease_revoke(kv.lease)  # the key vanishes with its lease ...

        async def restored() -> bool:
            now = await etcd_client.get(kv.key)
            return now is not None and now.lease != kv.lease

        await eventually(restored, what="the waiting key re-created on a new lease")
        assert not first.done()  # ... and the member still counts
        assert await barrier.wait_on_barrier(5) is True
        assert await first is True
        assert barrier.has_exceptions  # the expiry was recorded


@pytest.mark.slow
async def test_waiters_survive_a_server_restart(fresh_etcd_server, etcd_prefix):
    path = etcd_prefix + "b"
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        barrier = DistributedBarrierWithCount(client, path, 3, lease_ttl=5)
        waiters = [asyncio.create_task(barrier.wait_on_barrier(30)) for _ in range(2)]
        await eventually(lambda: _count_is(barrier, 2), what="two waiting")
        fresh_etcd_server.kill()
        await asyncio.sleep(0.3)
        fresh_etcd_server.restart()
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in waiters)
        assert await barrier.wait_on_barrier(15) is True
        assert await asyncio.gather(*waiters) == [True, True]
        await barrier.aclose()
