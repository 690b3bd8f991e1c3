"""Recipe waits cancelled from anyio (issue 32, item 17): ``anyio.fail_after``,
``anyio.move_on_after`` and a task group's cancel scope, each mid-wait; then etcd is read to
prove the wait left nothing behind -- no waiter key, no claim, no consumed item -- and the
caller's own cancellation came out unchanged (``TimeoutError`` from ``fail_after``, nothing
from ``move_on_after`` and the task group)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import pytest

from etcd_recipes import (
    DistributedDoubleBarrier,
    DistributedMutex,
    DistributedQueue,
    DistributedSemaphore,
    DistributedWorkQueue,
)

WAIT = 0.4  # the wait is cancelled this long after it started (parked by then)


async def _cancel_mid_wait(kind: str, wait: Callable[[], Awaitable[object]]) -> None:
    if kind == "fail_after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(WAIT):
                await wait()
    elif kind == "move_on_after":
        with anyio.move_on_after(WAIT) as scope:
            await wait()
        assert scope.cancelled_caught
    else:
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                await wait()
                raise AssertionError("the wait returned instead of being cancelled")

            tg.start_soon(waiter)
            await anyio.sleep(WAIT)
            tg.cancel_scope.cancel()


KINDS = ["fail_after", "move_on_after", "task_group"]


async def _keys(client, prefix: str) -> list[bytes]:
    return [kv.key for kv in (await client.get_prefix(prefix)).kvs]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_mutex_waiter(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "m"
    async with DistributedMutex(etcd_client, path):
        held = await _keys(etcd_client, path + "/")
        waiter = DistributedMutex(etcd_client, path)
        await _cancel_mid_wait(kind, waiter.acquire)
        assert await _keys(etcd_client, path + "/") == held  # the holder's key alone
        assert not waiter.is_held
        await waiter.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_semaphore_waiter(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "s"
    async with DistributedSemaphore(etcd_client, path, 1):
        before = await _keys(etcd_client, path + "/")
        waiter = DistributedSemaphore(etcd_client, path, 1)
        await _cancel_mid_wait(kind, waiter.acquire)
        assert await _keys(etcd_client, path + "/") == before
        await waiter.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_parked_dequeue_consumes_nothing(etcd_client, etcd_prefix, kind):
    queue = DistributedQueue(etcd_client, etcd_prefix + "q")
    await _cancel_mid_wait(kind, queue.dequeue)
    await queue.enqueue(b"after")
    assert await queue.poll(timeout=5) == b"after"  # the cancelled wait took nothing
    assert await _keys(etcd_client, etcd_prefix + "q/") == []
    await queue.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_parked_receive_claims_nothing(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "w"
    async with DistributedWorkQueue(etcd_client, path) as queue:
        await _cancel_mid_wait(kind, queue.receive)
        assert [k for k in await _keys(etcd_client, path + "/") if b"/claim" in k] == []
        await queue.enqueue(b"job")
        item = await queue.receive(timeout=5)
        assert item is not None and item.attempt == 1 and await item.ack()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_double_barrier_enter_removes_its_member_key(etcd_client, etcd_prefix, kind):
    path = etcd_prefix + "b"
    barrier = DistributedDoubleBarrier(etcd_client, path, 2)
    await _cancel_mid_wait(kind, barrier.enter)
    await asyncio.sleep(0)  # nothing is left to run in the background
    # The open round's ``enter/ready`` key may stay (the barrier's layout); no member key does.
    left = await _keys(etcd_client, path + "/")
    assert [k for k in left if k != (path + "/enter/ready").encode()] == []
    await barrier.aclose()
