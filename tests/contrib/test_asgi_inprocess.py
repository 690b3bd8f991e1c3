"""etcd_recipes.contrib.asgi in one process: several "workers" are several lifespans, each with
its own client, on one event loop (the real multi-process runs are in test_asgi_uvicorn.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from etcd_recipes import EtcdClient, LeadershipTerm, Op, connect
from etcd_recipes.contrib.asgi import (
    etcd_lifespan,
    leader_only,
    mutex_dependency,
    singleton_schedule,
)
from etcd_recipes.errors import InvalidArgumentError
from tests.helpers import eventually
from tests.queues.helpers import server_leases

pytest.importorskip("starlette")


class _App:
    """What a lifespan needs of an app: a ``state`` namespace."""

    class state:
        pass


def _fenced_writer(prefix: str, worker: str, running: dict[str, int]):
    async def job(client: EtcdClient, term: LeadershipTerm) -> None:
        running[worker] = running.get(worker, 0) + 1
        try:
            while True:
                # Only the current term's writes commit: the log of tokens can only grow.
                await client.txn(
                    [term.compare()],
                    [Op.put(f"{prefix}log/{term.fencing_token:012d}", worker)],
                )
                await asyncio.sleep(0.02)
        finally:
            running[worker] -= 1

    return job


async def test_leader_only_runs_in_one_worker_and_hands_over_on_shutdown(
    etcd_server, etcd_prefix
) -> None:
    running: dict[str, int] = {}
    stacks = {}
    for worker in ("a", "b", "c"):
        lifespan = etcd_lifespan(
            leader_only(_fenced_writer(etcd_prefix, worker, running), election=f"{etcd_prefix}el"),
            endpoints=etcd_server.endpoint,
        )
        stack = contextlib.AsyncExitStack()
        state = await stack.enter_async_context(lifespan(_App()))
        assert isinstance(state["etcd"], EtcdClient)
        stacks[worker] = stack
    async with connect(etcd_server.endpoint) as reader:
        await eventually(lambda: sum(running.values()) == 1, what="one leader running")
        for _ in range(5):  # never two at once
            assert sum(running.values()) == 1, running
            await asyncio.sleep(0.05)
        first = next(w for w, n in running.items() if n)
        await stacks.pop(first).aclose()  # graceful shutdown: steps down at once
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await eventually(
            lambda: sum(running.values()) == 1 and not running[first], what="a new leader"
        )
        assert loop.time() - t0 < 2.0  # well under the 2 s TTL: no lease had to expire
        for stack in stacks.values():
            await stack.aclose()
        log = await reader.get_prefix(f"{etcd_prefix}log/")
        # One key per term (keys sort by fencing token): a term's first write is the key's
        # create revision, its last write its mod revision. Terms never overlap in etcd's order.
        terms = log.kvs
        assert len(terms) >= 2 and terms[0].value.decode() == first
        for older, newer in itertools.pairwise(terms):
            assert older.mod_revision < newer.create_revision, (older, newer)
        left = await reader.get_prefix(f"{etcd_prefix}el")
        assert left.kvs == [], "the election left keys behind"


async def test_singleton_schedule_runs_each_slot_once(etcd_server, etcd_prefix) -> None:
    ran: list[tuple[int, str]] = []

    def job_for(worker: str):
        async def job(client: EtcdClient, slot: int) -> None:
            ran.append((slot, worker))
            await client.put(f"{etcd_prefix}runs/{slot}/{worker}", b"")

        return job

    stacks = []
    for worker in ("a", "b", "c", "d"):
        lifespan = etcd_lifespan(
            singleton_schedule(job_for(worker), every=0.1, path=f"{etcd_prefix}sched"),
            endpoints=etcd_server.endpoint,
        )
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(lifespan(_App()))
        stacks.append(stack)
    await eventually(lambda: len(ran) >= 30, timeout=20, what="30 ticks")
    for stack in stacks:
        await stack.aclose()
    slots = [slot for slot, _ in ran]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    async with connect(etcd_server.endpoint) as reader:
        runs = await reader.get_prefix(f"{etcd_prefix}runs/")
        per_slot: dict[str, int] = {}
        for kv in runs.kvs:
            slot = kv.key.decode().split("/")[-2]
            per_slot[slot] = per_slot.get(slot, 0) + 1
        assert set(per_slot.values()) == {1}
        # Consecutive slots: none skipped while four workers were up (except at the edges).
        ordered = sorted(int(s) for s in per_slot)
        gaps = [b - a for a, b in itertools.pairwise(ordered) if b - a > 1]
        assert len(gaps) <= 2, (ordered, gaps)


async def test_a_slow_run_does_not_block_the_next_slot(etcd_server, etcd_prefix) -> None:
    started: list[int] = []

    async def slow(client: EtcdClient, slot: int) -> None:
        started.append(slot)
        await asyncio.sleep(0.35)  # three and a half intervals

    stacks = []
    for _ in range(2):
        lifespan = etcd_lifespan(
            singleton_schedule(slow, every=0.1, path=f"{etcd_prefix}sched"),
            endpoints=etcd_server.endpoint,
        )
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(lifespan(_App()))
        stacks.append(stack)
    await eventually(lambda: len(started) >= 6, timeout=10, what="six runs")
    for stack in stacks:
        await stack.aclose()
    assert len(started) == len(set(started))


async def test_shutdown_leaves_nothing_in_etcd(etcd_server, etcd_prefix) -> None:
    async def lead(client: EtcdClient, term: LeadershipTerm) -> None:
        await asyncio.Event().wait()

    lifespan = etcd_lifespan(
        leader_only(lead, election=f"{etcd_prefix}el"),
        endpoints=etcd_server.endpoint,
    )
    async with connect(etcd_server.endpoint) as reader:
        before = await server_leases(reader)
        async with lifespan(_App()) as state:
            await eventually(
                lambda: reader.get(f"{etcd_prefix}el/LEADER"), what="the job's leadership"
            )
            assert isinstance(state["etcd"], EtcdClient)
        assert (await reader.get_prefix(f"{etcd_prefix}el")).kvs == []
        after = await server_leases(reader)
        assert after <= before, "a lease was left behind"


def test_bad_arguments_are_rejected_up_front() -> None:
    async def job(client: Any, slot: int) -> None: ...

    with pytest.raises(InvalidArgumentError, match="every"):
        singleton_schedule(job, every=0, path="/x")
    with pytest.raises(InvalidArgumentError, match="every"):
        singleton_schedule(job, every=float("nan"), path="/x")
    with pytest.raises(InvalidArgumentError, match="path"):
        singleton_schedule(job, every=1, path="x")
    with pytest.raises(InvalidArgumentError, match="fn"):
        leader_only("not a function", election="/e")  # type: ignore[arg-type]


async def test_mutex_dependency_answers_423_when_locked(etcd_server, etcd_prefix) -> None:
    from starlette.exceptions import HTTPException

    dependency = mutex_dependency(f"{etcd_prefix}lock", timeout=0.2)
    async with connect(etcd_server.endpoint) as client:

        class Request:
            class state:
                etcd = client

        first = dependency(Request())
        hold = await anext(first)
        assert hold.fencing_token > 0
        second = dependency(Request())
        with pytest.raises(HTTPException) as info:
            await anext(second)
        assert info.value.status_code == 423
        with contextlib.suppress(StopAsyncIteration):
            await anext(first)  # the request ends: released
        third = dependency(Request())
        assert (await anext(third)).fencing_token > hold.fencing_token
        with contextlib.suppress(StopAsyncIteration):
            await anext(third)
        assert (await client.get_prefix(f"{etcd_prefix}lock")).kvs == []
