"""Elections across processes: terms never overlap and their fencing tokens strictly
increase; a SIGKILLed leader is replaced within its lease TTL."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from etcd_recipes import LeaderObserver
from tests.helpers import eventually

HELPER = Path(__file__).with_name("proc_helper.py")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and clocks")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HELPER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[list[dict[str, Any]]]:
    """Wait for every process; each must exit 0 with nothing on stderr. Returns their lines."""
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        assert err == "", err
        results.append([json.loads(line) for line in out.splitlines()])
    return results


@pytest.mark.slow
def test_terms_never_overlap_across_processes(etcd_server, etcd_prefix):
    """Five candidates in three processes: at any moment at most one believes it leads."""
    path = etcd_prefix + "election"
    procs = [
        spawn("terms", etcd_server.url, path, str(i), str(n), "3") for i, n in enumerate([2, 2, 1])
    ]
    terms = [t for lines in finish(procs) for t in lines]
    assert len(terms) >= 20, terms
    assert len({t["id"].split("-")[0] for t in terms}) >= 2  # several processes led
    terms.sort(key=lambda t: t["start"])
    for before, after in pairwise(terms):
        assert before["end"] <= after["start"], (before, after)  # no overlap
        assert before["token"] < after["token"], (before, after)  # fencing tokens increase


async def _readline(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    assert line, proc.stderr.read() if proc.stderr else "no output"
    return json.loads(line)


@pytest.mark.slow
async def test_killed_leader_is_replaced_within_the_ttl(etcd_client, etcd_server, etcd_prefix):
    path, ttl = etcd_prefix + "election", 2
    procs = {f"n{i}": spawn("latch", etcd_server.url, path, f"n{i}", str(ttl)) for i in range(3)}
    try:
        async with LeaderObserver(etcd_client, path) as observer:
            for proc in procs.values():
                assert "ready" in await _readline(proc)
            await eventually(lambda: observer.current_leader in procs, what="a leader")
            old = observer.current_leader
            old_token = observer.current.fencing_token  # type: ignore[union-attr]
            procs[old].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            await eventually(
                lambda: observer.current_leader not in (None, old),
                timeout=ttl + 5,
                interval=0.01,
                what="a new leader",
            )
            failover = time.monotonic() - killed
            assert failover <= ttl + 2, failover
            assert observer.current.fencing_token > old_token  # type: ignore[union-attr]
            # The dead process's participation key expires too; the survivors' stay.
            await eventually(
                lambda: _participants(etcd_client, path, {n for n in procs if n != old}),
                timeout=ttl + 3,
                what="the dead participant gone",
            )
    finally:
        for proc in procs.values():
            proc.kill()
            proc.communicate(timeout=10)


async def _participants(client: Any, path: str, expected: set[str]) -> bool:
    found = {kv.text for kv in await client.get_prefix(path + "/participants/")}
    return found == expected
