"""``lock run`` runs its command in a process group of its own and stops the whole group when
the lock is lost (issue 32 item 4): a grandchild the command started is gone too. A command
that cannot run exits as a shell's would: 127 not found, 126 not executable."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("typer")

from etcd_recipes.cli import Exit

from .proc import alive, one_line_error, run_cli, start_cli


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")
@pytest.mark.parametrize(
    ("trigger", "code", "word"),
    [("lock break", Exit.ERROR, "lock lost"), ("SIGTERM", 143, ""), ("SIGINT", 130, "")],
)
def test_a_loss_or_a_signal_stops_the_commands_grandchildren(
    etcd_server, etcd_prefix, tmp_path, trigger, code, word
) -> None:
    path, pids = f"{etcd_prefix}grand", tmp_path / "pids"
    # sh starts a grandchild (sleep, which ignores nothing) and waits for it; the grandchild
    # ignores SIGTERM, so only the group's SIGKILL after the grace stops it.
    script = f"(trap '' TERM; exec sleep 47) & echo $$ $! > {pids}; wait"
    ep = ("--endpoints", etcd_server.endpoint)
    proc = start_cli(*ep, "lock", "run", path, "--grace", "1", "--", "sh", "-c", script)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or len(pids.read_text().split()) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child, grandchild = map(int, pids.read_text().split())
        assert os.getpgid(grandchild) == os.getpgid(child) == child  # a group of its own
        assert os.getpgid(child) != os.getpgid(0)
        if trigger == "lock break":
            assert run_cli(*ep, "lock", "break", path, "--yes").returncode == 0
        else:  # what a supervisor or a terminal sends the command (not its group)
            proc.send_signal(getattr(signal, trigger))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code and word in err, err
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while alive(grandchild) or alive(child):
        assert time.monotonic() < deadline, "sleep 47 outlived the lock"
        time.sleep(0.05)
    proc = run_cli(*ep, "lock", "ls", path)
    one_line_error(proc, Exit.NOT_FOUND)  # and the lock is free: nothing of it in etcd


@pytest.mark.parametrize(
    ("command", "code", "word"),
    [("/nonexistent/cmd", 127, "command not found"), ("PLAIN_FILE", 126, "permission denied")],
)
def test_a_command_that_cannot_run_exits_as_a_shell_would(
    etcd_server, etcd_prefix, tmp_path, command, code, word
) -> None:
    path, plain = f"{etcd_prefix}cannot", tmp_path / "not-executable"
    plain.write_text("echo never\n")
    plain.chmod(0o644)
    command = str(plain) if command == "PLAIN_FILE" else command
    proc = run_cli("--endpoints", etcd_server.endpoint, "lock", "run", path, "--", command)
    assert word in one_line_error(proc, code)
    proc = run_cli("--endpoints", etcd_server.endpoint, "-o", "json", "lock", "ls", path)
    one_line_error(proc, Exit.NOT_FOUND)  # the lock was released: nothing left in etcd
