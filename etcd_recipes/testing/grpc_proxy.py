"""etcd's own gRPC proxy in front of a test server: :class:`EtcdGrpcProxy`.

``etcd grpc-proxy start`` (the same binary as :class:`~etcd_recipes.testing.EtcdServer`, see
:func:`~etcd_recipes.testing.find_etcd_binary`) is a stateless L7 proxy that coalesces watches
and caches serializable reads; clients connect to it as to an etcd member. Watches and reads
behave differently through it: the measured differences are listed in :class:`EtcdGrpcProxy`.

Like :class:`~etcd_recipes.testing.EtcdServer`, nothing outlives the Python process: the proxy
is reaped by :meth:`EtcdGrpcProxy.stop`, by a ``weakref.finalize`` (also at interpreter exit),
and by the reaper watchdog when the owning process dies without cleaning up.

Example::

    from etcd_recipes import connect
    from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

    with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:
        async with connect(**proxy.client_kwargs()) as proxied:
            await proxied.put(prefix + "k", b"v")
            assert (await client.get(prefix + "k")).value == b"v"  # the same etcd
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etcd_recipes.errors import (
    AlreadyStartedError,
    InvalidArgumentError,
    NotStartedError,
    UsageError,
)
from etcd_recipes.testing._binary import etcd_binary_version, find_etcd_binary
from etcd_recipes.testing._process import (
    PORT_ATTEMPTS,
    EtcdStartupError,
    ProcessState,
    StartStop,
    duration_flag,
    end_process,
    free_ports,
    release,
    start_reaper,
    temp_root,
)

if TYPE_CHECKING:
    from etcd_recipes.testing.cluster import EtcdCluster
    from etcd_recipes.testing.external import ExternalEtcdServer
    from etcd_recipes.testing.server import EtcdServer

__all__ = ["EtcdGrpcProxy"]

_LOG_TAIL_LINES = 30
_HEALTH_PROBE_TIMEOUT = 1.5  # the proxy's /health waits up to 1 s for etcd itself
_AUTH_REFUSALS = ("user name is empty", "permission denied")


class EtcdGrpcProxy(StartStop):
    """``etcd grpc-proxy start`` on a free loopback port, in front of ``upstream``, for tests.

    ``upstream`` is an :class:`~etcd_recipes.testing.EtcdServer`, an
    :class:`~etcd_recipes.testing.EtcdCluster` or an
    :class:`~etcd_recipes.testing.ExternalEtcdServer`: the proxy dials its ``client_kwargs()``
    endpoints, over TLS with its CA when it uses TLS. The proxy itself always listens on
    plain HTTP (:attr:`url` is ``http://127.0.0.1:PORT``); with etcd auth the client's token
    passes through, so :meth:`client_kwargs` keeps the user and password. Mutual TLS
    (``client_cert_auth=True``) is not possible: etcd 3.5.1's proxy refuses a client
    certificate with a Common Name, and the harness's generated one has one.

    :meth:`start` waits until the proxy's ``/health`` is true, which means it answers *and*
    reaches etcd. :meth:`kill` crashes it (SIGKILL); :meth:`restart` starts it again on the
    same port. Synchronous API; a context manager that starts and stops it.

    Known differences from a direct connection (etcd 3.5.1, pinned by
    ``tests/testing/test_grpc_proxy.py``):

    - The proxy ignores ``WatchCreateRequest.watch_id`` and numbers each stream's watches
      0, 1, 2... itself. Our client asks for "any id" and matches each "created" reply to
      its oldest waiting create (as Go's client does), so its watches work through it.
    - On the wire, watches are otherwise etcd's: events, ``prev_kv``, prefix watches and a
      replay from a past ``start_revision`` (created at the head revision) are the same.
    - Progress requests (``client.request_progress()``) go unanswered: nothing within 2 s
      (etcd answers within ~1 ms). Watches created with ``progress_notify`` do get etcd's
      periodic notifications, at etcd's ``--experimental-watch-progress-notify-interval``
      (10 minutes by default).
    - Compaction is signalled as by etcd: a watch starting below the compact revision is
      created, then cancelled with ``compact_revision`` set (what the client turns into
      ``CompactedError`` or a ``resync`` call).
    - Killing the proxy fails its watch streams at once with ``UNAVAILABLE``; a new stream
      from the resume revision replays what was written meanwhile.
    - etcd restarting behind a live proxy is hidden: open watch streams get no error and no
      event while etcd is down, and resume on the same stream without a gap once the proxy's
      own client has reconnected (1-3 s after etcd is back, in our runs). Unary calls
      meanwhile wait for their deadline (``DEADLINE_EXCEEDED``, or ``UNKNOWN`` "context
      deadline exceeded", which our client does not retry), never ``UNAVAILABLE``; the
      proxy's ``/health`` is false.
    - Header revisions and member ids are etcd's (linearizable reads, writes, status), but
      **serializable reads are served from the proxy's cache**: after a write that did not
      pass through this proxy they return the old value with the old header revision, and
      they are answered while etcd is down.
    - KV, txn and leases pass through unchanged; so do auth tokens.

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdGrpcProxy, EtcdServer

        with EtcdServer() as server, EtcdGrpcProxy(server) as proxy:
            async with connect(**proxy.client_kwargs()) as proxied:
                await proxied.put(prefix + "k", b"v")
                proxy.restart()  # same port; the client reconnects
                assert (await proxied.get(prefix + "k")).value == b"v"
    """

    def __init__(
        self,
        upstream: EtcdServer | EtcdCluster | ExternalEtcdServer,
        *,
        grpc_keepalive_min_time: float = 0.5,
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        if startup_timeout <= 0:
            raise InvalidArgumentError("startup_timeout must be positive")
        if grpc_keepalive_min_time < 0:
            raise InvalidArgumentError("grpc_keepalive_min_time must not be negative")
        if isinstance(extra_args, str):
            raise InvalidArgumentError("extra_args must be a sequence of strings, not a string")
        self._upstream = upstream
        self._keepalive_min_time = grpc_keepalive_min_time
        self._extra_args = tuple(str(a) for a in extra_args)
        self._binary = os.fspath(binary) if binary is not None else None
        self._startup_timeout = startup_timeout
        self._port: int | None = None
        self._log_path: Path | None = None
        self._log_offset = 0
        self._started_once = False
        self._closed = False
        self._state = ProcessState()
        # Reaps the process and deletes the temp dir on garbage collection or interpreter exit.
        self._finalizer = weakref.finalize(self, release, self._state)

    # ------------------------------------------------------------------ context manager

    def _started(self) -> bool:
        return self.is_running

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self._port}" if self._port else "no port yet"
        state = "stopped" if self._closed else ("running" if self.is_running else "not running")
        return f"<EtcdGrpcProxy {where} -> {','.join(self.upstream_endpoints)} {state}>"

    # ------------------------------------------------------------------ access

    @property
    def upstream(self) -> EtcdServer | EtcdCluster | ExternalEtcdServer:
        """The server (or cluster) behind the proxy."""
        return self._upstream

    @property
    def upstream_endpoints(self) -> list[str]:
        """``host:port`` of every upstream endpoint, as passed to ``--endpoints``."""
        urls = self._upstream.client_kwargs()["endpoints"]
        return [str(u).split("://", 1)[-1].rstrip("/") for u in urls]

    @property
    def endpoint(self) -> str:
        """``host:port`` the proxy listens on, e.g. ``"127.0.0.1:41234"`` (known once started).

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:
                assert proxy.url == f"http://{proxy.endpoint}" and proxy.endpoint != endpoints
        """
        if self._port is None:
            raise NotStartedError("the proxy has no port yet; call start() first")
        return f"127.0.0.1:{self._port}"

    @property
    def endpoints(self) -> list[str]:
        """``[endpoint]``, for code that takes a list like ``EtcdCluster.endpoints``."""
        return [self.endpoint]

    @property
    def url(self) -> str:
        """The client URL, ``http://127.0.0.1:PORT`` (the proxy listens without TLS)."""
        return f"http://{self.endpoint}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.client.connect` to go through the proxy.

        The upstream's user and password are kept (etcd auth works through the proxy); its TLS
        settings are not (the proxy speaks TLS to etcd, plain HTTP to clients).

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            upstream = ExternalEtcdServer([endpoints], user="app", password="pw")
            with EtcdGrpcProxy(upstream) as proxy:
                kwargs = proxy.client_kwargs()
                assert kwargs == {"endpoints": [proxy.url], "user": "app", "password": "pw"}
        """
        kwargs: dict[str, Any] = {"endpoints": [self.url]}
        upstream = self._upstream.client_kwargs()
        for name in ("user", "password"):
            if name in upstream:
                kwargs[name] = upstream[name]
        return kwargs

    @property
    def pid(self) -> int | None:
        """Process id of the running proxy, or ``None`` when it is not running."""
        proc = self._state.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """Whether the proxy process is alive."""
        return self.pid is not None

    @property
    def log_path(self) -> Path | None:
        """The file that receives the proxy's log, once started."""
        return self._log_path

    def is_healthy(self, timeout: float = _HEALTH_PROBE_TIMEOUT) -> bool:
        """Whether the proxy's ``GET /health`` is true: it answers and its etcd serves reads.

        With etcd auth, etcd refusing the proxy's anonymous probe read counts as healthy.

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, EtcdServer

            with EtcdServer() as server, EtcdGrpcProxy(server) as proxy:
                assert proxy.is_healthy()
                server.kill()
                assert not proxy.is_healthy()  # the proxy runs, but etcd is gone
                server.restart()
        """
        if self._port is None or not self.is_running:
            return False
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            body = conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()
        try:
            report = json.loads(body)
        except ValueError:
            return False
        if not isinstance(report, dict):
            return False
        # With etcd auth on, the proxy's probe read carries no credentials: etcd answers it
        # with an auth error, which still proves that the proxy reaches a serving etcd.
        reason = str(report.get("reason", ""))
        return report.get("health") == "true" or any(r in reason for r in _AUTH_REFUSALS)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EtcdGrpcProxy:
        """Start the proxy and wait until its ``/health`` is true; return ``self``.

        The first start picks a free port (again, a few times, if another process takes it
        first); later starts reuse it. Raises
        :class:`~etcd_recipes.testing.EtcdStartupError` with the log tail when the proxy
        exits or does not become healthy in time (e.g. its etcd is down).

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            proxy = EtcdGrpcProxy(ExternalEtcdServer([endpoints])).start()
            try:
                assert proxy.is_healthy()
            finally:
                proxy.stop()
        """
        if self._closed:
            raise UsageError("this EtcdGrpcProxy was stopped; create a new one")
        if self.is_running:
            raise AlreadyStartedError(f"{self!r} is already running")
        first_start = not self._started_once
        try:
            attempt = 0
            while True:
                attempt += 1
                self._spawn()
                try:
                    self._wait_ready(time.monotonic() + self._startup_timeout)
                except _PortTaken as exc:
                    end_process(self._state, graceful=False)
                    if not first_start or attempt >= PORT_ATTEMPTS:
                        raise EtcdStartupError(str(exc)) from None
                    self._port = None
                    continue
                break
            self._started_once = True
        except BaseException:
            if first_start:
                self.stop()
            else:
                end_process(self._state, graceful=False)
            raise
        return self

    def stop(self) -> None:
        """Stop the proxy for good (SIGTERM, then SIGKILL after 5 s) and delete its temp dir.

        Idempotent; the object cannot be started again afterwards.

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            proxy = EtcdGrpcProxy(ExternalEtcdServer([endpoints])).start()
            proxy.stop()
            proxy.stop()  # no-op
            assert not proxy.is_running
        """
        self._closed = True
        self._finalizer()

    def kill(self) -> None:
        """SIGKILL the proxy (a crash); its port is kept for :meth:`restart`. No-op if stopped.

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:
                proxy.kill()
                assert not proxy.is_running and not proxy.is_healthy()
        """
        end_process(self._state, graceful=False)

    def restart(self) -> EtcdGrpcProxy:
        """Kill the proxy if it runs, then start it again on the same port.

        Example::

            from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

            with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:
                endpoint = proxy.endpoint
                proxy.restart()
                assert proxy.endpoint == endpoint and proxy.is_healthy()
        """
        if self._closed:
            raise UsageError("this EtcdGrpcProxy was stopped; create a new one")
        self.kill()
        return self.start()

    # ------------------------------------------------------------------ internals

    def _prepare(self) -> Path:
        state = self._state
        if state.temp_dir is None:
            state.temp_dir = tempfile.mkdtemp(prefix="etcd-recipes-proxy-", dir=temp_root())
            self._log_path = Path(state.temp_dir) / "grpc-proxy.log"
            state.log = open(self._log_path, "ab")  # noqa: SIM115 - closed by release
        return Path(state.temp_dir)

    def _command(self, root: Path) -> list[str]:
        listen = self.endpoint
        binary = self._binary or find_etcd_binary()
        cmd = [
            binary,
            "grpc-proxy", "start",
            f"--endpoints={','.join(self.upstream_endpoints)}",
            f"--listen-addr={listen}",
            # The proxy dials this address for its /proxy/health check; the default
            # (127.0.0.1:23790) could be another test's proxy.
            f"--advertise-client-url={listen}",
            f"--data-dir={root / 'data'}",  # default: ./default.proxy in the working dir
        ]  # fmt: skip
        if etcd_binary_version(binary) >= (3, 5, 0):  # 3.4's proxy has no such flag
            cmd.append(f"--grpc-keepalive-min-time={duration_flag(self._keepalive_min_time)}")
        upstream = self._upstream.client_kwargs()
        if upstream.get("ca_cert"):
            cert, key = upstream.get("cert"), upstream.get("key")
            if not cert:
                cert, key = _throwaway_client_cert(root / "tls")
            cmd += [f"--cacert={upstream['ca_cert']}", f"--cert={cert}", f"--key={key}"]
        cmd += self._extra_args
        return cmd

    def _spawn(self) -> None:
        root = self._prepare()
        if self._port is None:
            (self._port,) = free_ports(1)
        cmd = self._command(root)
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
        return "\n".join(text.strip().splitlines()[-_LOG_TAIL_LINES:])

    def _wait_ready(self, deadline: float) -> None:
        delay = 0.005
        while True:
            proc = self._state.proc
            assert proc is not None
            rc = proc.poll()
            if rc is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    raise _PortTaken(f"grpc-proxy could not bind {self.endpoint}\n{tail}")
                raise EtcdStartupError(
                    f"grpc-proxy exited with status {rc} during startup; "
                    f"log tail ({self._log_path}):\n{tail}"
                )
            if self.is_healthy(timeout=min(_HEALTH_PROBE_TIMEOUT, 0.5)):
                return
            if time.monotonic() >= deadline:
                raise EtcdStartupError(
                    f"grpc-proxy at {self.url} did not become healthy within "
                    f"{self._startup_timeout} s (is {','.join(self.upstream_endpoints)} up?); "
                    f"log tail ({self._log_path}):\n{self._log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _throwaway_client_cert(directory: Path) -> tuple[Path, Path]:
    """A client certificate without a Common Name, for a TLS upstream that checks none.

    etcd 3.5.1's grpc-proxy cannot dial TLS with a CA alone ("open : no such file") and
    refuses a client certificate that has a Common Name ("cert has non empty Common Name").
    """
    cert, key = directory / "proxy-client.pem", directory / "proxy-client-key.pem"
    if not cert.exists():
        import trustme

        directory.mkdir(parents=True, exist_ok=True)
        issued = trustme.CA().issue_cert("etcd-grpc-proxy")  # no common_name: no CN
        cert.write_bytes(b"".join(b.bytes() for b in issued.cert_chain_pems))
        issued.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)
    return cert, key


class _PortTaken(Exception):
    """The proxy exited at once because its port was taken."""
