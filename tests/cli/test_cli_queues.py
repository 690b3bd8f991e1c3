"""The inspection functions behind the queue/semaphore/election commands, against real etcd and
real recipes (the CLI commands themselves are not built yet)."""

from __future__ import annotations

import pytest

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedSemaphore,
    DistributedWorkQueue,
    InvalidArgumentError,
    LeaderLatch,
    connect,
)
from etcd_recipes.election.inspection import leader_record, resign_leader
from etcd_recipes.locks.inspection import semaphore_state
from etcd_recipes.queues.inspection import peek_queue, queue_stats


async def test_queue_stats_and_peek_for_all_three_kinds(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        assert await queue_stats(client, f"{etcd_prefix}none") is None
        fifo = DistributedQueue(client, f"{etcd_prefix}fifo")
        await fifo.enqueue_all([b"a", b"b"])
        stats = await queue_stats(client, f"{etcd_prefix}fifo")
        assert stats is not None and (stats.kind, stats.ready) == ("fifo", 2)
        assert stats.oldest_age is not None and stats.oldest_age >= 0
        peeked = await peek_queue(client, f"{etcd_prefix}fifo")
        assert [e.payload for e in peeked] == [None, None] and [e.size for e in peeked] == [1, 1]
        peeked = await peek_queue(client, f"{etcd_prefix}fifo", payload=True)
        assert [e.payload for e in peeked] == [b"a", b"b"]
        prio = DistributedPriorityQueue(client, f"{etcd_prefix}prio")
        await prio.enqueue(b"late", 9)
        await prio.enqueue(b"first", 1)
        stats = await queue_stats(client, f"{etcd_prefix}prio")
        assert stats is not None and (stats.kind, stats.ready, stats.oldest_age) == (
            "priority",
            2,
            None,
        )
        assert [e.priority for e in await peek_queue(client, f"{etcd_prefix}prio")] == [1, 9]
        async with DistributedWorkQueue(client, f"{etcd_prefix}work") as work:
            await work.enqueue(b"ready")
            await work.enqueue(b"later", delay=60)
            await work.enqueue(b"poison")
            await work.enqueue(b"busy")
            first = await work.receive(timeout=5)
            assert first is not None
            await first.dead_letter("bad")
            held = await work.receive(timeout=5)
            assert held is not None
            stats = await queue_stats(client, f"{etcd_prefix}work")
            assert stats is not None
            assert (stats.kind, stats.ready, stats.delayed, stats.in_flight, stats.dead) == (
                "work",
                1,
                1,
                1,
                1,
            )
            states = [e.state for e in await peek_queue(client, f"{etcd_prefix}work")]
            assert states == ["ready", "delayed"]
        await client.put(f"{etcd_prefix}other/x", b"1")
        with pytest.raises(InvalidArgumentError, match="not a queue"):
            await queue_stats(client, f"{etcd_prefix}other")


async def test_semaphore_state_and_resign_leader(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        path = f"{etcd_prefix}sem"
        assert await semaphore_state(client, path) is None
        a = DistributedSemaphore(client, path, 1)
        b = DistributedSemaphore(client, path, 1)
        assert await a.acquire()
        assert not await b.acquire(timeout=0.2)
        state = await semaphore_state(client, path)
        assert state is not None and state.permits == 1
        assert [h.value for h in state.holders] == [a.client_id.encode()]
        await a.aclose()
        await b.aclose()
        el = f"{etcd_prefix}el"
        async with LeaderLatch(client, el, client_id="node-1") as latch:
            assert await latch.await_leadership(timeout=10)
            record = await leader_record(client, el)
            assert record is not None and record.fencing_token == latch.fencing_token
            assert await resign_leader(client, el, fencing_token=record.fencing_token - 1) is None
            assert await resign_leader(client, el) == record
            again = await leader_record(client, el)
            assert again is None or again.fencing_token > record.fencing_token


def _cli(server, *args: str) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from etcd_recipes.cli import app

    result = CliRunner().invoke(app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


async def test_queue_commands_in_process_and_as_a_subprocess(etcd_server, etcd_prefix) -> None:
    import asyncio
    import subprocess
    import sys

    from tests.cli.schema import assert_valid

    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        await DistributedQueue(client, path).enqueue_all([b"a", b"b"])
        code, out, _ = await asyncio.to_thread(
            _cli, etcd_server, "-o", "json", "queue", "stats", path
        )
        assert code == 0
        assert assert_valid(out)["data"]["ready"] == 2
        code, out, _ = await asyncio.to_thread(
            _cli, etcd_server, "-o", "json", "queue", "peek", path
        )
        items = assert_valid(out)["data"]["items"]
        assert len(items) == 2 and all("payload" not in i for i in items)
        proc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "etcd_recipes.cli",
                "--endpoints",
                etcd_server.endpoint,
                "-o",
                "json",
                "queue",
                "peek",
                path,
                "--payload",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert [i["payload"] for i in assert_valid(proc.stdout)["data"]["items"]] == ["a", "b"]
        code, _, err = await asyncio.to_thread(
            _cli, etcd_server, "queue", "stats", f"{etcd_prefix}x"
        )
        assert code == 3 and "no queue" in err and "Traceback" not in err
        code, _, err = await asyncio.to_thread(_cli, etcd_server, "queue", "stats", "rel")
        assert code == 2


async def test_dlq_show_by_id(etcd_server, etcd_prefix) -> None:
    import asyncio

    from tests.cli.schema import assert_valid

    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            item_id = await queue.enqueue(b"poison")
            item = await queue.receive(timeout=5)
            assert item is not None
            await item.dead_letter("cannot parse")
        code, out, _ = await asyncio.to_thread(
            _cli, etcd_server, "-o", "json", "dlq", "show", path, "--id", item_id
        )
        data = assert_valid(out)["data"]
        assert (data["id"], data["reason"], data["payload"]) == (item_id, "cannot parse", "poison")
        code, _, err = await asyncio.to_thread(
            _cli, etcd_server, "dlq", "show", path, "--id", "nope"
        )
        assert code == 3 and "no dead letter" in err


POPULATE = """
import asyncio, sys
from etcd_recipes import DistributedWorkQueue, connect

async def main(endpoint, path):
    async with connect(endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            await queue.enqueue(b"ready")
            await queue.enqueue(b"later", delay=600)
            await queue.enqueue(b"poison")
            await queue.enqueue(b"busy")
            await (await queue.receive(timeout=5)).dead_letter("bad")
            await queue.receive(timeout=5)
            await client.lease_revoke(queue.lease_id)  # crash: the claim stays in flight

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_work_queue_stats_from_another_process_and_a_closed_port(
    etcd_server, etcd_prefix
) -> None:
    import asyncio
    import subprocess
    import sys

    from tests.cli.schema import assert_valid

    path = f"{etcd_prefix}work"
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", POPULATE, etcd_server.endpoint, path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    code, out, _ = await asyncio.to_thread(_cli, etcd_server, "-o", "json", "queue", "stats", path)
    assert code == 0
    data = assert_valid(out)["data"]
    counts = [data[k] for k in ("kind", "ready", "delayed", "in_flight", "dead", "orphans")]
    assert counts == ["work", 1, 1, 1, 1, 1]
    assert data["oldest_age"] is not None and data["oldest_age"] >= 0
    closed = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "etcd_recipes.cli",
            "--endpoints",
            "127.0.0.1:1",
            "queue",
            "stats",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert closed.returncode == 1
    assert "Traceback" not in closed.stderr
    assert len(closed.stderr.strip().splitlines()) == 1
