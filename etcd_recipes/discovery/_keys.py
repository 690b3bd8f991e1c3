"""The discovery key layout (shared with the Kotlin library). Family-private."""

from __future__ import annotations

from typing import Any

from .._core.keys import append_to_path
from .instance import ServiceInstance


def names_path(service_path: str) -> str:
    """``<service_path>/names``."""
    return append_to_path(service_path, "names")


def service_prefix(service_path: str, name: str) -> str:
    """``<service_path>/names/<name>/`` (with the trailing slash: a prefix read of one
    service never sees ``<name>x``'s instances)."""
    return append_to_path(names_path(service_path), name) + "/"


def instance_key(service_path: str, instance: ServiceInstance[Any]) -> str:
    """``<service_path>/names/<name>/<id>``."""
    return service_prefix(service_path, instance.name) + instance.id
