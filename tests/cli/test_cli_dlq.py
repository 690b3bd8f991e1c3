"""``dlq requeue`` and ``dlq purge`` asked twice, against real etcd and a real work queue: the
second requeue of an id answers "already requeued" and writes nothing (exit 0); an id a consumer
holds (in flight) is reported as claimed, exit 3, never "already requeued"; an id found
nowhere, or a purged one, exits 3; FIFO and priority queues have no dead letters and are
refused (exit 4) without a write."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    EtcdClient,
    connect,
)
from etcd_recipes.cli import Exit, app
from tests.cli.schema import assert_valid

from .proc import one_line_error, run_cli


def cli(server, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


async def revision(client: EtcdClient) -> int:
    return (await client.status()).revision


async def dead_letters(queue: DistributedWorkQueue, *payloads: bytes) -> list[str]:
    """Enqueue ``payloads`` and dead-letter each (a worker giving up), oldest first."""
    ids = [await queue.enqueue(p) for p in payloads]
    for _ in payloads:
        item = await queue.receive(timeout=5)
        assert item is not None
        await item.dead_letter("cannot parse")
    return ids


async def test_a_second_requeue_is_already_requeued_and_writes_nothing(
    etcd_server, etcd_prefix
) -> None:
    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            first, second = await dead_letters(queue, b"one", b"two")
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "dlq", "requeue", path, "--id", first, "--yes"
            )
            assert code == 0
            data = assert_valid(out)["data"]
            assert (data["ids"], data["already_requeued"]) == ([first], [])
            before = await revision(client)
            # The same request again, also without --yes: nothing to do, nothing refused.
            for yes in (["--yes"], []):
                code, out, err = await asyncio.to_thread(
                    cli, etcd_server, "-o", "json", "dlq", "requeue", path, "--id", first, *yes
                )
                assert code == 0, err
                data = assert_valid(out)["data"]
                assert (data["ids"], data["already_requeued"]) == ([], [first])
            assert await revision(client) == before
            # One already requeued and one still dead: the dead one is requeued, once.
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "dlq", "requeue", path, "--id", first, "--id", second, "--yes"
            )
            assert (code, out.strip()) == (
                0,
                f"requeued 1 item(s): {second}; already requeued (back in the queue): {first}",
            )
            # Received again and in flight: claimed by a consumer, not dead and not queued
            # (issue 32 item 11): exit 3, saying so, and still nothing written.
            taken = await queue.receive(timeout=5)
            assert taken is not None and taken.id == first
            before = await revision(client)
            code, out, err = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "dlq", "requeue", path, "--id", first, "--yes"
            )
            assert (code, out) == (Exit.NOT_FOUND, ""), err
            assert "claimed by a consumer (in flight)" in err and "already requeued" not in err
            assert await revision(client) == before
            await taken.ack()
            delivered = [taken.value]
            while (item := await queue.receive(timeout=1)) is not None:
                delivered.append(item.value)
                await item.ack()
            assert delivered == [b"one", b"two"]  # each exactly once, in their original order
            # Acknowledged: found nowhere now, so not found -- and still nothing written.
            before = await revision(client)
            code, _, err = await asyncio.to_thread(
                cli, etcd_server, "dlq", "requeue", path, "--id", first, "--yes"
            )
            assert code == Exit.NOT_FOUND and f"no dead letter {first}" in err
            assert await revision(client) == before


async def test_a_dry_run_of_an_already_requeued_id_writes_nothing(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            [item_id] = await dead_letters(queue, b"job")
            assert await queue.requeue_dead_letter(item_id)
            before = await revision(client)
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "dlq", "requeue", path, "--id", item_id, "--dry-run"
            )
            assert code == 0 and "already requeued" in out and "would requeue 0" in out
            assert await revision(client) == before


async def test_purging_twice_is_not_found_and_a_queued_id_is_named(
    etcd_server, etcd_prefix
) -> None:
    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            [item_id] = await dead_letters(queue, b"job")
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "dlq", "purge", path, "--id", item_id, "--yes"
            )
            assert (code, out.strip()) == (0, f"purged 1 item(s): {item_id}")
            before = await revision(client)
            code, _, err = await asyncio.to_thread(
                cli, etcd_server, "dlq", "purge", path, "--id", item_id, "--yes"
            )
            assert code == Exit.NOT_FOUND and f"no dead letter {item_id}" in err
            queued = await queue.enqueue(b"live")
            after_enqueue = await revision(client)
            code, _, err = await asyncio.to_thread(
                cli, etcd_server, "dlq", "purge", path, "--id", queued, "--yes"
            )
            assert code == Exit.NOT_FOUND and "waiting in the queue, not dead" in err
            assert await revision(client) == after_enqueue > before
            item = await queue.receive(timeout=5)  # the live item is untouched
            assert item is not None and item.value == b"live"
            await item.ack()


@pytest.mark.parametrize("kind", ["fifo", "priority"])
async def test_fifo_and_priority_queues_have_no_dead_letters(
    etcd_server, etcd_prefix, kind
) -> None:
    path = f"{etcd_prefix}{kind}"
    async with connect(etcd_server.endpoint) as client:
        if kind == "fifo":
            await DistributedQueue(client, path).enqueue(b"job")
        else:
            await DistributedPriorityQueue(client, path).enqueue(b"job", 1)
        before = await revision(client)
        for args in (
            ["dlq", "ls", path],
            ["dlq", "show", path, "--id", "x"],
            ["dlq", "requeue", path, "--all", "--yes"],
            ["dlq", "purge", path, "--id", "x", "--yes"],
        ):
            code, out, err = await asyncio.to_thread(cli, etcd_server, *args)
            assert code == Exit.REFUSED, (args, out, err)
            assert f"is a {kind} queue: only a work queue has dead letters" in err
        assert await revision(client) == before
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "-o", "json", "queue", "stats", path
        )
        assert json.loads(out)["data"]["ready"] == 1  # the item is still there


async def test_requeue_of_an_in_flight_id_that_was_never_dead_says_claimed(
    etcd_server, etcd_prefix
) -> None:
    """Issue 32 item 11: as a subprocess, an item a consumer holds and that never died is
    reported as claimed by a consumer (in flight), exit 3 -- not "already requeued" -- and
    nothing is written; the consumer's claim is untouched."""
    path = f"{etcd_prefix}jobs"
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path) as queue:
            item_id = await queue.enqueue(b"live")
            taken = await queue.receive(timeout=5)
            assert taken is not None and taken.id == item_id
            before = await revision(client)
            for extra in ([], ["--dry-run"]):
                proc = await asyncio.to_thread(
                    run_cli, "--endpoints", etcd_server.endpoint, "dlq", "requeue", path,
                    "--id", item_id, "--yes", *extra,
                )  # fmt: skip
                line = one_line_error(proc, Exit.NOT_FOUND)
                assert f"{item_id} in {path} is claimed by a consumer (in flight)" in line
                assert "already requeued" not in line and proc.stdout == ""
            assert await revision(client) == before
            await taken.ack()  # the claim was still the consumer's
            assert await queue.try_receive() is None
