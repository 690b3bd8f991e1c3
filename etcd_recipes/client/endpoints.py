"""Endpoint parsing and gRPC channel construction (targets, TLS credentials, keepalive options)."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from .._core.validate import check_duration
from ..errors import InvalidArgumentError, InvalidEndpointError

_grpc: Any = grpc  # grpc ships no type information

__all__ = ["ChannelSpec", "Endpoint", "build_channel", "parse_endpoints"]

ENV_ENDPOINTS = "ETCD_ENDPOINTS"


@dataclass(frozen=True)
class Endpoint:
    """One parsed endpoint. ``secure`` is None when the string named no scheme."""

    host: str
    port: int
    secure: bool | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _parse_one(raw: str) -> Endpoint:
    text = raw.strip()
    if not text:
        raise InvalidEndpointError("an endpoint must not be empty")
    secure: bool | None = None
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https"):
            raise InvalidEndpointError(
                f"unsupported scheme in endpoint {raw!r}: use host:port, http:// or https://"
            )
        secure = parts.scheme == "https"
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise InvalidEndpointError(f"endpoint {raw!r} must not have a path or query")
        host = parts.hostname or ""
        try:
            port = parts.port
        except ValueError as exc:
            raise InvalidEndpointError(f"bad port in endpoint {raw!r}") from exc
        if port is None:
            port = 2379
    else:
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise InvalidEndpointError(f"expected [ipv6]:port, got {raw!r}")
            port_text = rest[1:]
        else:
            host, sep, port_text = text.rpartition(":")
            if not sep:
                raise InvalidEndpointError(f"endpoint {raw!r} has no port: expected host:port")
        if not port_text.isdigit():
            raise InvalidEndpointError(f"bad port in endpoint {raw!r}")
        port = int(port_text)
    if not host or any(c in host for c in " /?#@"):
        raise InvalidEndpointError(f"bad host in endpoint {raw!r}")
    if not 0 < port < 65536:
        raise InvalidEndpointError(f"port out of range in endpoint {raw!r}")
    return Endpoint(host, port, secure)


def parse_endpoints(endpoints: str | Sequence[str] | None) -> list[Endpoint]:
    """Parse endpoints: a list, or a comma-separated string; ``None`` reads ``ETCD_ENDPOINTS``.

    >>> [str(e) for e in parse_endpoints("127.0.0.1:2379, http://10.0.0.2:2379")]
    ['127.0.0.1:2379', '10.0.0.2:2379']
    """
    if endpoints is None:
        endpoints = os.environ.get(ENV_ENDPOINTS, "")
        if not endpoints.strip():
            raise InvalidEndpointError(
                f"no endpoints given and ${ENV_ENDPOINTS} is not set (e.g. '127.0.0.1:2379')"
            )
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if not items:
        raise InvalidEndpointError("at least one endpoint is required")
    parsed = [_parse_one(str(item)) for item in items]
    schemes = {e.secure for e in parsed if e.secure is not None}
    if len(schemes) > 1:
        raise InvalidEndpointError("endpoints mix http:// and https://; use one scheme")
    return parsed


def _read_pem(value: str | bytes | Path | None, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    text = str(value)
    if "-----BEGIN" in text:
        return text.encode()
    try:
        return Path(text).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} from {text!r}: {exc}") from exc


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ChannelSpec:
    """Everything needed to (re)build the client's gRPC channel."""

    endpoints: tuple[Endpoint, ...]
    secure: bool
    ca_cert: bytes | None
    cert: bytes | None
    key: bytes | None
    keepalive_time: float
    keepalive_timeout: float
    max_reconnect_backoff: float

    @property
    def description(self) -> str:
        """Endpoints as a human-readable list."""
        return ", ".join(str(e) for e in self.endpoints)

    @classmethod
    def create(
        cls,
        endpoints: str | Sequence[str] | None,
        *,
        ca_cert: str | bytes | Path | None,
        cert: str | bytes | Path | None,
        key: str | bytes | Path | None,
        keepalive_time: float,
        keepalive_timeout: float,
        max_reconnect_backoff: float = 1.0,
    ) -> ChannelSpec:
        """Validate the connection settings (no I/O but reading certificate files)."""
        check_duration(keepalive_time, what="keepalive_time")
        check_duration(keepalive_timeout, what="keepalive_timeout")
        parsed = parse_endpoints(endpoints)
        if (cert is None) != (key is None):
            raise InvalidArgumentError("mutual TLS needs both cert= and key=")
        explicit = {e.secure for e in parsed if e.secure is not None}
        secure = explicit == {True} or (not explicit and (ca_cert is not None or cert is not None))
        if explicit == {False} and (ca_cert is not None or cert is not None):
            raise InvalidEndpointError("TLS certificates were given but the endpoints use http://")
        return cls(
            endpoints=tuple(parsed),
            secure=secure,
            ca_cert=_read_pem(ca_cert, "ca_cert"),
            cert=_read_pem(cert, "cert"),
            key=_read_pem(key, "key"),
            keepalive_time=keepalive_time,
            keepalive_timeout=keepalive_timeout,
            max_reconnect_backoff=max_reconnect_backoff,
        )

    def _target(self) -> tuple[str, str | None]:
        """The gRPC target and, for TLS, the name to verify when the target has no hostname."""
        if len(self.endpoints) == 1:
            return str(self.endpoints[0]), None
        addrs: list[str] = []
        names = [e.host for e in self.endpoints if not _is_ip(e.host)]
        for e in self.endpoints:
            if _is_ip(e.host):
                addrs.append(str(e))
                continue
            try:
                infos = socket.getaddrinfo(e.host, e.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise InvalidEndpointError(
                    f"cannot resolve endpoint host {e.host!r}: {exc}"
                ) from exc
            for info in infos:
                ip = str(info[4][0])
                addr = f"[{ip}]:{e.port}" if ":" in ip else f"{ip}:{e.port}"
                if addr not in addrs:
                    addrs.append(addr)
        ipv6 = all(a.startswith("[") for a in addrs)
        scheme = "ipv6" if ipv6 else "ipv4"
        if not ipv6:
            addrs = [a for a in addrs if not a.startswith("[")]
        return f"{scheme}:{','.join(addrs)}", (names[0] if names else None)

    def options(self) -> list[tuple[str, Any]]:
        """Channel options: keepalive tuned to detect dead peers, fast reconnects, no size cap."""
        opts: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", _ms(self.keepalive_time)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout)),
            ("grpc.http2.ping_timeout_ms", _ms(self.keepalive_timeout)),
            ("grpc.keepalive_permit_without_calls", 0),  # etcd GOAWAYs pings on idle connections
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", _ms(self.max_reconnect_backoff)),
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.enable_retries", 0),
        ]
        if len(self.endpoints) > 1:
            opts.append(("grpc.lb_policy_name", "round_robin"))
        return opts


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def build_channel(spec: ChannelSpec, *, blocking: bool = False) -> Any:
    """Create the ``grpc.aio`` channel on the running event loop, or (``blocking=True``) a
    plain grpc channel with the same settings, for blocking stubs called from any thread."""
    target, name_override = spec._target()
    options = spec.options()
    kind = _grpc if blocking else _grpc.aio
    if not spec.secure:
        return kind.insecure_channel(target, options=options)
    if name_override:
        options.append(("grpc.ssl_target_name_override", name_override))
    creds = _grpc.ssl_channel_credentials(
        root_certificates=spec.ca_cert, private_key=spec.key, certificate_chain=spec.cert
    )
    return kind.secure_channel(target, creds, options=options)
