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

import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from etcd_recipes.errors import (
    AlreadyStartedError,
    EtcdRecipeError,
    InvalidArgumentError,
    NotStartedError,
    UsageError,
)
from etcd_recipes.testing._binary import find_etcd_binary, find_etcdctl_binary
from etcd_recipes.testing.certs import TlsMaterial

__all__ = [
    "EtcdServer",
    "EtcdStartupError",
    "ExternalEtcdServer",
    "ExternalServerError",
]

#: How many times a first start is retried with fresh ports after "address already in use".
_PORT_ATTEMPTS = 4
_LOG_TAIL_LINES = 30
_STOP_TIMEOUT = 5.0
_HEALTH_PROBE_TIMEOUT = 0.5


class EtcdStartupError(EtcdRecipeError, RuntimeError):
    """The etcd process exited or did not become healthy in time.

    The message includes the exit status (if any) and the tail of the server's log.

    Example::

        try:
            EtcdServer(extra_args=["--no-such-flag"]).start()
        except EtcdStartupError as exc:
            print(exc)  # ... flag provided but not defined: -no-such-flag
    """


class ExternalServerError(UsageError):
    """A process-control method was called on an :class:`ExternalEtcdServer`.

    Example::

        with pytest.raises(ExternalServerError):
            ExternalEtcdServer(["127.0.0.1:2379"]).kill()
    """


class _PortInUseError(Exception):
    """etcd exited at once because one of its ports was taken (internal)."""


# --------------------------------------------------------------------------- ports & paths

_port_lock = threading.Lock()
_handed_out: set[int] = set()


def _free_ports(count: int) -> list[int]:
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


def _temp_root() -> str | None:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def _new_cluster_token() -> str:
    return f"etcd-recipes-{os.getpid()}-{secrets.token_hex(6)}"


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


# --------------------------------------------------------------------------- etcdctl


def _run_etcdctl(
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
class _ProcessState:
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


def _start_reaper(pid: int, temp_dir: str | None) -> None:
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


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def _end_process(state: _ProcessState, *, graceful: bool) -> None:
    """Stop the process (SIGCONT first if paused; SIGTERM then SIGKILL, or SIGKILL at once)."""
    with state.lock:
        proc = state.proc
        if proc is None:
            return
        if proc.poll() is None:
            if graceful:
                if state.paused:
                    _signal(proc, signal.SIGCONT)
                _signal(proc, signal.SIGTERM)
                try:
                    proc.wait(_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait()
        state.proc = None
        state.paused = False


def _release(state: _ProcessState) -> None:
    """Finalizer: end the process, close the log, delete the temp dir. Safe to call twice.

    Does nothing in a forked child: the server belongs to the process that started it.
    """
    if os.getpid() != state.owner_pid:
        return
    with state.lock:
        try:
            _end_process(state, graceful=True)
        finally:
            if state.log is not None:
                state.log.close()
                state.log = None
            if state.temp_dir is not None:
                shutil.rmtree(state.temp_dir, ignore_errors=True)
                state.temp_dir = None


@dataclass(frozen=True)
class _MemberSpec:
    """How an :class:`EtcdServer` joins a cluster (set by :class:`EtcdCluster`, internal)."""

    initial_cluster: str
    token: str
    client_port: int
    peer_port: int


# --------------------------------------------------------------------------- EtcdServer


class EtcdServer:
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

        with EtcdServer(tls=True, auth=True) as server:
            async with connect(**server.client_kwargs()) as client:
                await client.put("/k", b"v")
            server.pause()
            ...
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
        self._token = _member.token if _member else _new_cluster_token()
        self._tls_material: TlsMaterial | None = None
        self._log_path: Path | None = None
        self._log_offset = 0
        self._data_dir: Path | None = self._user_data_dir
        self._started_once = False
        self._auth_enabled = False
        self._closed = False
        self._member_id: int | None = None

        self._state = _ProcessState()
        # Safety net: reaps the process and deletes the temp dir when this object is garbage
        # collected or, at the latest, at interpreter exit (finalize registers with atexit).
        self._finalizer = weakref.finalize(self, _release, self._state)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> EtcdServer:
        if not self.is_running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

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
    def endpoint(self) -> str:
        """``host:port`` of the client URL, without scheme, e.g. ``"127.0.0.1:41234"``.

        Example::

            channel = grpc.insecure_channel(server.endpoint)
        """
        if self._client_port is None:
            raise NotStartedError("the server has no port yet; call start() first")
        return f"127.0.0.1:{self._client_port}"

    @property
    def url(self) -> str:
        """The client URL, ``http://127.0.0.1:PORT`` or ``https://...`` when TLS is on."""
        scheme = "https" if self._use_tls else "http"
        return f"{scheme}://{self.endpoint}"

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

            server = EtcdServer().start()
            try:
                ...
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
                except _PortInUseError as exc:
                    self._end(graceful=False)
                    if fixed_ports or attempt >= _PORT_ATTEMPTS:
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

            server.stop()
            server.stop()  # no-op
        """
        self._closed = True
        self._finalizer()

    def kill(self) -> None:
        """SIGKILL the process (a crash); the data dir and ports are kept for :meth:`restart`.

        No-op when it is not running.

        Example::

            server.kill()
            assert not server.is_running
        """
        self._end(graceful=False)

    def pause(self) -> None:
        """Freeze the process with SIGSTOP: connections stay open but nothing is answered.

        Example::

            server.pause()
            with pytest.raises(grpc.RpcError):
                stub.Range(rpc.RangeRequest(key=b"k"), timeout=0.3)
            server.resume()
        """
        with self._state.lock:
            proc = self._require_process()
            _signal(proc, signal.SIGSTOP)
            self._state.paused = True
            _wait_stopped(proc.pid)

    def resume(self) -> None:
        """Undo :meth:`pause` with SIGCONT. No-op when not paused.

        Example::

            server.resume()
            assert not server.is_paused
        """
        with self._state.lock:
            proc = self._state.proc
            if proc is not None and self._state.paused:
                _signal(proc, signal.SIGCONT)
            self._state.paused = False

    def restart(self) -> EtcdServer:
        """Kill the process if it runs, then start it again on the same ports and data dir.

        Waits until the server is healthy again (for a cluster member that needs a quorum).

        Example::

            server.restart()
            assert server.etcdctl("get", "k").returncode == 0
        """
        if self._closed:
            raise UsageError("this EtcdServer was stopped; create a new one")
        self.kill()
        return self.start()

    # ------------------------------------------------------------------ clients

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.client.connect` to reach this server.

        Example::

            async with connect(**server.client_kwargs()) as client:
                await client.get("/k")
        """
        kwargs: dict[str, Any] = {"endpoints": [self.url]}
        tls = self._tls_material
        if tls is not None:
            kwargs["ca_cert"] = str(tls.ca_cert)
            if self._client_cert_auth:
                kwargs["cert"] = str(tls.client_cert)
                kwargs["key"] = str(tls.client_key)
        if self._auth:
            kwargs["user"] = "root"
            kwargs["password"] = self._root_password
        return kwargs

    def grpc_credentials(self) -> Any:
        """``grpc.ChannelCredentials`` for this server, or ``None`` without TLS.

        Includes the client certificate when ``client_cert_auth`` is on.

        Example::

            creds = server.grpc_credentials()
            channel = (
                grpc.aio.secure_channel(server.endpoint, creds)
                if creds else grpc.aio.insecure_channel(server.endpoint)
            )
        """
        tls = self._tls_material
        if tls is None:
            return None
        import grpc

        if self._client_cert_auth:
            return grpc.ssl_channel_credentials(
                root_certificates=tls.ca_cert.read_bytes(),
                private_key=tls.client_key.read_bytes(),
                certificate_chain=tls.client_cert.read_bytes(),
            )
        return grpc.ssl_channel_credentials(root_certificates=tls.ca_cert.read_bytes())

    def status(self, timeout: float = 2.0) -> Any:
        """Call Maintenance ``Status`` over a short-lived sync gRPC channel.

        Returns the raw ``etcdserverpb.StatusResponse`` (``leader``, ``header.member_id``,
        ``raft_term``, ...). Raises ``grpc.RpcError`` when the server does not answer.

        Example::

            st = server.status()
            is_leader = st.leader == st.header.member_id
        """
        import grpc
        from aetcd import rpc

        creds = self.grpc_credentials()
        channel = (
            grpc.secure_channel(self.endpoint, creds)
            if creds is not None
            else grpc.insecure_channel(self.endpoint)
        )
        try:
            response = rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=timeout)
        finally:
            channel.close()
        self._member_id = int(response.header.member_id)
        return response

    @property
    def member_id(self) -> int:
        """The raft member id (asks the server once, then cached).

        Example::

            assert cluster.leader().member_id == cluster.members[0].status().leader
        """
        if self._member_id is None:
            self.status()
        assert self._member_id is not None
        return self._member_id

    def etcdctl(
        self,
        *args: str,
        timeout: float = 10.0,
        user: str | None = None,
        password: str | None = None,
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real ``etcdctl`` (API v3) against this server and return the result.

        ``--endpoints``, ``--cacert``/``--cert``/``--key`` and, with ``auth=True``,
        ``--user root --password <root_password>`` are added. Pass ``user``/``password`` to
        authenticate as someone else, or ``user=""`` to send no credentials. Output is captured
        as text; ``check=True`` raises ``subprocess.CalledProcessError`` on a non-zero exit.

        Example::

            server.etcdctl("put", "/k", "v", check=True)
            assert server.etcdctl("get", "/k", "--print-value-only").stdout == "v\\n"
        """
        if user is None and self._auth:
            user, password = "root", self._root_password
        tls = self._tls_material
        return _run_etcdctl(
            args,
            endpoints=[self.url],
            ca_cert=str(tls.ca_cert) if tls else None,
            cert=str(tls.client_cert) if tls and self._client_cert_auth else None,
            key=str(tls.client_key) if tls and self._client_cert_auth else None,
            user=user or None,
            password=password,
            timeout=timeout,
            input=input,
            check=check,
        )

    def is_healthy(self, timeout: float = _HEALTH_PROBE_TIMEOUT) -> bool:
        """Whether ``GET /health`` reports ``"true"`` (has a leader and serves reads).

        Example::

            assert server.is_healthy()
        """
        if self._client_port is None or not self.is_running:
            return False
        conn: http.client.HTTPConnection
        if self._use_tls:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self._client_port, timeout=timeout, context=self._ssl_context()
            )
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self._client_port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()
        try:
            return bool(json.loads(body).get("health") == "true")
        except ValueError:
            return False

    # ------------------------------------------------------------------ internals

    def _ssl_context(self) -> ssl.SSLContext:
        tls = self._tls_material
        assert tls is not None
        context = ssl.create_default_context(cafile=str(tls.ca_cert))
        if self._client_cert_auth:
            context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        return context

    def _require_process(self) -> subprocess.Popen[bytes]:
        proc = self._state.proc
        if proc is None or proc.poll() is not None:
            raise NotStartedError(f"{self!r} is not running")
        return proc

    def _end(self, *, graceful: bool) -> None:
        _end_process(self._state, graceful=graceful)

    def _prepare(self) -> None:
        """Create the temp dir, log file and certificates (first start only)."""
        state = self._state
        if state.temp_dir is not None:
            return
        temp_dir = tempfile.mkdtemp(prefix="etcd-recipes-", dir=_temp_root())
        state.temp_dir = temp_dir
        root = Path(temp_dir)
        if self._user_data_dir is None:
            self._data_dir = root / "data"
        else:
            self._user_data_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = root / "etcd.log"
        state.log = open(self._log_path, "ab")  # noqa: SIM115 - closed by _release
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
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._token,
            "--unsafe-no-fsync",
            "--logger", "zap",
            "--log-level", "warn",
            "--grpc-keepalive-min-time", _duration(self._keepalive_min_time),
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
            self._client_port, self._peer_port = _free_ports(2)
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
            _start_reaper(state.proc.pid, state.temp_dir)

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
                raise _PortInUseError(
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


# --------------------------------------------------------------------------- external server


class ExternalEtcdServer:
    """Stands in for :class:`EtcdServer` when tests run against a server they did not start.

    Offers the same ``endpoint``/``url``/``client_kwargs()``/``etcdctl()``; process control
    (``kill``, ``pause``, ``resume``, ``restart``) raises :class:`ExternalServerError`.
    The pytest plugin builds one from ``ETCD_RECIPES_TEST_ENDPOINTS`` (see :meth:`from_env`).

    Example::

        server = ExternalEtcdServer(["https://10.0.0.5:2379"], ca_cert="/etc/ssl/etcd-ca.pem")
        async with connect(**server.client_kwargs()) as client:
            ...
    """

    #: Environment variables read by :meth:`from_env`.
    ENV_ENDPOINTS = "ETCD_RECIPES_TEST_ENDPOINTS"
    ENV_CA_CERT = "ETCD_RECIPES_TEST_CA_CERT"
    ENV_CERT = "ETCD_RECIPES_TEST_CERT"
    ENV_KEY = "ETCD_RECIPES_TEST_KEY"
    ENV_USER = "ETCD_RECIPES_TEST_USER"
    ENV_PASSWORD = "ETCD_RECIPES_TEST_PASSWORD"

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        cleaned = [e.strip() for e in endpoints if e.strip()]
        if not cleaned:
            raise InvalidArgumentError("ExternalEtcdServer needs at least one endpoint")
        scheme = "https" if ca_cert or cert else "http"
        self._urls = [e if "://" in e else f"{scheme}://{e}" for e in cleaned]
        self._ca_cert = ca_cert
        self._cert = cert
        self._key = key
        self._user = user
        self._password = password

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExternalEtcdServer | None:
        """Build one from ``ETCD_RECIPES_TEST_ENDPOINTS`` (comma separated), or return None.

        Optional: ``ETCD_RECIPES_TEST_CA_CERT``, ``..._CERT``, ``..._KEY``, ``..._USER``,
        ``..._PASSWORD``.

        Example::

            server = ExternalEtcdServer.from_env({"ETCD_RECIPES_TEST_ENDPOINTS": "h:2379"})
            assert server is not None and server.endpoint == "h:2379"
        """
        env = os.environ if environ is None else environ
        raw = env.get(cls.ENV_ENDPOINTS, "").strip()
        if not raw:
            return None
        return cls(
            raw.split(","),
            ca_cert=env.get(cls.ENV_CA_CERT) or None,
            cert=env.get(cls.ENV_CERT) or None,
            key=env.get(cls.ENV_KEY) or None,
            user=env.get(cls.ENV_USER) or None,
            password=env.get(cls.ENV_PASSWORD) or None,
        )

    @property
    def urls(self) -> list[str]:
        """All configured endpoint URLs."""
        return list(self._urls)

    @property
    def url(self) -> str:
        """The first endpoint URL."""
        return self._urls[0]

    @property
    def endpoint(self) -> str:
        """The first endpoint as ``host:port`` (no scheme)."""
        return self._urls[0].split("://", 1)[1].rstrip("/")

    @property
    def is_running(self) -> bool:
        """Always ``True``: the external server is assumed to be up."""
        return True

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.client.connect`.

        Example::

            async with connect(**server.client_kwargs()) as client: ...
        """
        kwargs: dict[str, Any] = {"endpoints": list(self._urls)}
        for name, value in (
            ("ca_cert", self._ca_cert),
            ("cert", self._cert),
            ("key", self._key),
            ("user", self._user),
            ("password", self._password),
        ):
            if value is not None:
                kwargs[name] = value
        return kwargs

    def etcdctl(
        self,
        *args: str,
        timeout: float = 10.0,
        user: str | None = None,
        password: str | None = None,
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``etcdctl`` against the external server (same contract as EtcdServer.etcdctl).

        Example::

            server.etcdctl("endpoint", "health", check=True)
        """
        if user is None:
            user, password = self._user, self._password
        return _run_etcdctl(
            args,
            endpoints=self._urls,
            ca_cert=self._ca_cert,
            cert=self._cert,
            key=self._key,
            user=user or None,
            password=password,
            timeout=timeout,
            input=input,
            check=check,
        )

    def _unsupported(self, what: str) -> None:
        raise ExternalServerError(
            f"{what}() is not possible on an external etcd server "
            f"({self.ENV_ENDPOINTS} is set); this test needs a server started by the tests"
        )

    def start(self) -> ExternalEtcdServer:
        """No-op (the server is external); returns ``self``."""
        return self

    def stop(self) -> None:
        """No-op (the server is external)."""

    def kill(self) -> None:
        """Not possible: raises :class:`ExternalServerError`."""
        self._unsupported("kill")

    def pause(self) -> None:
        """Not possible: raises :class:`ExternalServerError`."""
        self._unsupported("pause")

    def resume(self) -> None:
        """Not possible: raises :class:`ExternalServerError`."""
        self._unsupported("resume")

    def restart(self) -> ExternalEtcdServer:
        """Not possible: raises :class:`ExternalServerError`."""
        self._unsupported("restart")
        return self  # pragma: no cover

    def __repr__(self) -> str:
        return f"<ExternalEtcdServer {','.join(self._urls)}>"


def _wait_stopped(pid: int, timeout: float = 2.0) -> None:
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
