"""DistributedMultiLock against a real etcd: all or nothing, sorted order (no deadlock between
multi-locks over the same paths in opposite orders), a fencing token per path, cancellation and
timeouts that leave no key, the loss of one path, a server restart while waiting."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedMultiLock,
    DistributedMutex,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    Op,
    connect,
)

from .helpers import GIVE_UP, keys, queued


async def test_takes_every_path_with_a_token_each(etcd_client, etcd_prefix):
    b, a = etcd_prefix + "b", etcd_prefix + "a"
    multi = DistributedMultiLock(etcd_client, [b, a])
    assert multi.paths == (a, b)  # sorted: the order every multi-lock takes them in
    assert await keys(etcd_client, etcd_prefix) == []  # the constructor did no I/O
    async with multi.with_lock(timeout=5) as held:
        assert held is multi and multi.is_held
        tokens = multi.fencing_tokens
        assert set(tokens) == {a, b} and tokens[a] < tokens[b]  # a was taken first
        for path in (a, b):
            (key,) = await keys(etcd_client, path + "/")
            assert (await etcd_client.get(key)).create_revision == tokens[path]
            assert multi.hold(path).fencing_token == tokens[path]
        assert (await multi.guarded_txn([Op.put(etcd_prefix + "x", b"1")])).succeeded
        assert "2 of 2 paths held" in repr(multi)
    assert not multi.is_held and multi.fencing_tokens == {}
    assert await keys(etcd_client, etcd_prefix) == [(etcd_prefix + "x").encode()]
    with pytest.raises(LockNotHeldError):
        await multi.release()
    with pytest.raises(LockNotHeldError):
        multi.compares()
    with pytest.raises(InvalidArgumentError):
        multi.hold(etcd_prefix + "other")
    await multi.aclose()


async def test_split_form_and_reentrancy(etcd_client, etcd_prefix):
    multi = DistributedMultiLock(etcd_client, [etcd_prefix + "a", etcd_prefix + "b"])
    assert await multi.acquire()
    assert await multi.acquire(timeout=0)  # reentrant per task
    assert await multi.release() and multi.is_held
    assert await multi.release() and not multi.is_held
    assert await keys(etcd_client, etcd_prefix) == []
    await multi.aclose()


async def test_bad_input_writes_nothing(etcd_client, etcd_prefix):
    a = etcd_prefix + "a"
    with pytest.raises(InvalidArgumentError):
        DistributedMultiLock(etcd_client, [])
    with pytest.raises(InvalidArgumentError):
        DistributedMultiLock(etcd_client, [a, a])
    with pytest.raises(InvalidArgumentError):
        DistributedMultiLock(etcd_client, [a, a + "/inner"])  # nested
    with pytest.raises(InvalidArgumentTypeError):
        DistributedMultiLock(etcd_client, a)  # one path, not a list
    with pytest.raises(InvalidArgumentError):
        DistributedMultiLock(etcd_client, [a, "relative"])
    assert await keys(etcd_client, etcd_prefix) == []


async def test_all_or_nothing_when_one_path_is_busy(etcd_client, etcd_prefix, rivals):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    (other,) = await rivals(1)
    rival = DistributedMutex(other, b)
    await rival.acquire()
    (rival_key,) = await keys(etcd_client, b + "/")
    multi = DistributedMultiLock(etcd_client, [a, b])
    assert await multi.acquire(timeout=0) is False
    assert await multi.acquire(timeout=0.5) is False
    with pytest.raises(LockTimeoutError):
        async with multi.with_lock(timeout=0.3):
            raise AssertionError("the body must not run")
    assert await keys(etcd_client, etcd_prefix) == [rival_key]  # a was given back each time
    await rival.release()
    assert await multi.acquire(timeout=5)
    assert await multi.release()
    await multi.aclose()
    await rival.aclose()


@pytest.mark.parametrize("how", list(GIVE_UP))
async def test_cancelled_mid_wait_leaves_no_key(etcd_client, etcd_prefix, rivals, how):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    (other,) = await rivals(1)
    rival = DistributedMutex(other, b)
    await rival.acquire()
    (rival_key,) = await keys(etcd_client, b + "/")
    multi = DistributedMultiLock(etcd_client, [a, b])
    await GIVE_UP[how](multi.acquire())  # holds a, waits for b, then gives up
    assert await keys(etcd_client, etcd_prefix) == [rival_key]

    async def scoped() -> None:
        async with multi:
            raise AssertionError("the body must not run")

    await GIVE_UP[how](scoped())
    assert await keys(etcd_client, etcd_prefix) == [rival_key]
    assert not multi.is_held
    await rival.release()
    assert await keys(etcd_client, etcd_prefix) == []
    await multi.aclose()
    await rival.aclose()


async def test_opposite_orders_never_deadlock(etcd_client, etcd_prefix, rivals):
    """Four multi-locks (two clients, the paths given in opposite orders) take turns 20 times
    in all; a read-modify-write under them stays exact and nobody is inside twice at once."""
    a, b, counter = etcd_prefix + "a", etcd_prefix + "b", etcd_prefix + "n"
    (other,) = await rivals(1)
    locks = [
        DistributedMultiLock(etcd_client, [a, b]),
        DistributedMultiLock(other, [b, a]),
        DistributedMultiLock(other, [a, b]),
        DistributedMultiLock(etcd_client, [b, a]),
    ]
    inside = 0
    overlaps = 0

    async def worker(multi: DistributedMultiLock) -> None:
        nonlocal inside, overlaps
        for _ in range(5):
            async with multi.with_lock(timeout=20):
                inside += 1
                overlaps += inside > 1
                kv = await etcd_client.get(counter)
                await asyncio.sleep(0.005)
                await etcd_client.put(counter, str(int(kv.value if kv else b"0") + 1))
                inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(m) for m in locks)), 60)
    assert overlaps == 0
    assert (await etcd_client.get(counter)).value == b"20"
    for multi in locks:
        await multi.aclose()


async def test_losing_one_path_cancels_the_body_and_releases_the_rest(etcd_client, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    multi = DistributedMultiLock(etcd_client, [a, b])
    heard: list[BaseException | None] = []
    multi.add_lock_lost_listener(heard.append)
    losses = multi.lock_lost_events()
    entered = asyncio.Event()

    async def body() -> None:
        async with multi.with_lock(timeout=5):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    (b_key,) = await keys(etcd_client, b + "/")
    await etcd_client.delete(b_key)  # out of band: the hold of b is gone
    with pytest.raises(LockLostError):
        await asyncio.wait_for(task, 10)
    assert len(heard) == 1
    assert (await asyncio.wait_for(anext(losses), 5)) is heard[0]
    assert multi.connection_state is ConnectionState.LOST
    assert await keys(etcd_client, etcd_prefix) == []  # a was released too
    await multi.aclose()


async def test_lease_loss_is_reported_like_a_mutex(etcd_client, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    multi = DistributedMultiLock(etcd_client, [a, b])
    heard: list[BaseException | None] = []
    multi.add_lock_lost_listener(heard.append)
    assert await multi.acquire()
    leases = {multi.hold(p).lease_id for p in (a, b)}
    for lease in leases:
        await etcd_client.lease_revoke(lease)  # out of band
    for _ in range(100):
        if not multi.is_held and len(heard) == 2:
            break
        await asyncio.sleep(0.05)
    assert not multi.is_held and len(heard) == 2  # once per path
    assert multi.connection_state is ConnectionState.LOST
    assert await multi.release() is False  # the holds had been lost
    assert await keys(etcd_client, etcd_prefix) == []
    await multi.aclose()


@pytest.mark.slow
async def test_waiting_multi_lock_survives_a_server_restart(fresh_etcd_server, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as mine, connect(**kwargs) as theirs:
        rival = DistributedMutex(theirs, b, lease_ttl=10)
        await rival.acquire()
        multi = DistributedMultiLock(mine, [a, b], lease_ttl=10)
        pending = asyncio.create_task(multi.acquire(timeout=30))
        await queued(mine, b + "/", 2)
        fresh_etcd_server.kill()
        await asyncio.sleep(0.3)
        fresh_etcd_server.restart()
        await asyncio.sleep(1.0)
        assert not pending.done()
        assert await rival.release()
        assert await asyncio.wait_for(pending, 15) is True
        assert await multi.release()
        assert await keys(mine, etcd_prefix) == []
        await multi.aclose()
        await rival.aclose()


def test_blocking_facade_threads_take_turns(etcd_server, etcd_prefix):
    import threading

    from etcd_recipes.sync import DistributedMultiLock as SyncMultiLock
    from etcd_recipes.sync import connect as sync_connect

    a, b = etcd_prefix + "a", etcd_prefix + "b"
    inside, overlaps, errors = [0], [0], []
    with sync_connect(**etcd_server.client_kwargs()) as client:
        multi = SyncMultiLock(client, [b, a])

        def worker() -> None:
            try:
                for _ in range(3):
                    with multi:  # holds are per thread
                        assert multi.is_held and set(multi.fencing_tokens) == {a, b}
                        inside[0] += 1
                        overlaps[0] += inside[0] > 1
                        threading.Event().wait(0.01)
                        inside[0] -= 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and overlaps == [0]
        assert client.get_prefix(etcd_prefix).kvs == []
        multi.close()
