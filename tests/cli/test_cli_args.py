"""The command line as a newcomer types it (issue 32 items 3, 5, 6, 7, 13): prefixes keep
their trailing slash, ``--count 0`` means one thing, negative values, the global options after
the command, and help pages that read as usage. Each run is a subprocess against real etcd;
what a command writes is read back from etcd."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("typer")

import click
import typer

from etcd_recipes import INT64, DistributedMutex, LeaderLatch, connect
from etcd_recipes.cli import Exit, app

from .proc import one_line_error, run_cli, start_cli
from .schema import assert_valid


async def put_all(endpoint: str, items: dict[str, str]) -> None:
    async with connect(endpoint) as client:
        for key, value in items.items():
            await client.put(key, value)


def test_a_prefix_ending_in_a_slash_is_exactly_that_prefix(etcd_server, etcd_prefix) -> None:
    config, other = f"{etcd_prefix}config/", f"{etcd_prefix}configuration"
    asyncio.run(put_all(etcd_server.endpoint, {f"{config}mode": "blue", other: "x"}))
    ep = ("--endpoints", etcd_server.endpoint)
    proc = run_cli(*ep, "-o", "json", "cache", "dump", config)
    doc = assert_valid(proc.stdout)["data"]
    assert doc["prefix"] == config
    assert [e["key"] for e in doc["entries"]] == [f"{config}mode"]
    # Without the slash it is a key prefix, as etcdctl's --prefix: both keys.
    proc = run_cli(*ep, "-o", "json", "cache", "dump", config.rstrip("/"))
    assert [e["key"] for e in assert_valid(proc.stdout)["data"]["entries"]] == [
        f"{config}mode",
        other,
    ]

    async def lock_ls() -> dict:
        async with connect(etcd_server.endpoint) as client:
            mutex = DistributedMutex(client, f"{other}/lk")
            async with mutex.with_lock():
                proc = await asyncio.to_thread(run_cli, *ep, "-o", "json", "lock", "ls", config)
                bare = await asyncio.to_thread(
                    run_cli, *ep, "-o", "json", "lock", "ls", config.rstrip("/")
                )
            await mutex.aclose()
        one_line_error(proc, Exit.NOT_FOUND)  # /config/ holds no lock: /configuration does
        return assert_valid(bare.stdout)["data"]

    assert asyncio.run(lock_ls())["prefix"] == config.rstrip("/")
    proc = run_cli(*ep, "-o", "json", "cache", "dump", f"{etcd_prefix}nothing/")
    assert "no key under" in one_line_error(proc, Exit.NOT_FOUND)


def test_watch_on_a_slashed_prefix_skips_a_sibling_key(etcd_server, etcd_prefix) -> None:
    watched = f"{etcd_prefix}w/"
    watcher = start_cli("--endpoints", etcd_server.endpoint, "-o", "json", "watch", watched,
                        "--count", "1")  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while watcher.poll() is None:  # until its watch is in place: a sibling, then a child
            asyncio.run(put_all(etcd_server.endpoint, {f"{etcd_prefix}wx": "sibling"}))
            asyncio.run(put_all(etcd_server.endpoint, {f"{watched}in": "child"}))
            assert time.monotonic() < deadline, "the watch never saw the child"
            time.sleep(0.2)
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    [event] = [json.loads(line)["data"] for line in out.splitlines()]
    assert event["key"] == f"{watched}in"


def test_count_zero_means_no_change_for_watch_and_observe(etcd_server, etcd_prefix) -> None:
    ep = ("--endpoints", etcd_server.endpoint)
    # watch --count 0: exits once its watch is in place, printing no event.
    started = time.monotonic()
    proc = run_cli(*ep, "watch", f"{etcd_prefix}z/", "--count", "0", timeout=30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert time.monotonic() - started < 25  # it did not wait for an event that never came

    async def observe() -> tuple[str, int]:
        async with connect(etcd_server.endpoint) as client:
            async with LeaderLatch(client, f"{etcd_prefix}el", client_id="n1") as latch:
                assert await latch.await_leadership(timeout=10)
                proc = await asyncio.to_thread(
                    run_cli, *ep, "election", "observe", f"{etcd_prefix}el", "--count", "0"
                )
                return proc.stdout, latch.fencing_token

    out, token = asyncio.run(observe())
    # election observe --count 0: the leader now (not a change), then exit.
    assert out.splitlines() == [f"elected n1 (fencing token {token})"]
    for command in (["watch", "/x/"], ["election", "observe", "/x"]):
        assert "0:" in run_cli(*command, "--help").stdout  # the help says what 0 means
        proc = run_cli(*ep, *command, "--count", "-1")
        one_line_error(proc, Exit.USAGE)


def test_counter_set_takes_a_negative_value(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}neg"
    proc = run_cli("--endpoints", etcd_server.endpoint, "counter", "set", path, "-5")
    assert (proc.returncode, proc.stdout.strip()) == (0, "-5"), proc.stderr

    async def read() -> int:
        async with connect(etcd_server.endpoint) as client:
            kv = await client.get(path)
            assert kv is not None
            return INT64.decode(kv.value)

    assert asyncio.run(read()) == -5
    one_line_error(run_cli("--endpoints", etcd_server.endpoint, "counter", "set", path, "-x"),
                   Exit.USAGE)  # fmt: skip


def test_global_options_work_after_the_command(etcd_server, etcd_prefix) -> None:
    ns = f"{etcd_prefix}ns"
    proc = run_cli("counter", "set", "/n", "7", "--endpoints", etcd_server.endpoint,
                   "--namespace", ns, "-o", "json")  # fmt: skip
    assert assert_valid(proc.stdout)["data"] == {"path": "/n", "value": 7}

    async def read() -> tuple[bool, int]:
        async with connect(etcd_server.endpoint) as client:
            bare = await client.get("/n")
            kv = await client.get(f"{ns}/n")
            assert kv is not None
            return bare is None, INT64.decode(kv.value)

    assert asyncio.run(read()) == (True, 7)  # written under the namespace, not at /n
    # The namespace given before the command is read the same way; after it, it wins.
    proc = run_cli("--endpoints", etcd_server.endpoint, "--namespace", "/elsewhere",
                   "counter", "get", "/n", "--namespace", ns, "--output", "json")  # fmt: skip
    assert assert_valid(proc.stdout)["data"]["value"] == 7
    proc = run_cli("status", "--output=json", f"--endpoints={etcd_server.endpoint}")
    assert assert_valid(proc.stdout)["command"] == "status"
    # Options after "--" belong to lock run's command, not to etcd-recipes.
    proc = run_cli("lock", "run", f"{etcd_prefix}l", "--endpoints", etcd_server.endpoint,
                   "--", "echo", "-o", "json")  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "-o json\n"), proc.stderr


def _helps() -> dict[str, str]:
    pages = {}

    def walk(command: click.Command, words: list[str]) -> None:
        ctx = click.Context(command, info_name=" ".join(words), terminal_width=80)
        pages[" ".join(words)] = command.get_help(ctx)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), ["etcd-recipes"])
    return pages


def test_help_reads_as_usage() -> None:
    pages = _helps()
    assert len(pages) > 25
    for name, page in pages.items():
        assert "``" not in page, name  # no RST markup
        usage = page.splitlines()[0]
        assert "{" not in usage, usage  # PATH, not {path}
    assert pages["etcd-recipes lock show"].splitlines()[0].endswith("lock show [OPTIONS] PATH")
    assert "PATH -- COMMAND..." in pages["etcd-recipes lock run"].splitlines()[0]
    # The real top-level page, at 80 columns: each command's line ends a sentence or is cut
    # with "...", never wrapped into a line of its own half-way through.
    proc = run_cli("--help", env={"COLUMNS": "80"})
    commands = proc.stdout.split("Commands:")[1].split("\n\n")[0].splitlines()[1:]
    assert all(len(line) <= 80 for line in proc.stdout.splitlines())
    for line in filter(None, commands):
        assert line.startswith("  ") and not line.startswith("   "), line  # no continuation
        assert line.rstrip().endswith((".", "...", ")")), line
    assert "130" in proc.stdout and "127" in proc.stdout  # the exit codes are in the help
