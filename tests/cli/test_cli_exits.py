"""The exit codes a script reads (issue 32 items 8, 9, 10): every read that finds nothing
exits 3 with one line and nothing on stdout (the rule of the operations page's table); Ctrl-C
on ``watch`` and ``election observe`` exits 130 and prints nothing of its own; an endpoint
that refuses or never answers is one short line naming it and the cause, within
``--dial-timeout``. Each run is a subprocess against a real etcd holding real recipes' keys."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import pytest

pytest.importorskip("typer")

from etcd_recipes import DistributedBarrier, DistributedWorkQueue, connect
from etcd_recipes.cli import Exit

from .proc import Running, one_line_error, run_cli


@pytest.fixture(scope="module")
def work_queue(etcd_server):
    """A work queue holding one ready item and no dead letter."""
    prefix = "/t/cli-exits"

    async def fill() -> None:
        async with connect(etcd_server.endpoint) as client:
            await client.delete(prefix + "/", prefix=True)
            async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
                await queue.enqueue(b"job")

    asyncio.run(fill())
    return etcd_server, prefix


NOTHING = [
    (["queue", "stats", "{p}/nothing"], "no queue"),
    (["queue", "peek", "{p}/nothing"], "no queue"),
    (["dlq", "ls", "{p}/nothing"], "no dead letter"),
    (["dlq", "ls", "{p}/jobs"], "no dead letter"),  # a work queue without dead letters
    (["cache", "dump", "{p}/nothing/"], "no key under"),
    (["lock", "ls", "{p}/"], "no lock"),
    (["discovery", "ls", "{p}/nothing"], "no service"),
    (["barrier", "status", "{p}/typo"], "no barrier set"),
    (["semaphore", "show", "{p}/nothing"], "no semaphore"),
    (["counter", "get", "{p}/nothing"], "no counter"),
]


@pytest.mark.parametrize(("args", "word"), NOTHING, ids=[" ".join(a[:2]) for a, _ in NOTHING])
@pytest.mark.parametrize("output", ["table", "json"])
def test_nothing_there_exits_3_in_both_forms(work_queue, args, word, output) -> None:
    server, prefix = work_queue
    argv = [a.replace("{p}", prefix) for a in args]
    proc = run_cli("--endpoints", server.endpoint, "-o", output, *argv)
    line = one_line_error(proc, Exit.NOT_FOUND)
    assert word in line and proc.stdout == ""
    assert "lifted" not in line


async def test_something_there_exits_0(work_queue) -> None:
    server, prefix = work_queue
    ep = ("--endpoints", server.endpoint)
    async with connect(server.endpoint) as client:
        barrier = DistributedBarrier(client, f"{prefix}/gate")
        await barrier.set_barrier()
        proc = await asyncio.to_thread(run_cli, *ep, "barrier", "status", f"{prefix}/gate")
        assert (proc.returncode, proc.stdout) == (0, "set\n")
        await barrier.remove_barrier()
        await barrier.aclose()
    proc = await asyncio.to_thread(run_cli, *ep, "barrier", "status", f"{prefix}/gate")
    assert "lifted" not in one_line_error(proc, Exit.NOT_FOUND)  # not told from a typo
    proc = run_cli(*ep, "-o", "json", "queue", "peek", f"{prefix}/jobs")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["data"]["items"]) == 1


def test_ctrl_c_ends_watch_and_observe_with_130_quietly(etcd_server, etcd_prefix) -> None:
    # A generous dial timeout: the default 2 s is for people; a loaded CI box may need more.
    ep = ("--endpoints", etcd_server.endpoint, "--dial-timeout", "30")
    watch = Running(*ep, "watch", f"{etcd_prefix}w/")
    observe = Running(*ep, "election", "observe", f"{etcd_prefix}el")

    def put() -> None:
        asyncio.run(put_one(etcd_server.endpoint, f"{etcd_prefix}w/k"))

    watch.wait_for(lambda lines: any(ln.startswith(f"PUT {etcd_prefix}w/k @") for ln in lines),
                   act=put)  # fmt: skip
    observe.wait_for(lambda lines: lines == ["vacated"])  # the leader now: nobody
    for running in (watch, observe):
        running.proc.send_signal(signal.SIGINT)
        code, lines, err = running.finish()
        assert code == Exit.INTERRUPTED == 130
        assert err == ""  # no "error: interrupted", no traceback
        assert lines and all(ln.startswith(("PUT ", "vacated")) for ln in lines)


async def put_one(endpoint: str, key: str) -> None:
    async with connect(endpoint) as client:
        await client.put(key, "v")


def test_a_refused_endpoint_is_one_short_line() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    for given in ([], ["--dial-timeout", "60"]):
        started = time.monotonic()
        proc = run_cli("--endpoints", endpoint, "status", *given)
        line = one_line_error(proc, Exit.ERROR)
        assert line == f"etcd-recipes: error: cannot reach etcd at {endpoint}: connection refused"
    # The refusal is immediate, so is the answer: the 60 s dial timeout was not waited out.
    assert time.monotonic() - started < 45


@pytest.mark.parametrize(
    ("given", "seconds"),
    [([], "2.0"), (["--dial-timeout", "0.5"], "0.5"), (["--dial-timeout", "500ms"], "0.5")],
)
def test_a_silent_endpoint_fails_within_the_dial_timeout(given, seconds) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        proc = run_cli("--endpoints", endpoint, *given, "lock", "show", "/x")
    line = one_line_error(proc, Exit.ERROR)
    assert (
        line == f"etcd-recipes: error: cannot reach etcd at {endpoint}: no answer within {seconds}s"
    )


@pytest.mark.parametrize("value", ["x", "0", "-1", "2h"])
def test_a_bad_dial_timeout_is_a_usage_error(value) -> None:
    proc = run_cli("--endpoints", "127.0.0.1:1", "status", "--dial-timeout", value)
    assert "--dial-timeout" in one_line_error(proc, Exit.USAGE)
