"""``etcd-recipes dev`` as a subprocess, as a user runs it: one member or ``--cluster 3``, it
answers, a signal stops every member and leaves no process behind (checked in ``/proc``), the
data survives a restart unless ``--ephemeral``, and bad input is one line and an exit code."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("typer")

from etcd_recipes import connect
from etcd_recipes.cli import Exit

from .proc import alive
from .schema import assert_valid

pytestmark = pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")


class Dev:
    """A running ``etcd-recipes dev`` and what it printed."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "etcd_recipes.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, start: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(start) for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no {start!r} line: {self.lines} {self.stderr()}")
            time.sleep(0.05)
        return next(line for line in self.lines if line.startswith(start))

    def endpoints(self) -> list[str]:
        return self.wait_for("export ETCDCTL_ENDPOINTS=").split("=", 1)[1].split(",")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(30)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


def etcd_processes(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line mentions ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and "etcd" in cmdline and state != "Z" and "pytest" not in cmdline:
            found.append(int(entry.name))
    return found


async def put_get(endpoints: list[str], key: str, value: str | None) -> tuple[str | None, int]:
    """Write ``key`` (when ``value`` is given) through all endpoints; read it through each."""
    async with connect(endpoints) as client:
        if value is not None:
            await client.put(key, value)
        members = len(await client.member_list())
    seen = set()
    for endpoint in endpoints:
        async with connect(endpoint) as one:
            kv = await one.get(key)
            seen.add(None if kv is None else kv.text)
    [got] = seen
    return got, members


def test_single_member_json_form_answers_and_stops_on_sigint(tmp_path) -> None:
    dev = Dev("-o", "json", "dev", "--port", "0", "--ephemeral", cwd=tmp_path)
    line = dev.wait_for("{")
    data = assert_valid(line)["data"]
    assert data["ephemeral"] and len(data["endpoints"]) == 1 == len(data["pids"])
    assert data["endpoint"] == data["endpoints"][0] and alive(data["pid"])
    assert asyncio.run(put_get(data["endpoints"], "/dev/k", "v")) == ("v", 1)
    assert dev.stop(signal.SIGINT) == 0
    assert not alive(data["pid"])
    assert not Path(data["data_dir"]).exists()  # ephemeral: deleted
    assert "etcd stopped" in dev.stderr()


def test_single_member_data_survives_a_restart(tmp_path) -> None:
    data_dir = tmp_path / "d"
    dev = Dev("dev", "--port", "0", "--data-dir", str(data_dir), cwd=tmp_path)
    assert asyncio.run(put_get(dev.endpoints(), "/dev/kept", "yes")) == ("yes", 1)
    assert dev.stop() == 0
    dev = Dev("dev", "--port", "0", "--data-dir", str(data_dir), cwd=tmp_path)
    assert asyncio.run(put_get(dev.endpoints(), "/dev/kept", None)) == ("yes", 1)
    assert dev.stop() == 0
    assert etcd_processes(str(data_dir)) == []


def test_cluster_of_three_answers_and_sigterm_stops_every_member(tmp_path) -> None:
    dev = Dev("dev", "--cluster", "3", "--ephemeral", "--port", "0", cwd=tmp_path)
    endpoints = dev.endpoints()
    assert len(set(endpoints)) == 3
    member_lines = [ln for ln in dev.lines if ln.startswith("etcd n")]
    assert [ln.split()[1] for ln in member_lines] == ["n1", "n2", "n3"]
    pids = [int(ln.split("(pid ")[1].split(",")[0]) for ln in member_lines]
    data_root = Path(member_lines[0].split("data ")[1].split()[0]).parent
    assert all(alive(pid) for pid in pids)
    assert asyncio.run(put_get(endpoints, "/dev/c", "3")) == ("3", 3)
    assert dev.stop() == 0
    assert [pid for pid in pids if alive(pid)] == []
    assert etcd_processes(str(data_root)) == []
    assert not data_root.exists()


def test_cluster_data_and_ports_survive_a_restart(tmp_path) -> None:
    data_dir = tmp_path / "c"
    args = ("dev", "--cluster", "3", "--port", "0", "--data-dir", str(data_dir))
    dev = Dev(*args, cwd=tmp_path)
    assert asyncio.run(put_get(dev.endpoints(), "/dev/kept", "three")) == ("three", 3)
    assert dev.stop() == 0
    state = json.loads((data_dir / "cluster.json").read_text())
    assert state["size"] == 3 and len(set(state["peer_ports"])) == 3
    dev = Dev(*args, cwd=tmp_path)  # new client ports, the same peers: the cluster re-forms
    assert asyncio.run(put_get(dev.endpoints(), "/dev/kept", None)) == ("three", 3)
    assert dev.stop() == 0
    assert etcd_processes(str(data_dir)) == []
    # The wrong size for that data is refused, not started.
    proc = subprocess.run(
        [sys.executable, "-m", "etcd_recipes.cli", "dev", "--cluster", "5", "--port", "0",
         "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == Exit.ERROR and "--cluster 3" in proc.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--cluster", "0"], Exit.USAGE, "--cluster must be 1..7"),
        (["--port", "70000"], Exit.USAGE, "--port must be"),
        (["--port", "PORT_IN_USE"], Exit.ERROR, "in use"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(tmp_path, args, code, message) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = [port if a == "PORT_IN_USE" else a for a in args]
        proc = subprocess.run(
            [sys.executable, "-m", "etcd_recipes.cli", "dev", "--ephemeral", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "ETCD_RECIPES_CLI_TRACEBACK": ""},
        )
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_second_dev_on_the_same_data_dir_fails_at_once(tmp_path) -> None:
    """Issue 32 item 12: two ``dev --port 0`` in one directory (the default data dir)."""
    data_dir = tmp_path / ".etcd-recipes" / "dev"
    first = Dev("dev", "--port", "0", cwd=tmp_path)
    endpoints = first.endpoints()
    pid = first.proc.pid
    second = subprocess.run(
        [sys.executable, "-m", "etcd_recipes.cli", "dev", "--port", "0"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == Exit.ERROR, second.stderr
    [line] = second.stderr.strip().splitlines()
    assert "in use by another etcd-recipes dev" in line and f"pid {pid}" in line
    assert str(data_dir) in line
    assert asyncio.run(put_get(endpoints, "/dev/first", "still")) == ("still", 1)  # untouched
    assert dev_stop_ok(first)
    # The lock goes with the first: a new dev there starts, with the first one's data.
    again = Dev("dev", "--port", "0", "--data-dir", str(data_dir), cwd=tmp_path)
    assert asyncio.run(put_get(again.endpoints(), "/dev/first", None)) == ("still", 1)
    assert dev_stop_ok(again)
    assert etcd_processes(str(data_dir)) == []


def dev_stop_ok(dev: Dev, sig: int = signal.SIGTERM) -> bool:
    return dev.stop(sig) == 0


def test_a_cluster_of_three_stops_on_sigint(tmp_path) -> None:
    """Followers are stopped together, then the leader, so none waits out a leadership
    transfer to a stopping member; the time is printed, not asserted (a loaded machine)."""
    dev = Dev("dev", "--cluster", "3", "--ephemeral", "--port", "0", cwd=tmp_path)
    endpoints = dev.endpoints()
    assert asyncio.run(put_get(endpoints, "/dev/s", "1")) == ("1", 3)
    member_lines = [ln for ln in dev.lines if ln.startswith("etcd n")]
    pids = [int(ln.split("(pid ")[1].split(",")[0]) for ln in member_lines]
    started = time.monotonic()
    assert dev.stop(signal.SIGINT) == 0  # within stop()'s 30 s: every member stopped
    took = time.monotonic() - started
    assert [pid for pid in pids if alive(pid)] == []
    print(f"dev --cluster 3 stopped on SIGINT in {took:.2f}s")  # reported, not asserted
    [line] = [ln for ln in dev.stderr().splitlines() if ln.startswith("etcd stopped")]
    codes = line.split("exit code ")[1].rstrip(")").split(", ")
    assert len(codes) == 3 and str(-signal.SIGKILL) not in codes, line  # none needed SIGKILL
