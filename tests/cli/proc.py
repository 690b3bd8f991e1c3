"""The command as a shell runs it: ``python -m etcd_recipes.cli`` in a subprocess, with the
etcd(ctl) variables of this process scrubbed (only those a test gives are set)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import Any

CLI = [sys.executable, "-m", "etcd_recipes.cli"]
GRPC_LOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d")
"""A line gRPC's C core may log itself (a failed handshake): not the command's own output."""


def clean_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``ETCD_*``/``ETCDCTL_*`` variable, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
    return {**base, **(env or {})}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    """``etcd-recipes ARGS`` to completion, its output captured."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=clean_env(env)
    )


def start_cli(*args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[str]:
    """``etcd-recipes ARGS`` started, stdout and stderr piped; SIGINT is not ignored in it (a
    shell's background job would ignore it), so a test can send it Ctrl-C."""
    return subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(env),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **popen,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The one ``etcd-recipes: error:`` line of a failed run with exit ``code``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    [line] = [ln for ln in proc.stderr.strip().splitlines() if not GRPC_LOG.match(ln)]
    assert line.startswith("etcd-recipes: error:"), line
    return line
