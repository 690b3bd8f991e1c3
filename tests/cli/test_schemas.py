"""Every command's ``-o json`` document validates against its published schema
(etcd_recipes/cli/schemas), run against real recipes on a real etcd; every schema file is a
valid JSON Schema and belongs to a command; every command that prints JSON has a schema."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

pytest.importorskip("typer")

import typer
from typer.testing import CliRunner

from etcd_recipes import (
    DistributedAtomicLong,
    DistributedBarrier,
    DistributedMutex,
    DistributedWorkQueue,
    LeaderLatch,
    WorkQueueConfig,
    connect,
)
from etcd_recipes.cli import app, schemas

from .schema import assert_valid

runner = CliRunner()
NO_JSON = {"lock run"}  # runs a child command: its output and exit code are the child's


def command_paths() -> set[str]:
    """Every leaf command of the app, as words (``"dlq ls"``)."""
    found: set[str] = set()

    def walk(command: object, words: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            found.add(" ".join(words))
            return
        for name, sub in subcommands.items():
            walk(sub, (*words, name))

    walk(typer.main.get_command(app), ())
    return found


def test_every_schema_is_valid_and_names_a_command() -> None:
    commands = command_paths()
    assert schemas.names(), "no schema files found"
    for name in schemas.names():
        schema = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert name in commands, f"schema {name!r} belongs to no command"
        assert schema["properties"]["command"] == {"const": name}
        assert schema["properties"]["schema"] == {"const": "etcd-recipes/cli/v1"}
        assert set(schema["required"]) >= {"schema", "command", "data"}


def test_every_command_printing_json_has_a_schema() -> None:
    missing = command_paths() - NO_JSON - set(schemas.names())
    assert missing == set()


def test_a_document_breaking_its_schema_is_rejected() -> None:
    good = {"schema": "etcd-recipes/cli/v1", "command": "counter get", "data": {"path": "/n"}}
    good["data"]["value"] = 1
    assert_valid(json.dumps(good))
    for bad in (
        {**good, "schema": "etcd-recipes/cli/v0"},
        {**good, "data": {"path": "/n", "value": "1"}},
        {**good, "data": {"path": "/n"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            assert_valid(json.dumps(bad))


def cli_json(server, *args: str) -> list[dict]:
    """Run ``-o json ARGS``; every stdout line validated against its command's schema."""
    result = runner.invoke(app, ["--endpoints", server.endpoint, "-o", "json", *args])
    assert result.exit_code == 0, result.output
    docs = [assert_valid(line) for line in result.stdout.splitlines()]
    assert docs, f"{args}: no document"
    assert {d["command"] for d in docs} == {" ".join(a for a in args[:2] if a[0] != "/")}
    return [d["data"] for d in docs]


async def run_json(server, *args: str) -> list[dict]:
    return await asyncio.to_thread(cli_json, server, *args)


async def test_status_lock_and_election_documents(etcd_server, etcd_prefix) -> None:
    [status] = await run_json(etcd_server, "status")
    assert status["members"][0]["role"] == "leader"
    path = f"{etcd_prefix}lk"
    async with connect(etcd_server.endpoint) as client, connect(etcd_server.endpoint) as other:
        # Two clients: two keys in etcd (one client's mutexes wait locally behind one key).
        holder, waiter = DistributedMutex(client, path), DistributedMutex(other, path)
        assert await holder.acquire()
        waiting = asyncio.create_task(waiter.acquire())
        while await client.count(path + "/") < 2:
            await asyncio.sleep(0.05)
        [show] = await run_json(etcd_server, "lock", "show", path)
        assert show["holder"]["fencing_token"] == holder.fencing_token
        assert len(show["waiters"]) == 1
        [ls] = await run_json(etcd_server, "lock", "ls", etcd_prefix)
        assert ls["locks"][0]["contenders"] == 2
        [broke] = await run_json(etcd_server, "lock", "break", path, "--yes")
        assert broke["holder"]["key"] == show["holder"]["key"]
        assert await asyncio.wait_for(waiting, 10)
        await waiter.release()
        await holder.aclose()
        await waiter.aclose()
        async with LeaderLatch(client, f"{etcd_prefix}el", client_id="node-1") as latch:
            assert await latch.await_leadership(timeout=10)
            [election] = await run_json(etcd_server, "election", "show", f"{etcd_prefix}el")
            assert election["leader"] == "node-1"
            observed = await run_json(
                etcd_server, "election", "observe", f"{etcd_prefix}el", "--count", "0"
            )
            assert observed == [{"leader": "node-1", "fencing_token": latch.fencing_token}]


async def test_counter_barrier_dlq_and_watch_documents(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        counter = DistributedAtomicLong(client, f"{etcd_prefix}n")
        await counter.add(5)
        assert await run_json(etcd_server, "counter", "get", f"{etcd_prefix}n") == [
            {"path": f"{etcd_prefix}n", "value": 5}
        ]
        [done] = await run_json(etcd_server, "counter", "set", f"{etcd_prefix}n", "--", "-1")
        assert done["value"] == -1 == await counter.get()
        await counter.aclose()
        barrier = DistributedBarrier(client, f"{etcd_prefix}gate")
        assert await barrier.set_barrier()
        [gate] = await run_json(etcd_server, "barrier", "status", f"{etcd_prefix}gate")
        assert gate["set"] is True
        await barrier.aclose()

        path = f"{etcd_prefix}jobs"
        config = WorkQueueConfig(visibility_timeout=1, max_deliveries=1)
        async with DistributedWorkQueue(client, path, config) as queue:
            for value in (b"a", b"b"):
                await queue.enqueue(value)
                await queue.receive()
            await client.lease_revoke(queue.lease_id)
        other = DistributedWorkQueue(client, path, config)
        assert await other.try_receive() is None
        [listing] = await run_json(etcd_server, "dlq", "ls", path)
        first, second = (d["id"] for d in listing["dead_letters"])
        [dry] = await run_json(etcd_server, "dlq", "purge", path, "--all", "--dry-run")
        assert dry == {"path": path, "ids": [first, second], "dry_run": True}
        [requeued] = await run_json(etcd_server, "dlq", "requeue", path, "--id", first, "--yes")
        assert requeued["ids"] == [first]
        [purged] = await run_json(etcd_server, "dlq", "purge", path, "--id", second, "--yes")
        assert purged["ids"] == [second] and await other.dead_letters() == []
        await other.aclose()

        watching = asyncio.create_task(
            run_json(etcd_server, "watch", f"{etcd_prefix}w/", "--count", "2")
        )
        await asyncio.sleep(1.0)
        await client.put(f"{etcd_prefix}w/a", "1")
        await client.delete(f"{etcd_prefix}w/a")
        events = await asyncio.wait_for(watching, 20)
        assert [e["event"] for e in events] == ["PUT", "DELETE"]
