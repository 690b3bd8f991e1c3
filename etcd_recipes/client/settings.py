"""Connection settings from arguments and the environment, for :func:`~etcd_recipes.connect`.

The order, for each setting: an explicit argument wins; else, **when the endpoints themselves
come from the environment**, the environment:

* endpoints: ``$ETCD_ENDPOINTS``, then etcdctl's ``$ETCDCTL_ENDPOINTS``;
* ``ca_cert``, ``cert``, ``key``: ``$ETCDCTL_CACERT``, ``$ETCDCTL_CERT``, ``$ETCDCTL_KEY``;
* ``user``/``password``: ``$ETCDCTL_USER`` as ``user:password``, or ``user`` with the
  password in ``$ETCDCTL_PASSWORD`` (etcdctl's two forms; etcdctl would prompt for a missing
  password, a library cannot, so that is an error).

Explicit endpoints read nothing from the environment: certificates and credentials set for
the cluster the environment names are never sent to another one. Empty variables count as
unset. etcdctl's other variables (timeouts, ``ETCDCTL_INSECURE_*``, discovery) are not read.
Not public.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgumentError, InvalidEndpointError

__all__ = ["ENDPOINT_VARIABLES", "Settings", "resolve_settings"]

ENDPOINT_VARIABLES = ("ETCD_ENDPOINTS", "ETCDCTL_ENDPOINTS")

Pem = str | bytes | Path | None


@dataclass(frozen=True)
class Settings:
    """The resolved connection settings."""

    endpoints: str | Sequence[str]
    ca_cert: Pem
    cert: Pem
    key: Pem
    user: str | None
    password: str | None


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _env_credentials(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    user = _env(environ, "ETCDCTL_USER")
    password = environ.get("ETCDCTL_PASSWORD") or None
    if user is None:
        if password is not None:
            raise InvalidArgumentError("$ETCDCTL_PASSWORD is set but $ETCDCTL_USER is not")
        return None, None
    name, sep, inline = user.partition(":")
    if sep and password is not None:
        raise InvalidArgumentError(
            "$ETCDCTL_USER must not include a password when $ETCDCTL_PASSWORD is set"
        )
    if not name:
        raise InvalidArgumentError("$ETCDCTL_USER names no user (expected user:password)")
    if sep:
        return name, inline
    if password is None:
        raise InvalidArgumentError(
            "$ETCDCTL_USER has no password: use user:password, or set $ETCDCTL_PASSWORD"
        )
    return name, password


def resolve_settings(
    endpoints: str | Sequence[str] | None,
    *,
    ca_cert: Pem,
    cert: Pem,
    key: Pem,
    user: str | None,
    password: str | None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Explicit arguments, completed from the environment when ``endpoints`` is ``None``."""
    if (user is None) != (password is None):
        raise InvalidArgumentError("give both user= and password=, or neither")
    if endpoints is not None:
        return Settings(endpoints, ca_cert, cert, key, user, password)
    env = os.environ if environ is None else environ
    found = next(((name, value) for name in ENDPOINT_VARIABLES if (value := _env(env, name))), None)
    if found is None:
        raise InvalidEndpointError(
            "no endpoints given and neither $ETCD_ENDPOINTS nor $ETCDCTL_ENDPOINTS is set "
            "(e.g. '127.0.0.1:2379')"
        )
    if user is None:
        user, password = _env_credentials(env)
    return Settings(
        endpoints=found[1],
        ca_cert=ca_cert if ca_cert is not None else _env(env, "ETCDCTL_CACERT"),
        cert=cert if cert is not None else _env(env, "ETCDCTL_CERT"),
        key=key if key is not None else _env(env, "ETCDCTL_KEY"),
        user=user,
        password=password,
    )
