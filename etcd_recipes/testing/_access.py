"""How tests reach a running :class:`~etcd_recipes.testing.EtcdServer` (internal).

:class:`ServerAccess` holds the server's client-side surface -- its URL, ``connect()``
arguments, TLS credentials for raw gRPC channels, the Maintenance status, ``etcdctl`` and the
``/health`` probe -- apart from process control (``server.py``). It reads the connection facts
the server keeps (port, TLS material, auth) and runs nothing in the background.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
from abc import ABC, abstractmethod
from typing import Any

from etcd_recipes.errors import NotStartedError
from etcd_recipes.testing._process import run_etcdctl
from etcd_recipes.testing.certs import TlsMaterial

HEALTH_PROBE_TIMEOUT = 0.5


class ServerAccess(ABC):
    """The client-facing methods of :class:`~etcd_recipes.testing.EtcdServer` (a base class)."""

    _client_port: int | None
    _use_tls: bool
    _client_cert_auth: bool
    _auth: bool
    _root_password: str
    _tls_material: TlsMaterial | None
    _member_id: int | None

    @property
    @abstractmethod
    def is_running(self) -> bool:
        """Whether the server's process is alive (defined by the server)."""

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client URL, without scheme, e.g. ``"127.0.0.1:41234"``.

        Example::

            import grpc

        from etcd_recipes.testing import EtcdServer

        with EtcdServer() as server, grpc.insecure_channel(server.endpoint) as channel:
            grpc.channel_ready_future(channel).result(timeout=5)
        """
        if self._client_port is None:
            raise NotStartedError("the server has no port yet; call start() first")
        return f"127.0.0.1:{self._client_port}"

    @property
    def url(self) -> str:
        """The client URL, ``http://127.0.0.1:PORT`` or ``https://...`` when TLS is on."""
        scheme = "https" if self._use_tls else "http"
        return f"{scheme}://{self.endpoint}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.client.connect` to reach this server.

        Example::

            from etcd_recipes import connect
            from etcd_recipes.testing import EtcdServer

            with EtcdServer(tls=True) as server:
                async with connect(**server.client_kwargs()) as tls_client:  # endpoints and ca_cert
                    await tls_client.put(prefix + "k", b"v")
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

            import grpc

            from etcd_recipes.testing import EtcdServer

            with EtcdServer(tls=True) as server:
                creds = server.grpc_credentials()
                with grpc.secure_channel(server.endpoint, creds) as channel:
                    grpc.channel_ready_future(channel).result(timeout=5)
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

            from etcd_recipes.testing import EtcdServer

            with EtcdServer() as server:
                st = server.status()
                assert st.leader == st.header.member_id  # a single member leads itself
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

            from etcd_recipes.testing import EtcdServer

        with EtcdServer() as server:
            assert server.member_id == server.status().header.member_id
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

            from etcd_recipes.testing import EtcdServer

            with EtcdServer(auth=True) as server:  # etcdctl runs as root
                server.etcdctl("put", "/k", "v", check=True)
                assert server.etcdctl("get", "/k", "--print-value-only").stdout == "v\\n"
                assert server.etcdctl("get", "/k", user="").returncode != 0  # no credentials
        """
        if user is None and self._auth:
            user, password = "root", self._root_password
        tls = self._tls_material
        return run_etcdctl(
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

    def is_healthy(self, timeout: float = HEALTH_PROBE_TIMEOUT) -> bool:
        """Whether ``GET /health`` reports ``"true"`` (has a leader and serves reads).

        Example::

            from etcd_recipes.testing import EtcdServer

        with EtcdServer() as server:
            assert server.is_healthy()
            server.pause()
            assert not server.is_healthy(timeout=0.2)
            server.resume()
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
