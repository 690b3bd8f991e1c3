"""Ctrl-C in a blocking call: the coroutine is cancelled, its cleanup finishes, then the
``KeyboardInterrupt`` reaches the caller; the process exits with nothing on stderr."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from etcd_recipes.sync import connect

HELPER = Path(__file__).with_name("interrupt_helper.py")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")


def run_helper(scenario: str, etcd_server: Any, prefix: str, *, interrupt: bool) -> dict[str, Any]:
    """Run the helper; send SIGINT once it blocks. Returns its evidence (and checks hygiene).

    ``-W default`` shows every warning category (ResourceWarning included); ``-X dev`` is not
    used because its asyncio debug mode logs timing-dependent "slow callback" notes.
    """
    proc = subprocess.Popen(
        [sys.executable, "-W", "default", str(HELPER), scenario, etcd_server.url, prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if interrupt:
            line = proc.stdout.readline()
            assert line == "ready\n", line + (proc.stderr.read() if proc.stderr else "")
            time.sleep(0.3)  # let it block in the facade call
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
    lines = out.splitlines()
    assert err == "", err  # no warnings, no traceback, nothing
    assert lines[-1].startswith("exited"), out
    if interrupt:
        assert proc.returncode == 130
        assert time.monotonic() - sent < 15
    else:
        assert proc.returncode == 0
    evidence: dict[str, Any] = json.loads(lines[-2])
    assert evidence["scenario"] == scenario
    return evidence


def test_interrupted_hook_is_cleaned_up_before_the_interrupt(
    etcd_server: Any, etcd_prefix: str
) -> None:
    facts = run_helper("establish", etcd_server, etcd_prefix, interrupt=True)
    # Read inside the KeyboardInterrupt handler: the lease was already revoked.
    assert facts["key_present"] is False
    assert facts["lease_ttl"] == -1
    assert facts["waited"] >= 0.9  # it waited for the hook, then for the revoke
    with connect(**etcd_server.client_kwargs()) as client:
        assert client.get(etcd_prefix + "establish") is None


def test_interrupted_barrier_wait(etcd_server: Any, etcd_prefix: str) -> None:
    facts = run_helper("barrier", etcd_server, etcd_prefix, interrupt=True)
    assert facts["watchers_after"] == facts["watchers_before"]  # the wait's watch is gone
    assert facts["barrier_set"] is True  # the interrupt did not tear down unrelated state
    assert facts["client_open"] is True
    with connect(**etcd_server.client_kwargs()) as client:
        assert client.get(etcd_prefix + "gate") is None  # leaving the with blocks removed it


def test_interrupted_lease_wait(etcd_server: Any, etcd_prefix: str) -> None:
    facts = run_helper("lease", etcd_server, etcd_prefix, interrupt=True)
    assert facts["lost"] is False
    with connect(**etcd_server.client_kwargs()) as client:
        assert client.lease_time_to_live(facts["lease_id"]).ttl == -1  # revoked on the way out
        assert client.get(etcd_prefix + "leased") is None


def test_interrupted_watch_iteration(etcd_server: Any, etcd_prefix: str) -> None:
    facts = run_helper("watch", etcd_server, etcd_prefix, interrupt=True)
    assert facts["watchers_during"] == facts["watchers_before"] + 1
    assert facts["watchers_after_close"] == facts["watchers_before"]


def test_timeout_bound_call_in_a_process(etcd_server: Any, etcd_prefix: str) -> None:
    facts = run_helper("timeout", etcd_server, etcd_prefix, interrupt=False)
    assert 0.45 < facts["waited"] < 5
    assert facts["watchers_after"] == facts["watchers_before"]


def test_interrupted_cache_iteration(etcd_server: Any, etcd_prefix: str) -> None:
    facts = run_helper("cache", etcd_server, etcd_prefix, interrupt=True)
    assert facts["closed"] is True
    assert facts["watchers_after"] == facts["watchers_before"]  # the cache's watch is gone
