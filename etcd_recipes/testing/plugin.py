"""pytest plugin with real-etcd fixtures (registered as the ``pytest11`` entry point).

Fixtures:

- ``etcd_server`` (session, sync): one :class:`~etcd_recipes.testing.EtcdServer` per test
  session (per xdist worker). With ``ETCD_RECIPES_TEST_ENDPOINTS`` set, nothing is started and
  an :class:`~etcd_recipes.testing.ExternalEtcdServer` is used instead; its process-control
  methods then skip the test. Do not kill or pause it: use ``fresh_etcd_server``.
- ``etcd_prefix`` (function): a unique key prefix, e.g. ``"/t/test_lock-a1b2c3/"``.
- ``etcd_client`` (function, async; needs pytest-asyncio): an ``EtcdClient`` connected to
  ``etcd_server``, created on the test's own event loop.
- ``fresh_etcd_server`` (function, sync): a private server for destructive tests.
- ``etcd_cluster`` (function, sync): a fresh 3-member cluster.
- ``etcd_proxy`` (function, sync): a :class:`~etcd_recipes.testing.TcpProxy` in front of
  ``etcd_server``.
- ``etcd_grpc_proxy`` (function, sync): a private ``etcd grpc-proxy``
  (:class:`~etcd_recipes.testing.EtcdGrpcProxy`) in front of the shared ``etcd_server``:
  the test may kill and restart the proxy; to restart etcd behind it, build an
  ``EtcdGrpcProxy(fresh_etcd_server)`` instead.
- ``etcd_proxy_client`` (function, async): an ``EtcdClient`` connected through
  ``etcd_grpc_proxy``.
- ``etcd_leg`` (function, async, parametrized ``["direct", "grpc-proxy"]``): an
  ``EtcdClient`` connected to ``etcd_server`` directly, then through a fresh grpc-proxy, so
  each test that takes it runs twice (ids ``test_x[direct]``, ``test_x[grpc-proxy]``). A
  test learns its leg from ``request.node.callspec.params["etcd_leg"]``. To run a whole
  module on both legs, override ``etcd_client`` there::

      @pytest.fixture
      def etcd_client(etcd_leg):
          return etcd_leg

  Mind the "Known differences" of :class:`~etcd_recipes.testing.EtcdGrpcProxy`: progress
  requests go unanswered, and serializable reads come from the proxy's cache.

This module imports nothing heavy at import time: pytest loads it in every project that has
etcd-recipes installed.

Example::

    from etcd_recipes.testing import EtcdServer

    async def test_put(etcd_client, etcd_prefix):
        await etcd_client.put(etcd_prefix + "k", b"v")

    def test_restart(fresh_etcd_server):
        fresh_etcd_server.kill()
        fresh_etcd_server.restart()

    # What pytest does with them, given the fixtures' values:
    await test_put(client, prefix)
    with EtcdServer() as fresh:
        test_restart(fresh)
"""

from __future__ import annotations

import importlib
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from etcd_recipes.testing import (
        EtcdCluster,
        EtcdGrpcProxy,
        EtcdServer,
        ExternalEtcdServer,
        TcpProxy,
    )

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - depends on the environment
    pytest_asyncio = None  # type: ignore[assignment]

__all__ = [
    "etcd_client",
    "etcd_cluster",
    "etcd_grpc_proxy",
    "etcd_leg",
    "etcd_prefix",
    "etcd_proxy",
    "etcd_proxy_client",
    "etcd_server",
    "fresh_etcd_server",
    "pytest_configure",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``slow`` marker.

    Example::

        import pytest

        from etcd_recipes.testing import EtcdCluster

        @pytest.mark.slow
        def test_leader_failover(etcd_cluster):
            etcd_cluster.leader().kill()
            etcd_cluster.wait_for_leader()

        assert [mark.name for mark in test_leader_failover.pytestmark] == ["slow"]
        with EtcdCluster(3) as cluster:  # what the etcd_cluster fixture passes
            test_leader_failover(cluster)
    """
    config.addinivalue_line(
        "markers", "slow: fault-injection tests (restarts, pauses, clusters) on real etcd"
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--etcd-container[=IMAGE]``: the ``etcd_server`` fixture runs etcd in a container
    (:class:`~etcd_recipes.testing.EtcdContainer`, ``testcontainers``) instead of the embedded
    binary. Without a container engine the run stops at once with a message naming it::

        pytest --etcd-container                               # the default image
        pytest --etcd-container=quay.io/coreos/etcd:v3.5.17  # a chosen one
    """
    group = parser.getgroup("etcd-recipes")
    group.addoption(
        "--etcd-container",
        action="store",
        nargs="?",
        const="default",
        default=None,
        metavar="IMAGE",
        help="run the etcd_server fixture on etcd in a container (testcontainers; needs Docker)",
    )


def _container_server(config: pytest.Config) -> Any:
    image = config.getoption("etcd_container", default=None)
    if image is None:
        return None
    from etcd_recipes.testing.container import (
        DEFAULT_IMAGE,
        ContainerEngineUnavailableError,
        EtcdContainer,
    )

    container = EtcdContainer(DEFAULT_IMAGE if image == "default" else image)
    try:
        return container.start()
    except ContainerEngineUnavailableError as exc:
        raise pytest.UsageError(f"--etcd-container: {exc}") from exc


def _external_server() -> ExternalEtcdServer | None:
    from etcd_recipes.testing import ExternalEtcdServer

    class _PytestExternalServer(ExternalEtcdServer):
        def _unsupported(self, what: str) -> None:
            pytest.skip(
                f"{what}() needs an etcd started by the tests, but "
                f"{self.ENV_ENDPOINTS} points at an external server"
            )

    server = _PytestExternalServer.from_env()
    return server


@pytest.fixture(scope="session")
def etcd_server(request: pytest.FixtureRequest) -> Iterator[EtcdServer | ExternalEtcdServer]:
    """A real etcd for the whole session (or the external one in ETCD_RECIPES_TEST_ENDPOINTS,
    or a container with ``--etcd-container``).

    Example::

        from etcd_recipes.testing import ExternalEtcdServer

        def test_endpoint(etcd_server):
            assert etcd_server.etcdctl("endpoint", "health").returncode == 0

        # What the fixture passes when ETCD_RECIPES_TEST_ENDPOINTS names this example's etcd:
        test_endpoint(ExternalEtcdServer([endpoints]))
    """
    container = _container_server(request.config)
    if container is not None:
        try:
            yield container
        finally:
            container.stop()
        return
    external = _external_server()
    if external is not None:
        yield external
        return
    from etcd_recipes.testing import EtcdServer

    with EtcdServer() as server:
        yield server


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix unique to this test, like ``"/t/test_name-a1b2c3/"``.

    Example::

        from etcd_recipes import DistributedQueue

        async def test_queue(etcd_client, etcd_prefix):
            async with DistributedQueue(etcd_client, etcd_prefix + "queue") as queue:
                await queue.enqueue(b"job")
                assert await queue.dequeue() == b"job"

        await test_queue(client, prefix)  # pytest passes the fixtures
    """
    name = _UNSAFE.sub("_", request.node.name).strip("_")[:60] or "test"
    return f"/t/{name}-{secrets.token_hex(3)}/"


async def _etcd_client(etcd_server: Any) -> AsyncIterator[Any]:
    """An ``EtcdClient`` connected to ``etcd_server``, created on the test's event loop.

    Example::

        async def test_put_get(etcd_client, etcd_prefix):
            await etcd_client.put(etcd_prefix + "k", b"v")
            assert (await etcd_client.get(etcd_prefix + "k")).value == b"v"

        await test_put_get(client, prefix)  # pytest passes the fixtures
    """
    # Imported by name at run time: the plugin must not depend on the client at import time.
    connect = importlib.import_module("etcd_recipes.client").connect

    async with connect(**etcd_server.client_kwargs()) as client:
        yield client


if pytest_asyncio is not None:
    etcd_client = pytest_asyncio.fixture(_etcd_client, name="etcd_client")
else:  # pragma: no cover - depends on the environment

    @pytest.fixture(name="etcd_client")
    def etcd_client(etcd_server: Any) -> Any:
        pytest.skip("the etcd_client fixture needs pytest-asyncio (pip install pytest-asyncio)")


@pytest.fixture
def fresh_etcd_server() -> Iterator[EtcdServer]:
    """A private etcd for destructive tests (kill, restart, pause, compaction); stopped after.

    Example::

        from etcd_recipes.testing import EtcdServer

        def test_restart(fresh_etcd_server):
            fresh_etcd_server.restart()
            assert fresh_etcd_server.is_healthy()

        with EtcdServer() as fresh:  # what the fixture passes
            test_restart(fresh)
    """
    from etcd_recipes.testing import EtcdServer

    with EtcdServer() as server:
        yield server


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A fresh 3-member cluster for fault tests; stopped after the test.

    Example::

        from etcd_recipes.testing import EtcdCluster

        def test_failover(etcd_cluster):
            etcd_cluster.leader().kill()
            etcd_cluster.wait_for_leader()

        with EtcdCluster(3) as cluster:  # what the fixture passes
            test_failover(cluster)
    """
    from etcd_recipes.testing import EtcdCluster

    with EtcdCluster(3) as cluster:
        yield cluster


@pytest.fixture
def etcd_proxy(etcd_server: Any) -> Iterator[TcpProxy]:
    """A :class:`~etcd_recipes.testing.TcpProxy` in front of ``etcd_server``.

    Connect through ``etcd_proxy.url`` (``https://`` + ``etcd_proxy.endpoint`` for TLS) and
    use ``cut()``/``blackhole()``/``restore()``; other tests' connections are unaffected.

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import TcpProxy

        async def test_reconnect(etcd_proxy):
            async with connect(endpoints=[etcd_proxy.url]) as proxied:
                await proxied.get("/k")
                etcd_proxy.cut()
                await proxied.get("/k")  # on a new connection

        with TcpProxy.for_endpoint(endpoints) as proxy:  # what the fixture passes
            await test_reconnect(proxy)
    """
    from etcd_recipes.testing import TcpProxy

    with TcpProxy.for_endpoint(etcd_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def etcd_grpc_proxy(etcd_server: Any) -> Iterator[EtcdGrpcProxy]:
    """A private ``etcd grpc-proxy`` in front of the shared ``etcd_server``; stopped after.

    The test may :meth:`~etcd_recipes.testing.EtcdGrpcProxy.kill` and
    :meth:`~etcd_recipes.testing.EtcdGrpcProxy.restart` it; other tests are unaffected.

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

        async def test_through_the_proxy(etcd_grpc_proxy, etcd_prefix):
            async with connect(**etcd_grpc_proxy.client_kwargs()) as proxied:
                await proxied.put(etcd_prefix + "k", b"v")
                etcd_grpc_proxy.restart()
                assert (await proxied.get(etcd_prefix + "k")).value == b"v"

        with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:  # what it passes
            await test_through_the_proxy(proxy, prefix)
    """
    from etcd_recipes.testing import EtcdGrpcProxy

    with EtcdGrpcProxy(etcd_server) as proxy:
        yield proxy


async def _etcd_proxy_client(etcd_grpc_proxy: Any) -> AsyncIterator[Any]:
    """An ``EtcdClient`` connected through ``etcd_grpc_proxy``, on the test's event loop.

    Example::

        async def test_put_through_the_proxy(etcd_proxy_client, etcd_client, etcd_prefix):
            await etcd_proxy_client.put(etcd_prefix + "k", b"v")
            assert (await etcd_client.get(etcd_prefix + "k")).value == b"v"  # the same etcd

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

        with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:  # what pytest passes
            async with connect(**proxy.client_kwargs()) as proxied:
                await test_put_through_the_proxy(proxied, client, prefix)
    """
    connect = importlib.import_module("etcd_recipes.client").connect

    async with connect(**etcd_grpc_proxy.client_kwargs()) as client:
        yield client


_LEGS = ("direct", "grpc-proxy")


async def _etcd_leg(request: pytest.FixtureRequest, etcd_server: Any) -> AsyncIterator[Any]:
    """An ``EtcdClient`` for each leg: ``"direct"`` to ``etcd_server``, ``"grpc-proxy"``
    through a private ``etcd grpc-proxy`` in front of it.

    Example::

        async def test_put_get(etcd_leg, etcd_prefix):
            await etcd_leg.put(etcd_prefix + "k", b"v")
            assert (await etcd_leg.get(etcd_prefix + "k")).value == b"v"

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdGrpcProxy, ExternalEtcdServer

        await test_put_get(client, prefix)  # [direct]
        with EtcdGrpcProxy(ExternalEtcdServer([endpoints])) as proxy:  # [grpc-proxy]
            async with connect(**proxy.client_kwargs()) as proxied:
                await test_put_get(proxied, prefix)
    """
    connect = importlib.import_module("etcd_recipes.client").connect

    if request.param == "direct":
        async with connect(**etcd_server.client_kwargs()) as client:
            yield client
        return
    from etcd_recipes.testing import EtcdGrpcProxy

    with EtcdGrpcProxy(etcd_server) as proxy:
        async with connect(**proxy.client_kwargs()) as client:
            yield client


if pytest_asyncio is not None:
    etcd_proxy_client = pytest_asyncio.fixture(_etcd_proxy_client, name="etcd_proxy_client")
    etcd_leg = pytest_asyncio.fixture(_etcd_leg, name="etcd_leg", params=_LEGS, ids=_LEGS)
else:  # pragma: no cover - depends on the environment

    @pytest.fixture(name="etcd_proxy_client")
    def etcd_proxy_client(etcd_grpc_proxy: Any) -> Any:
        pytest.skip("the etcd_proxy_client fixture needs pytest-asyncio")

    @pytest.fixture(name="etcd_leg", params=_LEGS, ids=_LEGS)
    def etcd_leg(etcd_server: Any) -> Any:
        pytest.skip("the etcd_leg fixture needs pytest-asyncio")
