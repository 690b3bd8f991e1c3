"""Bad input, as a shell sees it: every failure is exactly one line on stderr
(``etcd-recipes: error: ...``), nothing on stdout, no traceback, and the exit code of the
documented table (docs/guide/operations.md, ``etcd_recipes.cli.Exit``): 2 for a bad command
line, 3 for nothing of that kind at the path, 4 for a path holding another recipe's keys, 1 for
an etcd that cannot be reached. Each case is a subprocess against a real etcd holding real
recipes' keys."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("typer")

from etcd_recipes import (
    DistributedAtomicLong,
    DistributedQueue,
    ServiceDiscovery,
    ServiceInstance,
    connect,
)
from etcd_recipes.cli import Exit

from .proc import run_cli

PREFIX = "/t/cli-errors"
# (arguments, exit code, a word the one line must contain)
CASES = [
    # a bad command line
    (["lock", "show", "relative/path"], Exit.USAGE, "starts with '/'"),
    (["lock", "show"], Exit.USAGE, "Missing argument"),
    (["lock", "frobnicate"], Exit.USAGE, "No such command"),
    (["--bogus", "status"], Exit.USAGE, "No such option"),
    (["counter", "set", f"{PREFIX}/n", "forty"], Exit.USAGE, "integer"),
    (["counter", "set", f"{PREFIX}/n", "99999999999999999999"], Exit.USAGE, "int64"),
    (["dlq", "purge", f"{PREFIX}/q"], Exit.USAGE, "--id"),
    (["queue", "stats", f"{PREFIX}/q", "--kind", "stack"], Exit.USAGE, "--kind"),
    (["discovery", "show", f"{PREFIX}/svc", "a/b"], Exit.USAGE, "service name"),
    # an unknown path: nothing of that kind there
    (["lock", "show", f"{PREFIX}/nothing"], Exit.NOT_FOUND, "nobody"),
    (["counter", "get", f"{PREFIX}/nothing"], Exit.NOT_FOUND, "no counter"),
    (["queue", "stats", f"{PREFIX}/nothing"], Exit.NOT_FOUND, "no queue"),
    (["semaphore", "show", f"{PREFIX}/nothing"], Exit.NOT_FOUND, "no semaphore"),
    (["election", "resign", f"{PREFIX}/nothing", "--yes"], Exit.NOT_FOUND, "nobody leads"),
    (["dlq", "show", f"{PREFIX}/nothing", "--id", "x"], Exit.NOT_FOUND, "no dead letter"),
    # a path that is not the recipe asked for
    (["counter", "get", f"{PREFIX}/lock"], Exit.NOT_FOUND, "no counter"),  # a lock's parent
    (["counter", "get", f"{PREFIX}/text"], Exit.REFUSED, "not a counter"),
    (["queue", "stats", f"{PREFIX}/lock"], Exit.REFUSED, "not a queue"),
    (["queue", "peek", f"{PREFIX}/lock"], Exit.REFUSED, "not a queue"),
    (["dlq", "ls", f"{PREFIX}/fifo"], Exit.REFUSED, "only a work queue"),
    (["dlq", "ls", f"{PREFIX}/lock"], Exit.REFUSED, "not a queue"),
    (["discovery", "show", f"{PREFIX}/svc", "orders"], Exit.NOT_FOUND, "not ServiceInstance"),
]


def run(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--endpoints", endpoint, *args)


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int, word: str) -> None:
    where = f"exit {proc.returncode}\nstdout: {proc.stdout!r}\nstderr: {proc.stderr!r}"
    assert proc.returncode == code, where
    assert proc.stdout == "", where
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("etcd-recipes: error: "), where
    assert word in lines[0], where


HOLDER = """
import asyncio, sys
from etcd_recipes import DistributedMutex, connect

async def main(endpoint, path):
    async with connect(endpoint) as client:
        async with DistributedMutex(client, path).with_lock():
            print("held", flush=True)
            await asyncio.sleep(600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.fixture(scope="module")
def populated(etcd_server):
    """A lock held by another process, a counter's neighbour that is plain text, a FIFO queue
    and a discovery base whose only record is not a ServiceInstance -- written by the recipes."""
    import asyncio

    async def populate() -> None:
        async with connect(etcd_server.endpoint) as client:
            await client.delete(PREFIX + "/", prefix=True)
            await client.put(f"{PREFIX}/text", "hello")
            await DistributedAtomicLong(client, f"{PREFIX}/n").add(1)
            await DistributedQueue(client, f"{PREFIX}/fifo").enqueue(b"job")
            async with ServiceDiscovery(client, f"{PREFIX}/svc") as discovery:
                good = ServiceInstance("orders", "", address="10.0.0.7", port=1)
                key = discovery.registry.key_of(good)
            await client.put(key, b"not json")  # the layout's key, no ServiceInstance in it

    asyncio.run(populate())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, etcd_server.endpoint, f"{PREFIX}/lock"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield etcd_server
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.parametrize(("args", "code", "word"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_and_the_documented_code(populated, args, code, word) -> None:
    assert_one_line(run(populated.endpoint, *args), code, word)


def test_a_closed_port_is_one_line_and_exit_1() -> None:
    assert_one_line(run("127.0.0.1:1", "lock", "show", "/x"), Exit.ERROR, "cannot reach etcd")


def test_library_warnings_stay_off_stderr_unless_asked_for(populated) -> None:
    # The skipped record is counted in the command's own one line (nothing else there: exit
    # 3), not logged ...
    proc = run(populated.endpoint, "discovery", "ls", f"{PREFIX}/svc")
    assert_one_line(proc, Exit.NOT_FOUND, "1 record(s) that are not ServiceInstance JSON")
    # ... and $ETCD_RECIPES_CLI_LOG shows the library's own record of it.
    argv = ["--endpoints", populated.endpoint, "discovery", "ls", f"{PREFIX}/svc"]
    logged = run_cli(*argv, env={"ETCD_RECIPES_CLI_LOG": "warning"})
    assert logged.returncode == Exit.NOT_FOUND and "not a ServiceInstance record" in logged.stderr
