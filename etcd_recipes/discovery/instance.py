"""ServiceInstance: one registered instance of a service, and its JSON encoding.

The encoding is the Kotlin library's (kotlinx-serialization with ``encodeDefaults``), byte for
byte: the fields in the order ``name, jsonPayload, address, port, sslPort,
registrationTimeUTC, serviceType, uri, enabled, id``, compact separators, non-ASCII text as
UTF-8 (not ``\\u`` escapes), control characters as ``\\n``-style or lowercase ``\\u00XX``
escapes. ``jsonPayload`` is a **string** holding the payload's text (a codec's output, which
must be UTF-8), so a JVM process and a Python process read each other's registrations.

Guaranteed: ``ServiceInstance.from_json(i.to_json(codec), codec) == i`` and its ``id`` is
kept; a record written by the Kotlin library re-encodes to the same bytes. Decoding accepts
missing optional fields (their defaults; a missing ``registrationTimeUTC`` becomes *now* and a
missing ``id`` a new random one, as the Kotlin library does) and ignores unknown fields.

Not guaranteed: payload evolution (the payload is opaque text to the library); equality
covers every field **except** ``id`` (as in the Kotlin library) -- compare ids yourself when you
mean "the same registration".
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from typing import Any, Generic, overload

from typing_extensions import TypeVar

from .._core.keys import random_token
from .._core.validate import check_path_segment, check_port
from ..codecs import Codec
from ..errors import CodecError, InvalidArgumentError

__all__ = ["PayloadT", "ServiceInstance", "ServiceType"]

PayloadT = TypeVar("PayloadT", default=str)
"""The payload type of an instance: ``str`` (the raw ``jsonPayload`` text) without a codec."""
U = TypeVar("U")

_FIELDS = (
    "name",
    "jsonPayload",
    "address",
    "port",
    "sslPort",
    "registrationTimeUTC",
    "serviceType",
    "uri",
    "enabled",
    "id",
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ServiceType(enum.Enum):
    """The Kotlin library's service types; metadata only (no recipe branches on it).

    Example::

        from etcd_recipes import ServiceType

        assert ServiceType.DYNAMIC_SEQUENTIAL.is_dynamic and not ServiceType.STATIC.is_dynamic
    """

    DYNAMIC = "DYNAMIC"
    STATIC = "STATIC"
    PERMANENT = "PERMANENT"
    DYNAMIC_SEQUENTIAL = "DYNAMIC_SEQUENTIAL"

    @property
    def is_dynamic(self) -> bool:
        """``DYNAMIC`` or ``DYNAMIC_SEQUENTIAL``."""
        return self in (ServiceType.DYNAMIC, ServiceType.DYNAMIC_SEQUENTIAL)


@dataclass(frozen=True, slots=True)
class ServiceInstance(Generic[PayloadT]):
    """One instance of service ``name``: where it is (``address``, ``port``, ``ssl_port``,
    ``uri``), whether it takes traffic (``enabled``), and a typed ``payload``.

    ``port`` and ``ssl_port`` are ``1..65535`` or ``-1`` (none); ``id`` is 7 random
    alphanumerics unless given (it is the last segment of the instance's key, so it must not
    contain ``/``). Immutable: change one with :func:`dataclasses.replace`, which keeps the
    ``id``, then ``await registry.update(new)``. Equality ignores ``id``.

    Example::

        from etcd_recipes import JSON, ServiceInstance

        instance = ServiceInstance("orders", {"zone": "eu"}, address="10.0.0.7", port=8080)
        data = instance.to_json(JSON)
        assert data.startswith(b'{"name":"orders","jsonPayload":"{\\\\"zone\\\\":\\\\"eu\\\\"}"')
        back = ServiceInstance.from_json(data, JSON)
        assert back == instance and back.id == instance.id and back.payload["zone"] == "eu"
    """

    name: str
    payload: PayloadT
    address: str = ""
    port: int = -1
    ssl_port: int = -1
    registration_time_utc: int = field(default_factory=_now_ms)
    service_type: ServiceType = ServiceType.DYNAMIC
    uri: str = ""
    enabled: bool = True
    id: str = field(default_factory=random_token, compare=False)

    def __post_init__(self) -> None:
        check_path_segment(self.name, what="a service name")
        check_path_segment(self.id, what="a service instance id")
        check_port(self.port, what="port")
        check_port(self.ssl_port, what="ssl_port")
        for what, value in (("address", self.address), ("uri", self.uri)):
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
        if not isinstance(self.enabled, bool):
            raise InvalidArgumentError(f"enabled must be a bool, not {self.enabled!r}")
        if not isinstance(self.service_type, ServiceType):
            raise InvalidArgumentError(
                f"service_type must be a ServiceType, not {self.service_type!r}"
            )
        t = self.registration_time_utc
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidArgumentError(
                f"registration_time_utc must be epoch milliseconds (an int >= 0), got {t!r}"
            )

    # ---------------------------------------------------------------- encoding

    def payload_text(self, codec: Codec[PayloadT] | None = None) -> str:
        """The payload as the text stored in ``jsonPayload``: ``codec``'s output decoded as
        UTF-8, or the payload itself when it is a ``str`` and no codec is given."""
        payload: Any = self.payload
        if codec is None:
            if isinstance(payload, str):
                return payload
            if isinstance(payload, (bytes, bytearray)):
                data = bytes(payload)
            else:
                raise CodecError(
                    f"ServiceInstance {self.name}/{self.id}: the payload is a "
                    f"{type(payload).__name__}; pass codec= (e.g. JSON) to encode it"
                )
        else:
            data = codec.encode(payload)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(
                f"ServiceInstance {self.name}/{self.id}: the payload must encode to UTF-8 "
                "text (jsonPayload is a JSON string); use a text codec"
            ) from exc

    def to_json(self, codec: Codec[PayloadT] | None = None) -> bytes:
        """The Kotlin library's JSON for this instance, as UTF-8 bytes (see the module doc).

        Example::

            from etcd_recipes import ServiceInstance

            i = ServiceInstance("svc", "{}", registration_time_utc=1752192000123, id="Ab3x9Qz")
            assert i.to_json() == (
                b'{"name":"svc","jsonPayload":"{}","address":"","port":-1,"sslPort":-1,'
                b'"registrationTimeUTC":1752192000123,"serviceType":"DYNAMIC","uri":"",'
                b'"enabled":true,"id":"Ab3x9Qz"}'
            )
        """
        doc = {
            "name": self.name,
            "jsonPayload": self.payload_text(codec),
            "address": self.address,
            "port": self.port,
            "sslPort": self.ssl_port,
            "registrationTimeUTC": self.registration_time_utc,
            "serviceType": self.service_type.value,
            "uri": self.uri,
            "enabled": self.enabled,
            "id": self.id,
        }
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate in a str field
            raise CodecError(f"ServiceInstance {self.name}/{self.id}: not valid text") from exc

    @overload
    @staticmethod
    def from_json(data: bytes | str, codec: None = None) -> ServiceInstance[str]: ...

    @overload
    @staticmethod
    def from_json(data: bytes | str, codec: Codec[U]) -> ServiceInstance[U]: ...

    @staticmethod
    def from_json(data: bytes | str, codec: Codec[Any] | None = None) -> ServiceInstance[Any]:
        """Parse the Kotlin library's JSON; the payload is decoded with ``codec`` (the raw
        ``jsonPayload`` text without one). Raises :class:`~etcd_recipes.errors.CodecError`
        for anything that is not a valid record.

        Example::

            from etcd_recipes import ServiceInstance

            i = ServiceInstance.from_json(b'{"name":"svc","jsonPayload":"hi","port":80}')
            assert (i.name, i.payload, i.port, i.ssl_port) == ("svc", "hi", 80, -1)
        """
        try:
            doc = json.loads(data)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"not a ServiceInstance record (not JSON): {exc}") from exc
        if not isinstance(doc, dict):
            raise CodecError(f"not a ServiceInstance record: a JSON {type(doc).__name__}")
        try:
            text = _get(doc, "jsonPayload", str, None)
            if text is None:
                raise CodecError("a ServiceInstance record needs a jsonPayload string")
            name = _get(doc, "name", str, None)
            if name is None:
                raise CodecError("a ServiceInstance record needs a name")
            payload: Any = text if codec is None else codec.decode(text.encode("utf-8"))
            kind = _get(doc, "serviceType", str, "DYNAMIC")
            try:
                service_type = ServiceType(kind)
            except ValueError:
                raise CodecError(f"unknown serviceType {kind!r}") from None
            when = _get(doc, "registrationTimeUTC", int, None)
            ident = _get(doc, "id", str, None)
            return ServiceInstance(
                name,
                payload,
                address=_get(doc, "address", str, ""),
                port=_get(doc, "port", int, -1),
                ssl_port=_get(doc, "sslPort", int, -1),
                registration_time_utc=_now_ms() if when is None else when,
                service_type=service_type,
                uri=_get(doc, "uri", str, ""),
                enabled=_get(doc, "enabled", bool, True),
                id=random_token() if ident is None else ident,
            )
        except CodecError:
            raise
        except (InvalidArgumentError, UnicodeEncodeError) as exc:
            raise CodecError(f"not a valid ServiceInstance record: {exc}") from exc


_T = TypeVar("_T")


def _get(doc: dict[str, Any], key: str, kind: type[_T], default: _T) -> _T:
    value = doc.get(key, default)
    if value is default:
        return value
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise CodecError(f"ServiceInstance field {key!r} must be a {kind.__name__}: {value!r}")
    return value  # type: ignore[no-any-return]
