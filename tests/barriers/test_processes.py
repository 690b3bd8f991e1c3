"""Counted barriers across processes: five members in three processes are released
together."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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
def test_barrier_members_across_processes_release_together(etcd_server, etcd_prefix):
    path = etcd_prefix + "barrier"
    procs = [spawn("barrier", etcd_server.url, path, "0", "2", "5")]
    procs.append(spawn("barrier", etcd_server.url, path, "1", "2", "5"))
    time.sleep(1.0)  # the last member comes late: the first four must wait for it
    procs.append(spawn("barrier", etcd_server.url, path, "2", "1", "5"))
    lines = [line for out in finish(procs) for line in out]
    arrived = {line["arrived"]: line["t"] for line in lines if "arrived" in line}
    released = {line["released"]: (line["ok"], line["t"]) for line in lines if "released" in line}
    assert len(arrived) == 5 and set(released) == set(arrived)
    assert all(ok for ok, _ in released.values())
    times = [t for _, t in released.values()]
    assert min(times) >= max(arrived.values())  # nobody left before the fifth arrived
    assert max(times) - min(times) < 0.5  # together
    # The round is over: no ready key, no waiting keys.
    left = etcd_server.etcdctl("get", "--prefix", "--keys-only", path, check=True)
    assert left.stdout.strip() == ""
