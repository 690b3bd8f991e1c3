"""The local line: the mutexes of one client on one path wait for their turn in the process,
first come first served, behind one waiter key in etcd -- and each turn queues a fresh key at
the tail, so processes take turns and fencing tokens keep following etcd's order."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import DistributedMutex
from etcd_recipes.client.lease_pool import pooled_lease_ids
from tests.helpers import eventually

from .helpers import GIVE_UP, keys, lease_keys, lease_of, traffic


async def _parked(mutexes: list[DistributedMutex]) -> None:
    await eventually(
        lambda: all("acquiring" in repr(m) for m in mutexes), what="every waiter parked"
    )


async def test_local_waiters_wait_behind_one_key_and_one_lease(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    holder = DistributedMutex(etcd_client, path)
    waiters = [DistributedMutex(etcd_client, path) for _ in range(20)]
    await holder.acquire()
    served: list[tuple[int, int]] = []

    async def take(i: int) -> None:
        async with waiters[i]:
            token = waiters[i].fencing_token
            assert token is not None
            served.append((i, token))

    tasks = [asyncio.create_task(take(i)) for i in range(len(waiters))]
    await _parked(waiters)
    # Twenty waiting tasks: still one key and one lease in etcd, no lease of their own.
    assert await keys(etcd_client, path + "/") == [holder.hold.key]
    assert pooled_lease_ids(etcd_client) == [holder.hold.lease_id]
    assert all(m._session.leases == [] for m in waiters)
    first_token = holder.fencing_token
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert [i for i, _ in served] == list(range(len(waiters)))  # first come, first served
    tokens = [first_token, *(token for _, token in served)]
    assert tokens == sorted(set(tokens))  # a fresh key, at the tail, for every holder
    assert await keys(etcd_client, path + "/") == []
    assert len(pooled_lease_ids(etcd_client)) == 1  # the one lease, handed from turn to turn
    for m in (holder, *waiters):
        await m.aclose()


async def test_processes_take_turns(etcd_client, etcd_prefix, rivals):
    """Two clients (two processes, as far as etcd can tell), three waiters each: after every
    release the next local waiter queues behind the other client's waiter, so the owners
    alternate and every fencing token is higher than the last (nobody overtakes)."""
    path = etcd_prefix + "m"
    (other,) = await rivals(1)
    a = [DistributedMutex(etcd_client, path) for _ in range(4)]
    b = [DistributedMutex(other, path) for _ in range(3)]
    await a[0].acquire()
    log: list[tuple[str, int]] = []

    async def take(name: str, mutex: DistributedMutex) -> None:
        async with mutex:
            token = mutex.fencing_token
            assert token is not None
            log.append((name, token))
            await asyncio.sleep(0.05)

    b_tasks = [asyncio.create_task(take("b", m)) for m in b]
    await eventually(lambda: len(b[0]._session.leases) == 1, what="b's first waiter queued")
    await _parked(b)
    a_tasks = [asyncio.create_task(take("a", m)) for m in a[1:]]
    await _parked(a[1:])
    assert len(await keys(etcd_client, path + "/")) == 2  # one key per client
    log.append(("a", a[0].fencing_token or 0))
    await a[0].release()
    await asyncio.wait_for(asyncio.gather(*a_tasks, *b_tasks), 20)
    assert [name for name, _ in log] == ["a", "b"] * 3 + ["a"]
    tokens = [token for _, token in log]
    assert tokens == sorted(set(tokens))
    assert await keys(etcd_client, path + "/") == []
    for m in (*a, *b):
        await m.aclose()


async def _timeout(coro):
    assert await coro is False


HOW = {**GIVE_UP, "timeout": _timeout}


@pytest.mark.parametrize("how", list(HOW))
async def test_a_cancelled_local_waiter_leaves_nothing_and_delays_no_one(
    etcd_client, etcd_prefix, how
):
    path = etcd_prefix + "m"
    holder, cancelled, next_in_line = (DistributedMutex(etcd_client, path) for _ in range(3))
    await holder.acquire()
    if how == "timeout":
        attempt = asyncio.create_task(HOW[how](cancelled.acquire(timeout=0.3)))
    else:
        attempt = asyncio.create_task(HOW[how](cancelled.acquire()))
    await _parked([cancelled])
    next_task = asyncio.create_task(next_in_line.acquire())
    await _parked([next_in_line])
    await attempt  # gave up while parked on the line, ahead of next_in_line
    assert "acquiring" not in repr(cancelled) and not cancelled.is_held
    assert cancelled._session.leases == []
    assert await keys(etcd_client, path + "/") == [holder.hold.key]
    await holder.release()
    assert await asyncio.wait_for(next_task, 5)
    assert await keys(etcd_client, path + "/") == [next_in_line.hold.key]
    await next_in_line.release()
    assert await keys(etcd_client, path + "/") == []
    for m in (holder, cancelled, next_in_line):
        await m.aclose()


async def test_a_lost_hold_lets_the_next_local_waiter_in(etcd_client, etcd_prefix):
    """The turn passes at the loss: the next waiter need not wait for the loser's release."""
    path = etcd_prefix + "m"
    loser, waiter = DistributedMutex(etcd_client, path), DistributedMutex(etcd_client, path)
    await loser.acquire()
    lost_lease = loser.hold.lease_id
    waiting = asyncio.create_task(waiter.acquire())
    await _parked([waiter])
    await etcd_client.lease_revoke(lost_lease)  # out of band
    assert await asyncio.wait_for(waiting, 5)
    assert waiter.hold.lease_id != lost_lease
    assert not loser.is_held and await loser.release() is False
    assert await lease_keys(etcd_client, waiter.hold.lease_id) == [waiter.hold.key]
    assert lease_of(waiter.hold.key) == waiter.hold.lease_id
    await waiter.release()
    for m in (loser, waiter):
        await m.aclose()


async def test_try_once_behind_a_local_holder_sends_nothing(etcd_client, etcd_prefix, rivals):
    path = etcd_prefix + "m"
    holder, trying = DistributedMutex(etcd_client, path), DistributedMutex(etcd_client, path)
    await holder.acquire()
    with traffic(etcd_client) as seen:
        assert await trying.acquire(timeout=0) is False
    assert seen.rpc_total == 0  # answered by the local line
    await holder.release()
    # Held by another client: the try goes to etcd, finds it taken and leaves no key.
    (other,) = await rivals(1)
    elsewhere = DistributedMutex(other, path)
    await elsewhere.acquire()
    assert await trying.acquire(timeout=0) is False
    assert await keys(etcd_client, path + "/") == [elsewhere.hold.key]
    await elsewhere.release()
    assert await trying.acquire(timeout=0) is True
    await trying.release()
    for m in (holder, trying, elsewhere):
        await m.aclose()


async def test_the_line_is_per_client_and_path_and_goes_with_its_mutexes(etcd_client, etcd_prefix):
    from etcd_recipes.locks._line import _LINES

    a = DistributedMutex(etcd_client, etcd_prefix + "a")
    also_a = DistributedMutex(etcd_client, etcd_prefix + "a")
    b = DistributedMutex(etcd_client, etcd_prefix + "b")
    assert a._line is also_a._line and a._line is not b._line
    lines = _LINES[etcd_client]
    assert {etcd_prefix + "a", etcd_prefix + "b"} <= set(lines.keys())
    for m in (a, also_a, b):
        await m.aclose()
    del a, also_a, b, m
    gc.collect()
    assert not {etcd_prefix + "a", etcd_prefix + "b"} & set(lines.keys())
