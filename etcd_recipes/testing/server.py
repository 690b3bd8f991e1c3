"""A real etcd server process for tests: :class:`EtcdServer`.

The server runs the ``etcd`` binary (see :func:`~etcd_recipes.testing.find_etcd_binary`) on free
loopback ports with a private temporary data directory, waits until it is healthy, and offers
fault injection: :meth:`EtcdServer.kill`, :meth:`~EtcdServer.pause`, :meth:`~EtcdServer.resume`
and :meth:`~EtcdServer.restart` (same ports, same data). Optional TLS, mutual TLS and
username/password auth are set up with generated certificates and the real ``etcdctl``.

Nothing outlives the Python process: every server is reaped by :meth:`EtcdServer.stop`, by a
``weakref.finalize`` when the object is garbage collected, and by the same finalizer at
interpreter exit (``atexit``).

Example::

    from etcd_recipes.testing import EtcdServer

    with EtcdServer() as server:
        print(server.url)               # http://127.0.0.1:41234
        server.etcdctl("put", "k", "v")
        server.kill()
        server.restart()                # same port, same data
        assert server.etcdctl("get", "k", "--print-value-only").stdout == "v\\n"
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from etcd_recipes.errors import (
    AlreadyStartedError,
    InvalidArgumentError,
    NotStartedError,
    UsageError,
)
from etcd_recipes.testing._access import ServerAccess
from etcd_recipes.testing._binary import find_etcd_binary
from etcd_recipes.testing._process import (
    PORT_ATTEMPTS,
    EtcdStartupError,
    PortInUseError,
    ProcessState,
    StartStop,
    duration_flag,
    end_process,
    free_ports,
    new_cluster_token,
    release,
    send_signal,
    start_reaper,
    temp_root,
    wait_stopped,
)
from etcd_recipes.testing.certs import TlsMaterial

__all__ = ["EtcdServer", "EtcdStartupError"]

_LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class _MemberSpec:
    """How an :class:`EtcdServer` joins a cluster (set by :class:`EtcdCluster`, internal)."""

    initial_cluster: str
    token: str
    client_port: int
    peer_port: int
    state: str = "new"  # "existing": a member added to a running cluster


# --------------------------------------------------------------------------- EtcdServer


class EtcdServer(ServerAccess, StartStop):
    """One real etcd process on free loopback ports, for tests.

    Synchronous API; a context manager (``with EtcdServer() as server: ...``) that starts and
    stops it. Options:

    - ``data_dir``: keep the data there (never deleted); default is a private temp dir (on
      ``/dev/shm`` when available) removed by :meth:`stop`.
    - ``tls``: serve clients over HTTPS/TLS with a generated CA (see :attr:`tls`).
    - ``client_cert_auth``: require client certificates (mutual TLS; implies ``tls``).
    - ``auth``: enable etcd auth with user ``root`` / ``root_password`` once started.
    - ``fast_election``: ``--heartbeat-interval 10 --election-timeout 100`` (fast startup and
      fail-over).
    - ``auth_token_ttl``: ``--auth-token-ttl`` in seconds (simple tokens).
    - ``grpc_keepalive_min_time``: seconds; etcd's default of 5 s would make clients with a
      1 s keepalive get ``GOAWAY too_many_pings``.
    - ``extra_args``: more etcd flags, appended last.
    - ``binary``: the etcd executable (default :func:`find_etcd_binary`).

    Not thread-safe for concurrent lifecycle calls from several threads.

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdServer

        with EtcdServer(tls=True, auth=True) as server:
            async with connect(**server.client_kwargs()) as root_client:  # TLS, user root
                await root_client.put(prefix + "k", b"v")
            server.pause()  # frozen: connections stay open, nothing is answered
            assert not server.is_healthy()
            server.resume()
    """

    def __init__(
        self,
        *,
        name: str = "n1",
        data_dir: str | os.PathLike[str] | None = None,
        tls: bool = False,
        client_cert_auth: bool = False,
        auth: bool = False,
        root_password: str = "rootpw",
        fast_election: bool = True,
        auth_token_ttl: int | None = None,
        grpc_keepalive_min_time: float = 0.5,
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        _member: _MemberSpec | None = None,
    ) -> None:
        if not name or any(c in name for c in "=, "):
            raise InvalidArgumentError(f"invalid member name {name!r}")
        if startup_timeout <= 0:
            raise InvalidArgumentError("startup_timeout must be positive")
        if grpc_keepalive_min_time < 0:
            raise InvalidArgumentError("grpc_keepalive_min_time must not be negative")
        if auth_token_ttl is not None and auth_token_ttl <= 0:
            raise InvalidArgumentError("auth_token_ttl must be a positive number of seconds")
        if auth and not root_password:
            raise InvalidArgumentError("root_password must not be empty when auth=True")
        if isinstance(extra_args, str):
            raise InvalidArgumentError("extra_args must be a sequence of strings, not a string")

        self._name = name
        self._user_data_dir = Path(data_dir) if data_dir is not None else None
        self._client_cert_auth = client_cert_auth
        self._use_tls = tls or client_cert_auth
        self._auth = auth
        self._root_password = root_password
        self._fast_election = fast_election
        self._auth_token_ttl = auth_token_ttl
        self._keepalive_min_time = grpc_keepalive_min_time
        self._extra_args = tuple(str(a) for a in extra_args)
        self._binary = os.fspath(binary) if binary is not None else None
        self._startup_timeout = startup_timeout
        self._member = _member

        self._client_port: int | None = _member.client_port if _member else None
        self._peer_port: int | None = _member.peer_port if _member else None
        self._token = _member.token if _member else new_cluster_token()
        self._tls_material: TlsMaterial | None = None
        self._log_path: Path | None = None
        self._log_offset = 0
        self._data_dir: Path | None = self._user_data_dir
        self._started_once = False
        self._auth_enabled = False
        self._closed = False
        self._member_id: int | None = None

        self._state = ProcessState()
        # Safety net: reaps the process and deletes the temp dir when this object is garbage
        # collected or, at the latest, at interpreter exit (finalize registers with atexit).
        self._finalizer = weakref.finalize(self, release, self._state)

    # ------------------------------------------------------------------ context manager

    def _started(self) -> bool:
        return self.is_running

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self._client_port}" if self._client_port else "no port yet"
        state = "stopped" if self._closed else ("running" if self.is_running else "not running")
        return f"<EtcdServer {self._name} {where} {state}>"

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The member name (``--name``), e.g. ``"n1"``."""
        return self._name

    @property
    def peer_url(self) -> str:
        """The peer (raft) URL, always plain HTTP on loopback."""
        if self._peer_port is None:
            raise NotStartedError("the server has no port yet; call start() first")
        return f"http://127.0.0.1:{self._peer_port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running etcd, or ``None`` when it is not running."""
        proc = self._state.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """Whether the etcd process is alive (a paused process counts as running)."""
        return self.pid is not None

    @property
    def is_paused(self) -> bool:
        """Whether the process is stopped with SIGSTOP (see :meth:`pause`)."""
        return self.is_running and self._state.paused

    @property
    def data_dir(self) -> Path:
        """The ``--data-dir`` (known once started, or when passed to the constructor)."""
        if self._data_dir is None:
            raise NotStartedError("the data dir is created by start()")
        return self._data_dir

    @property
    def tls(self) -> TlsMaterial | None:
        """The generated certificates (``None`` without TLS or before the first start)."""
        return self._tls_material

    @property
    def log_path(self) -> Path | None:
        """The file that receives etcd's log (``--log-level warn``), once started."""
        return self._log_path

    @property
    def root_password(self) -> str:
        """The password of user ``root`` when ``auth=True``."""
        return self._root_password

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EtcdServer:
        """Start etcd and wait until it is healthy; return ``self``.

        On the first start free ports are chosen (and chosen again, a few times, if another
        process grabs one first). Later starts (see :meth:`restart`) reuse the ports and data.
        Raises :class:`EtcdStartupError` with the log tail when etcd fails to come up.

        Example::

            from etcd_recipes.testing import EtcdServer

            server = EtcdServer().start()
            try:
                assert server.is_healthy()
            finally:
                server.stop()
        """
        if self._closed:
            raise UsageError("this EtcdServer was stopped; create a new one")
        if self.is_running:
            raise AlreadyStartedError(f"{self!r} is already running")
        first_start = not self._started_once
        fixed_ports = self._member is not None or not first_start
        try:
            attempt = 0
            while True:
                attempt += 1
                try:
                    self._spawn()
                    self._wait_ready(time.monotonic() + self._startup_timeout)
                except PortInUseError as exc:
                    self._end(graceful=False)
                    if fixed_ports or attempt >= PORT_ATTEMPTS:
                        raise EtcdStartupError(str(exc)) from None
                    self._reset_for_new_ports()
                    continue
                break
            self._started_once = True
            self._after_ready()
        except BaseException:
            if first_start:
                self.stop()  # a server that never came up leaves nothing behind
            else:
                self._end(graceful=False)  # keep the data for another restart()
            raise
        return self

    def stop(self) -> None:
        """Stop etcd for good and delete its temp dir (a user-supplied ``data_dir`` is kept).

        Resumes a paused process first, sends SIGTERM, and SIGKILLs it if it does not exit
        within 5 s. Idempotent; the object cannot be started again afterwards.

        Example::

            from etcd_recipes.testing import EtcdServer

            server = EtcdServer().start()
            data_dir = server.data_dir
            server.stop()
            server.stop()  # no-op
            assert not server.is_running and not data_dir.exists()
        """
        self._closed = True
        self._finalizer()

    def kill(self) -> None:
        """SIGKILL the process (a crash); the data dir and ports are kept for :meth:`restart`.

        No-op when it is not running.

        Example::

            from etcd_recipes.testing import EtcdServer

            with EtcdServer() as server:
                server.kill()
                assert not server.is_running
        """
        self._end(graceful=False)

    def pause(self) -> None:
        """Freeze the process with SIGSTOP: connections stay open but nothing is answered.

        Example::

            from etcd_recipes.testing import EtcdServer

            with EtcdServer() as server:
                server.pause()
                assert server.is_paused
                assert server.etcdctl("get", "k", "--command-timeout=300ms").returncode != 0
                server.resume()
        """
        with self._state.lock:
            proc = self._require_process()
            send_signal(proc, signal.SIGSTOP)
            self._state.paused = True
            wait_stopped(proc.pid)

    def resume(self) -> None:
        """Undo :meth:`pause` with SIGCONT. No-op when not paused.

        Example::

            from etcd_recipes.testing import EtcdServer

            with EtcdServer() as server:
                server.pause()
                server.resume()
                assert not server.is_paused
                server.etcdctl("put", "k", "v", check=True)
        """
        with self._state.lock:
            proc = self._state.proc
            if proc is not None and self._state.paused:
                send_signal(proc, signal.SIGCONT)
            self._state.paused = False

    def restart(self) -> EtcdServer:
        """Kill the process if it runs, then start it again on the same ports and data dir.

        Waits until the server is healthy again (for a cluster member that needs a quorum).

        Example::

            from etcd_recipes.testing import EtcdServer

            with EtcdServer() as server:
                server.etcdctl("put", "k", "v", check=True)
                endpoint = server.endpoint
                server.restart()  # same port, same data
                assert server.endpoint == endpoint
                assert server.etcdctl("get", "k", "--print-value-only").stdout == "v\\n"
        """
        if self._closed:
            raise UsageError("this EtcdServer was stopped; create a new one")
        self.kill()
        return self.start()

    # ------------------------------------------------------------------ internals

    def _require_process(self) -> subprocess.Popen[bytes]:
        proc = self._state.proc
        if proc is None or proc.poll() is not None:
            raise NotStartedError(f"{self!r} is not running")
        return proc

    def _end(self, *, graceful: bool) -> None:
        end_process(self._state, graceful=graceful)

    def _prepare(self) -> None:
        """Create the temp dir, log file and certificates (first start only)."""
        state = self._state
        if state.temp_dir is not None:
            return
        temp_dir = tempfile.mkdtemp(prefix="etcd-recipes-", dir=temp_root())
        state.temp_dir = temp_dir
        root = Path(temp_dir)
        if self._user_data_dir is None:
            self._data_dir = root / "data"
        else:
            self._user_data_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = root / "etcd.log"
        state.log = open(self._log_path, "ab")  # noqa: SIM115 - closed by release
        if self._use_tls:
            self._tls_material = TlsMaterial.generate(root / "tls")

    def _reset_for_new_ports(self) -> None:
        self._client_port = self._peer_port = None
        if self._user_data_dir is None and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def _command(self) -> list[str]:
        assert self._client_port is not None
        assert self._peer_port is not None
        assert self._data_dir is not None
        client_url = self.url
        peer_url = self.peer_url
        if self._member is not None:
            initial_cluster = self._member.initial_cluster
        else:
            initial_cluster = f"{self._name}={peer_url}"
        binary = self._binary or find_etcd_binary()
        cmd = [
            binary,
            "--name", self._name,
            "--data-dir", str(self._data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", initial_cluster,
            "--initial-cluster-state", self._member.state if self._member else "new",
            "--initial-cluster-token", self._token,
            "--unsafe-no-fsync",
            "--logger", "zap",
            "--log-level", "warn",
            "--grpc-keepalive-min-time", duration_flag(self._keepalive_min_time),
        ]  # fmt: skip
        if self._fast_election:
            cmd += ["--heartbeat-interval", "10", "--election-timeout", "100"]
        if self._auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(int(self._auth_token_ttl))]
        tls = self._tls_material
        if tls is not None:
            cmd += ["--cert-file", str(tls.server_cert), "--key-file", str(tls.server_key)]
            if self._client_cert_auth:
                # etcd 3.5.1: --trusted-ca-file alone already demands client certificates.
                cmd += ["--trusted-ca-file", str(tls.ca_cert), "--client-cert-auth"]
        cmd += self._extra_args
        return cmd

    def _spawn(self) -> None:
        """Launch the process (does not wait for readiness)."""
        self._prepare()
        if self._client_port is None or self._peer_port is None:
            self._client_port, self._peer_port = free_ports(2)
        cmd = self._command()
        state = self._state
        log = state.log
        assert log is not None
        log.write(f"\n=== etcd-recipes: starting {' '.join(cmd)}\n".encode())
        log.flush()
        self._log_offset = log.tell()
        with state.lock:
            state.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
            state.paused = False
            start_reaper(state.proc.pid, state.temp_dir)

    def _log_tail(self) -> str:
        if self._log_path is None:
            return ""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = text.strip().splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(lines)

    def _check_ready(self, deadline: float) -> bool:
        """One readiness probe: True when healthy; raise on early exit or past the deadline."""
        proc = self._state.proc
        assert proc is not None
        rc = proc.poll()
        if rc is not None:
            tail = self._log_tail()
            if "address already in use" in tail:
                raise PortInUseError(
                    f"etcd {self._name} could not bind {self.endpoint} or "
                    f"{self.peer_url}: address already in use\n{tail}"
                )
            raise EtcdStartupError(
                f"etcd {self._name} exited with status {rc} during startup; "
                f"log tail ({self._log_path}):\n{tail}"
            )
        if self.is_healthy():
            return True
        if time.monotonic() >= deadline:
            raise EtcdStartupError(
                f"etcd {self._name} at {self.url} did not become healthy within "
                f"{self._startup_timeout} s; log tail ({self._log_path}):\n{self._log_tail()}"
            )
        return False

    def _wait_ready(self, deadline: float) -> None:
        """Poll ``/health`` until true; raise on early exit or at the deadline."""
        _wait_all_ready([self], deadline)

    def _after_ready(self) -> None:
        """Enable auth (root user) once; the setting persists in the data dir."""
        if not self._auth or self._auth_enabled:
            return
        status = self.etcdctl("auth", "status", user="")
        if status.returncode == 0 and "Status: true" in status.stdout:
            self._auth_enabled = True
            return
        steps = [
            ("user", "add", "root", f"--new-user-password={self._root_password}"),
            ("auth", "enable"),
        ]
        for step in steps:
            result = self.etcdctl(*step, user="")
            if result.returncode != 0:
                raise EtcdStartupError(
                    f"enabling auth failed: etcdctl {step[0]} {step[1]} exited with "
                    f"{result.returncode}: {result.stderr.strip()}"
                )
        self._auth_enabled = True


def _wait_all_ready(servers: Sequence[EtcdServer], deadline: float) -> None:
    """Probe every server until all are healthy (any early exit is raised at once)."""
    pending = list(servers)
    delay = 0.005
    while pending:
        pending = [s for s in pending if not s._check_ready(deadline)]
        if pending:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
