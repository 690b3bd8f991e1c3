"""A stand-in for :class:`~etcd_recipes.testing.EtcdServer` when the tests run against an etcd
they did not start (``ETCD_RECIPES_TEST_ENDPOINTS``): :class:`ExternalEtcdServer`."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from etcd_recipes.errors import InvalidArgumentError, UsageError
from etcd_recipes.testing._process import run_etcdctl

__all__ = ["ExternalEtcdServer", "ExternalServerError"]


class ExternalServerError(UsageError):
    """A process-control method was called on an :class:`ExternalEtcdServer`.

    Example::

        from etcd_recipes.testing import ExternalEtcdServer, ExternalServerError

        try:
            ExternalEtcdServer([endpoints]).kill()
        except ExternalServerError as exc:
            assert "not possible on an external etcd server" in str(exc)
        else:
            raise AssertionError("kill() of an external server did not raise")
    """


class ExternalEtcdServer:
    """Stands in for :class:`EtcdServer` when tests run against a server they did not start.

    Offers the same ``endpoint``/``url``/``client_kwargs()``/``etcdctl()``; process control
    (``kill``, ``pause``, ``resume``, ``restart``) raises :class:`ExternalServerError`.
    The pytest plugin builds one from ``ETCD_RECIPES_TEST_ENDPOINTS`` (see :meth:`from_env`).

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import ExternalEtcdServer

        # e.g. ExternalEtcdServer(["https://10.0.0.5:2379"], ca_cert="/etc/ssl/etcd-ca.pem")
        server = ExternalEtcdServer([endpoints])
        async with connect(**server.client_kwargs()) as ext_client:
            await ext_client.put(prefix + "k", b"v")
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

            from etcd_recipes.testing import ExternalEtcdServer

            server = ExternalEtcdServer.from_env({"ETCD_RECIPES_TEST_ENDPOINTS": "h:2379"})
            assert server is not None and server.endpoint == "h:2379"
            assert ExternalEtcdServer.from_env({}) is None
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

            from etcd_recipes.testing import ExternalEtcdServer

        server = ExternalEtcdServer([endpoints], user="app", password="secret")
        kwargs = server.client_kwargs()
        assert kwargs == {"endpoints": [f"http://{endpoints}"], "user": "app", "password": "secret"}
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

            from etcd_recipes.testing import ExternalEtcdServer

        ExternalEtcdServer([endpoints]).etcdctl("endpoint", "health", check=True)
        """
        if user is None:
            user, password = self._user, self._password
        return run_etcdctl(
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
