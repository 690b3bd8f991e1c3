"""DistributedMutex on a real etcd: exclusion, reentrancy, timeouts, fencing, loss, misuse."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedMutex,
    LockHold,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    Op,
    RecipeClosedError,
)
from tests.helpers import eventually, first_item_then_break, take

from .helpers import keys, lease_alive, lease_keys, lease_of, queued, short_idle_window


@pytest.fixture(autouse=True)
def _short_idle(monkeypatch):
    short_idle_window(monkeypatch)


async def _dead(client, lease_id: int) -> bool:
    return not await lease_alive(client, lease_id)


async def test_uncontended_cycle_and_key_layout(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    assert not await mutex.is_locked()
    assert await mutex.acquire() is True
    (key,) = await keys(etcd_client, path + "/")
    kv = await etcd_client.get(key)
    assert kv is not None and kv.value == b""  # etcd's own layout: <path>/<lease hex>, ""
    assert key == f"{path}/{kv.lease:x}".encode()
    assert mutex.is_held and mutex.hold_count == 1 and await mutex.is_locked()
    assert mutex.fencing_token == kv.create_revision
    assert await mutex.release() is True
    assert not mutex.is_held and mutex.hold is None and not await mutex.is_locked()
    # The lease goes back to the client's pool for the next hold (two raft writes per
    # cycle), revoked once idle or when the client closes.
    assert await lease_alive(etcd_client, kv.lease)
    await mutex.aclose()
    assert await lease_keys(etcd_client, kv.lease) == []
    await eventually(lambda: _dead(etcd_client, kv.lease), what="the idle lease revoked")
    with pytest.raises(RecipeClosedError):
        await mutex.acquire()


async def test_reentrant_per_task_and_tasks_take_turns(etcd_client, etcd_prefix):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m")
    async with mutex:
        async with mutex:
            assert mutex.hold_count == 2
        assert mutex.hold_count == 1

        async def other_task() -> bool:
            assert not mutex.is_held  # holds are per task
            return await mutex.acquire(timeout=0.3)

        assert await asyncio.create_task(other_task()) is False
    assert mutex.hold_count == 0
    order: list[int] = []

    async def turn(i: int) -> None:
        async with mutex:
            order.append(i)
            await asyncio.sleep(0.01)
            order.append(i)

    await asyncio.gather(*(turn(i) for i in range(5)))
    assert all(order[i] == order[i + 1] for i in range(0, len(order), 2))  # no interleaving
    await mutex.aclose()


async def test_fencing_tokens_grow_and_guard_writes(etcd_client, etcd_prefix):
    path, data = etcd_prefix + "m", etcd_prefix + "data"
    a, b = DistributedMutex(etcd_client, path), DistributedMutex(etcd_client, path)
    async with a.with_lock() as first:
        assert isinstance(first, LockHold) and a.hold is first
        assert (await first.guarded_txn([Op.put(data, b"a")])).succeeded
        assert (await etcd_client.txn([a.is_owner()], [Op.put(data, b"a2")])).succeeded
    async with b.with_lock() as second:
        assert second.fencing_token > first.fencing_token
        assert not (await first.guarded_txn([Op.put(data, b"stale")])).succeeded
        assert (await b.guarded_txn([Op.put(data, b"b")])).succeeded
    assert (await etcd_client.get(data)).value == b"b"
    with pytest.raises(LockNotHeldError):
        a.is_owner()
    await a.aclose()
    await b.aclose()


async def test_contended_with_lock_timeout_never_runs_the_body(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    holder, other = DistributedMutex(etcd_client, path), DistributedMutex(etcd_client, path)
    entered = False
    async with holder:
        for _ in range(3):
            with pytest.raises(LockTimeoutError) as info:
                async with other.with_lock(timeout=0.5):
                    entered = True
            assert isinstance(info.value, TimeoutError)
            assert await other.acquire(timeout=0.2) is False
        assert not entered
        # Nothing of the failed attempts stays behind: one key, and no lease of theirs.
        (key,) = await keys(etcd_client, path + "/")
        assert lease_of(key) == holder.hold.lease_id
        assert other._session.leases == []
    assert await other.acquire(timeout=2)
    await other.release()
    await holder.aclose()
    await other.aclose()


async def test_failed_attempts_leave_no_leases(etcd_client, etcd_prefix):
    """B #25: N failed timed acquisitions do not leak leases on the server."""
    granted: list[int] = []
    grant = etcd_client._grant_lease  # every grant goes through it (lease_grant too)

    async def recording_grant(ttl, **kwargs):
        result = await grant(ttl, **kwargs)
        granted.append(result.id)
        return result

    etcd_client._grant_lease = recording_grant
    path = etcd_prefix + "m"
    async with DistributedMutex(etcd_client, path) as holder:
        for _ in range(5):
            other = DistributedMutex(etcd_client, path)
            assert not await other.acquire(timeout=0.1)
        # The failed attempts shared one pooled lease (not one each), which carries no key
        # and is revoked once idle.
        assert len(granted) <= 3
        for lease in granted:
            if lease != holder.hold.lease_id:
                assert await lease_keys(etcd_client, lease) == []
                await eventually(
                    lambda gone=lease: _dead(etcd_client, gone), what="idle leases revoked"
                )
    del etcd_client._grant_lease
    await holder.aclose()


async def test_release_rules(etcd_client, etcd_prefix):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m")
    with pytest.raises(LockNotHeldError):
        await mutex.release()
    # A hold whose task has finished may be released by another task (asyncio.wait_for in
    # Python 3.10 runs acquire() in a task of its own, for instance).
    assert await asyncio.create_task(mutex.acquire())
    assert mutex.is_held
    assert await mutex.release() is True
    # A live task's hold is not yours to release.
    acquired, done = asyncio.Event(), asyncio.Event()

    async def owner() -> None:
        async with mutex:
            acquired.set()
            await done.wait()

    task = asyncio.create_task(owner())
    await acquired.wait()
    with pytest.raises(LockNotHeldError):
        await mutex.release()
    done.set()
    await task
    await mutex.aclose()


async def test_lock_loss_by_out_of_band_revoke(etcd_client, etcd_prefix, rivals):
    path, data = etcd_prefix + "m", etcd_prefix + "data"
    holder = DistributedMutex(etcd_client, path)
    (other,) = await rivals(1)
    successor = DistributedMutex(other, path)  # another client: its key waits in etcd
    causes: list[object] = []
    states: list[ConnectionState] = []
    holder.add_lock_lost_listener(causes.append)
    holder.add_connection_state_listener(lambda new, old: states.append(new))
    reached_end = False
    stale: LockHold | None = None
    successor_task: asyncio.Task[bool] | None = None
    with pytest.raises(LockLostError):
        async with holder.with_lock() as hold:
            stale = hold
            successor_task = asyncio.create_task(successor.acquire())
            await queued(etcd_client, path + "/", 2)
            await etcd_client.lease_revoke(hold.lease_id)
            await asyncio.sleep(10)
            reached_end = True
    assert not reached_end and stale is not None and stale.is_lost
    assert successor_task is not None and await asyncio.wait_for(successor_task, 5)
    await eventually(lambda: len(causes) == 1, what="one lock-lost notification")
    assert holder.connection_state is ConnectionState.LOST and ConnectionState.LOST in states
    assert any(isinstance(e.exception, LockLostError) for e in holder.exceptions)
    # The old holder's fenced write is rejected by etcd; the successor's commits.
    assert not (await stale.guarded_txn([Op.put(data, b"old")])).succeeded
    assert (await successor.guarded_txn([Op.put(data, b"new")])).succeeded
    await asyncio.sleep(0.2)
    assert len(causes) == 1  # once
    await successor.release()
    # The instance recovers with a new lease (the revoked one is never reused).
    assert await holder.acquire(timeout=2)
    assert holder.hold.lease_id != stale.lease_id and holder.fencing_token > stale.fencing_token
    assert await holder.release() is True
    await holder.aclose()
    await successor.aclose()


async def test_loss_in_the_split_form_makes_release_return_false(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    assert await mutex.acquire()
    await etcd_client.delete(f"{path}/{mutex.hold.lease_id:x}")  # deleted out of band
    await eventually(lambda: not mutex.is_held, what="the loss to be noticed")
    with pytest.raises(LockLostError):
        await mutex.acquire()  # re-entering a lost hold is refused
    assert await mutex.release() is False
    # The instance is usable again (same lease: only the key was deleted).
    assert await mutex.acquire(timeout=2)
    assert await mutex.release() is True
    await mutex.aclose()


async def test_waiter_whose_key_vanishes_never_claims_it(etcd_client, etcd_prefix, rivals):
    """The Jepsen etcd 3.4.3 bug: after waking, re-check that the waiter's own key exists."""
    path = etcd_prefix + "m"
    holder, waiter, third = (DistributedMutex(c, path) for c in (etcd_client, *await rivals(2)))
    await holder.acquire()
    w_task = asyncio.create_task(waiter.acquire())
    (_, w_key) = await queued(etcd_client, path + "/", 2)
    t_task = asyncio.create_task(third.acquire())
    await queued(etcd_client, path + "/", 3)
    original = (await etcd_client.get(w_key)).create_revision
    await etcd_client.delete(w_key)  # the waiter's key vanishes while it waits
    await holder.release()
    # The third waiter (queued behind the vanished key) gets the lock first ...
    assert await asyncio.wait_for(t_task, 5)
    assert not w_task.done()
    await third.release()
    # ... and the waiter, queued again at the tail, gets it afterwards with a new key.
    assert await asyncio.wait_for(w_task, 5)
    assert waiter.fencing_token > original
    assert any("disappeared" in str(e.exception) for e in waiter.exceptions)
    await waiter.release()
    for m in (holder, waiter, third):
        await m.aclose()


async def test_aclose_releases_holds_and_aborts_waiters(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    holder, waiter = DistributedMutex(etcd_client, path), DistributedMutex(etcd_client, path)
    await holder.acquire()
    w_task = asyncio.create_task(waiter.acquire())
    # Parked on the local line (one client): it has no key in etcd.
    await eventually(lambda: "acquiring" in repr(waiter), what="the waiter parked")
    assert len(await keys(etcd_client, path + "/")) == 1
    await waiter.aclose()
    with pytest.raises(RecipeClosedError):
        await w_task
    await holder.aclose()
    assert await holder.release() is False  # released by aclose()
    assert await keys(etcd_client, path + "/") == []


async def test_aclose_cancels_a_running_body(etcd_client, etcd_prefix):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m")
    inside = asyncio.Event()
    finished = False

    async def body() -> None:
        nonlocal finished
        async with mutex:
            inside.set()
            await asyncio.sleep(10)
            finished = True

    task = asyncio.create_task(body())
    await inside.wait()
    await mutex.aclose()  # the lock is released: the body must not go on believing it holds it
    with pytest.raises(LockLostError):
        await asyncio.wait_for(task, 5)
    assert not finished
    assert await keys(etcd_client, etcd_prefix + "m/") == []


async def test_sibling_paths_do_not_interfere(etcd_client, etcd_prefix):
    a = DistributedMutex(etcd_client, etcd_prefix + "a")
    ab = DistributedMutex(etcd_client, etcd_prefix + "ab")
    async with a, ab:
        assert a.is_held and ab.is_held
    await a.aclose()
    await ab.aclose()


async def test_bad_arguments(etcd_client, etcd_prefix):
    with pytest.raises(ValueError):
        DistributedMutex(etcd_client, "")
    with pytest.raises(ValueError):
        DistributedMutex(etcd_client, etcd_prefix + "m", lease_ttl=0)
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m")
    for bad in (-1, True, False, float("nan")):  # 0 is "try once" (test_try_once.py)
        with pytest.raises(ValueError):
            await mutex.acquire(timeout=bad)
    await mutex.aclose()


async def test_lock_lost_events_yield_each_loss_in_order(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    losses = mutex.lock_lost_events()
    causes: list[object] = []
    mutex.add_lock_lost_listener(causes.append)
    # First loss: the lease is revoked out of band.
    assert await mutex.acquire()
    await etcd_client.lease_revoke(mutex.hold.lease_id)
    [first] = await take(losses, 1)
    assert await mutex.release() is False
    # Second loss: the key is deleted out of band (the lease lives on).
    assert await mutex.acquire(timeout=5)
    await etcd_client.delete(f"{path}/{mutex.hold.lease_id:x}")
    [second] = await take(losses, 1)
    assert await mutex.release() is False
    await eventually(lambda: len(causes) == 2, what="the listeners")
    assert [first, second] == causes  # what the listeners get, in the same order
    assert isinstance(first, BaseException) and first is not second
    assert isinstance(second, LockLostError) and "deleted" in str(second)
    # A consumer that breaks out (or is cancelled) unregisters its stream.
    broke = asyncio.create_task(first_item_then_break(mutex.lock_lost_events()))
    cancelled = asyncio.create_task(first_item_then_break(mutex.lock_lost_events()))
    await eventually(lambda: mutex._lost_events.stream_count == 3, what="registered")
    assert await mutex.acquire(timeout=5)
    await etcd_client.lease_revoke(mutex.hold.lease_id)
    assert await asyncio.wait_for(broke, 10) is not None
    cancelled.cancel()
    await asyncio.wait({cancelled})
    del broke, cancelled
    gc.collect()
    assert mutex._lost_events.stream_count == 1
    assert await mutex.release() is False
    # aclose() ends the iteration after the buffered loss; nothing is left in etcd.
    await mutex.aclose()
    assert len([cause async for cause in losses]) == 1
    assert mutex._lost_events.stream_count == 0
    assert await keys(etcd_client, path + "/") == []
