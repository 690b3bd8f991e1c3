"""The command as a shell runs it: ``python -m etcd_recipes.cli`` in a subprocess, with the
etcd(ctl) variables of this process scrubbed (only those a test gives are set)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
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


class Running:
    """A started ``etcd-recipes ARGS`` and the stdout lines it printed so far (read by a thread,
    so a test can act -- put a key -- while it waits for a line)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, **popen: Any) -> None:
        self.proc = start_cli(*args, env=env, **popen)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(
        self,
        found: Callable[[list[str]], bool],
        timeout: float = 60,
        act: Callable[[], Any] | None = None,
    ) -> list[str]:
        """Wait until ``found(lines)``, calling ``act()`` between looks (a put to be seen)."""
        deadline = time.monotonic() + timeout
        while not found(self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                _, err = self.proc.communicate(timeout=10)
                raise AssertionError(
                    f"never printed what was awaited: {self.lines} "
                    f"(exit code {self.proc.returncode}, stderr {err!r})"
                )
            if act is not None:
                act()
            time.sleep(0.1)
        return list(self.lines)

    def finish(self, timeout: float = 30) -> tuple[int, list[str], str]:
        """Wait for the end: the exit code, every stdout line and the whole stderr."""
        try:
            code = self.proc.wait(timeout)
        finally:
            self.proc.kill()
        self._reader.join(10)
        assert self.proc.stderr is not None
        return code, list(self.lines), self.proc.stderr.read()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped yet, does not); reads /proc."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
