"""Process plumbing of the test servers (internal): ports, etcdctl, start/stop, the reaper.

Everything here concerns one OS process and what it owns (a temp dir, a log file): picking free
loopback ports, running ``etcdctl``, signalling and ending the process, and the two safety nets
that make sure nothing outlives the Python process -- :func:`release` (run by a
``weakref.finalize``, which also fires at interpreter exit) and the reaper watchdog (for a
Python process that dies without cleaning up). :class:`~etcd_recipes.testing.EtcdServer`
builds on it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Any, TypeVar

from etcd_recipes.errors import EtcdRecipeError
from etcd_recipes.testing._binary import find_etcdctl_binary

#: How many times a first start is retried with fresh ports after "address already in use".
PORT_ATTEMPTS = 4
STOP_TIMEOUT = 5.0


class EtcdStartupError(EtcdRecipeError, RuntimeError):
    """The etcd process exited or did not become healthy in time.

    The message includes the exit status (if any) and the tail of the server's log.

    Example::

        from etcd_recipes.testing import EtcdServer, EtcdStartupError

        try:
            EtcdServer(extra_args=["--no-such-flag"]).start()
        except EtcdStartupError as exc:
            assert "no-such-flag" in str(exc)  # ... flag provided but not defined: -no-such-flag
        else:
            raise AssertionError("etcd started with an unknown flag")
    """


class PortInUseError(Exception):
    """etcd exited at once because one of its ports was taken."""


# --------------------------------------------------------------------------- ports & paths

_port_lock = threading.Lock()
_handed_out: set[int] = set()


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free loopback ports, never handing out a port twice.

    The ports are found by binding port 0; they are released before etcd binds them, so a race
    with another process is possible (start() detects it and retries).
    """
    with _port_lock:
        sockets: list[socket.socket] = []
        ports: list[int] = []
        try:
            for _ in range(count * 50):
                if len(ports) == count:
                    break
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
                if port not in _handed_out:
                    ports.append(port)
        finally:
            for sock in sockets:
                sock.close()
        if len(ports) != count:  # pragma: no cover - would need an exhausted port range
            raise EtcdStartupError(f"could not find {count} free loopback ports")
        _handed_out.update(ports)
        return ports


def temp_root() -> str | None:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def new_cluster_token() -> str:
    return f"etcd-recipes-{os.getpid()}-{secrets.token_hex(6)}"


def duration_flag(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


# --------------------------------------------------------------------------- etcdctl


def run_etcdctl(
    args: Sequence[str],
    *,
    endpoints: Sequence[str],
    ca_cert: str | None,
    cert: str | None,
    key: str | None,
    user: str | None,
    password: str | None,
    timeout: float,
    input: str | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    cmd = [find_etcdctl_binary(), f"--endpoints={','.join(endpoints)}"]
    if ca_cert:
        cmd.append(f"--cacert={ca_cert}")
    if cert:
        cmd.append(f"--cert={cert}")
    if key:
        cmd.append(f"--key={key}")
    if user:
        cmd.append(f"--user={user}")
        if password is not None:
            cmd.append(f"--password={password}")
    cmd.extend(str(a) for a in args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        input=input,
        check=check,
    )


# --------------------------------------------------------------------------- process state


@dataclass
class ProcessState:
    """Everything a server owns that must be released; shared with its finalizer.

    It never references the :class:`EtcdServer` itself, so the finalizer cannot keep it alive.
    """

    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    temp_dir: str | None = None
    log: IO[bytes] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    owner_pid: int = field(default_factory=os.getpid)


# A watchdog started beside every etcd process: if the Python process that owns the server
# dies without cleaning up (SIGKILL, os._exit, a killed CI job), the watchdog is re-parented
# and kills etcd and deletes its temp dir. It exits on its own when etcd ends normally.
_REAPER = """
import os, shutil, signal, sys, time
owner, child, temp_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
while os.getppid() == owner:
    time.sleep(0.5)
    try:
        os.kill(child, 0)
    except OSError:
        sys.exit(0)
for sig in (signal.SIGCONT, signal.SIGKILL):
    try:
        os.kill(child, sig)
    except OSError:
        pass
if temp_dir:
    time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)
"""


def start_reaper(pid: int, temp_dir: str | None) -> None:
    try:
        subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(os.getpid()), str(pid), temp_dir or ""],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:  # pragma: no cover - a best-effort safety net
        pass


def send_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def end_process(state: ProcessState, *, graceful: bool) -> None:
    """Stop the process (SIGCONT first if paused; SIGTERM then SIGKILL, or SIGKILL at once)."""
    with state.lock:
        proc = state.proc
        if proc is None:
            return
        if proc.poll() is None:
            if graceful:
                if state.paused:
                    send_signal(proc, signal.SIGCONT)
                send_signal(proc, signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                send_signal(proc, signal.SIGKILL)
                proc.wait()
        state.proc = None
        state.paused = False


def release(state: ProcessState) -> None:
    """Finalizer: end the process, close the log, delete the temp dir. Safe to call twice.

    Does nothing in a forked child: the server belongs to the process that started it.
    """
    if os.getpid() != state.owner_pid:
        return
    with state.lock:
        try:
            end_process(state, graceful=True)
        finally:
            if state.log is not None:
                state.log.close()
                state.log = None
            if state.temp_dir is not None:
                shutil.rmtree(state.temp_dir, ignore_errors=True)
                state.temp_dir = None


def wait_stopped(pid: int, timeout: float = 2.0) -> None:
    """SIGSTOP lands asynchronously: wait until every thread of ``pid`` shows state ``T``."""
    deadline = time.monotonic() + timeout
    task_dir = f"/proc/{pid}/task"
    while time.monotonic() < deadline:
        try:
            states = []
            for tid in os.listdir(task_dir):
                with open(f"{task_dir}/{tid}/stat") as fh:
                    states.append(fh.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return  # no /proc (not Linux) or the process is gone: nothing to wait for
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.002)


_S = TypeVar("_S", bound="StartStop")


class StartStop:
    """``with x:`` starts ``x`` unless it runs already, and stops it on the way out -- the
    context-manager half of every test process (servers, clusters, proxies)."""

    def _started(self) -> bool:
        raise NotImplementedError

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: _S) -> _S:
        if not self._started():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
