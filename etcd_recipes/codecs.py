"""Codecs: how recipe values are turned into etcd bytes and back.

etcd stores opaque byte strings, so every recipe works with ``bytes`` by default. Pass a
:class:`Codec` to make a recipe generic in the value type ``T``: the recipe calls
``codec.encode(value)`` before writing and ``codec.decode(data)`` after reading.

What a codec guarantees:

* ``codec.decode(codec.encode(v)) == v`` for every value the codec accepts.
* Encoding is deterministic for a given value and codec configuration, so values written by
  one process can be compared byte-for-byte (for example in a transaction's value compare).
* Failures are reported as :class:`~etcd_recipes.errors.CodecError` (also a ``ValueError``)
  with the original exception chained as ``__cause__``; nothing else escapes.
* :data:`INT32` and :data:`INT64` are byte-compatible with Guava's ``Ints.toByteArray`` /
  ``Longs.toByteArray`` (fixed-width, big-endian, two's complement), as used by the JVM
  coordination library this project interoperates with.

What a codec does *not* do:

* No schema evolution or versioning: the bytes carry no type tag or version. Changing a
  codec (or a Pydantic model) for keys that already hold data is a migration you must plan.
* No compression, encryption or size limits: etcd's request size limit still applies to the
  encoded bytes.
* Binary codecs (:data:`BYTES`, :data:`INT32`, :data:`INT64`) produce bytes that are not
  text. Surfaces that are text-only (``etcdctl`` output, logs, JSON gateways, other
  languages reading values as strings) need a text codec such as :data:`UTF8` or
  :data:`JSON`.

Example::

    from etcd_recipes import INT64, JSON, as_codec

    data = INT64.encode(42)             # b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00*"
    assert INT64.decode(data) == 42
    assert JSON.decode(JSON.encode({"a": [1, 2]})) == {"a": [1, 2]}
    assert as_codec(None).encode(b"raw") == b"raw"

Writing your own codec needs no base class; any object with matching ``encode`` and
``decode`` methods is a :class:`Codec`::

    class UpperCodec:
        def encode(self, value: str) -> bytes:
            return value.upper().encode()

        def decode(self, data: bytes) -> str:
            return data.decode()
"""

from __future__ import annotations

import codecs as _stdlib_codecs
import json
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Protocol, cast, runtime_checkable

from typing_extensions import TypeVar

from etcd_recipes.errors import CodecError, InvalidArgumentError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "BYTES",
    "INT32",
    "INT64",
    "JSON",
    "UTF8",
    "BytesCodec",
    "Codec",
    "Int32Codec",
    "Int64Codec",
    "JsonCodec",
    "PydanticCodec",
    "StrCodec",
    "as_codec",
    "to_bytes",
]

T = TypeVar("T")
ValueT = TypeVar("ValueT", default=bytes)
"""The value type of a recipe with an optional codec: ``bytes`` without one (PEP 696)."""
M = TypeVar("M", bound="BaseModel")

_BytesLike = (bytes, bytearray, memoryview)


@runtime_checkable
class Codec(Protocol[T]):
    """Converts values of type ``T`` to ``bytes`` and back.

    Any object with these two methods is a codec; no base class is needed. ``isinstance(obj,
    Codec)`` checks only that both methods exist. Implementations should raise
    :class:`~etcd_recipes.errors.CodecError` (chained ``from`` the underlying error) when a
    value cannot be converted.

    Example::

        from etcd_recipes import INT64, Codec

        def store(codec: Codec[int], value: int) -> bytes:
            return codec.encode(value)

        assert store(INT64, 7) == b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x07"
        assert isinstance(INT64, Codec)
    """

    def encode(self, value: T) -> bytes:
        """Return the bytes representing ``value``.

        Example::

            from etcd_recipes import UTF8

            assert UTF8.encode("hé") == b"h\\xc3\\xa9"
        """
        ...

    def decode(self, data: bytes) -> T:
        """Return the value represented by ``data``.

        Example::

            from etcd_recipes import UTF8

            assert UTF8.decode(b"h\\xc3\\xa9") == "hé"
        """
        ...


def _type_name(value: object) -> str:
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _require_bytes(codec: object, data: object) -> bytes:
    """Return ``data`` as ``bytes`` for decoding, or raise :class:`CodecError`."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise CodecError(f"{type(codec).__name__}.decode expects bytes, got {_type_name(data)}")


# --------------------------------------------------------------------------- bytes


class BytesCodec:
    """The identity codec: values are the raw bytes stored in etcd (the default).

    ``encode`` accepts ``bytes``, ``bytearray`` and ``memoryview`` and always returns an
    immutable ``bytes`` copy; anything else (including ``str``) raises
    :class:`~etcd_recipes.errors.CodecError`. Use :data:`BYTES` rather than a new instance.

    Example::

        from etcd_recipes import BYTES

        assert BYTES.encode(bytearray(b"ab")) == b"ab"
        assert BYTES.decode(b"ab") == b"ab"
    """

    __slots__ = ()

    def encode(self, value: bytes | bytearray | memoryview) -> bytes:
        """Return ``value`` as ``bytes``."""
        if isinstance(value, bytes):
            return value
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        hint = "; encode text first or use the UTF8 codec" if isinstance(value, str) else ""
        raise CodecError(
            f"BytesCodec.encode expects bytes, bytearray or memoryview, "
            f"got {_type_name(value)}{hint}"
        )

    def decode(self, data: bytes) -> bytes:
        """Return ``data`` unchanged (as ``bytes``)."""
        return _require_bytes(self, data)

    def __repr__(self) -> str:
        return "BytesCodec()"


BYTES: Final[BytesCodec] = BytesCodec()
"""The shared identity codec. Example: ``BYTES.encode(b"v") == b"v"``."""


# --------------------------------------------------------------------------- text


class StrCodec:
    """Text values, encoded with ``encoding`` (UTF-8 by default) in strict mode.

    An unknown encoding raises :class:`~etcd_recipes.errors.CodecError` at construction.
    Characters the encoding cannot represent, and bytes that are not valid in it, raise
    :class:`~etcd_recipes.errors.CodecError`. Use :data:`UTF8` for UTF-8.

    Example::

        from etcd_recipes import UTF8, StrCodec

        latin1 = StrCodec("latin-1")
        assert latin1.encode("é") == b"\\xe9"
        assert UTF8.decode(b"caf\\xc3\\xa9") == "café"
    """

    __slots__ = ("_encoding",)

    def __init__(self, encoding: str = "utf-8") -> None:
        try:
            self._encoding = _stdlib_codecs.lookup(encoding).name
        except (LookupError, TypeError) as exc:
            raise CodecError(f"StrCodec: unknown text encoding {encoding!r}") from exc

    @property
    def encoding(self) -> str:
        """The normalised encoding name.

        Example::

            from etcd_recipes import StrCodec

            assert StrCodec("UTF8").encoding == "utf-8"
        """
        return self._encoding

    def encode(self, value: str) -> bytes:
        """Return ``value`` encoded as bytes."""
        if not isinstance(value, str):
            raise CodecError(f"StrCodec.encode expects str, got {_type_name(value)}")
        try:
            return value.encode(self._encoding)
        except UnicodeError as exc:
            raise CodecError(f"cannot encode text as {self._encoding}: {exc}") from exc

    def decode(self, data: bytes) -> str:
        """Return ``data`` decoded to text."""
        raw = _require_bytes(self, data)
        try:
            return raw.decode(self._encoding)
        except UnicodeError as exc:
            raise CodecError(f"value is not valid {self._encoding} text: {exc}") from exc

    def __repr__(self) -> str:
        return f"StrCodec({self._encoding!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StrCodec):
            return NotImplemented
        return self._encoding == other._encoding

    def __hash__(self) -> int:
        return hash((StrCodec, self._encoding))


UTF8: Final[StrCodec] = StrCodec("utf-8")
"""The shared UTF-8 text codec. Example: ``UTF8.encode("é") == b"\\xc3\\xa9"``."""


# --------------------------------------------------------------------------- integers


class _FixedWidthIntCodec:
    """Fixed-width, big-endian, signed two's complement integers."""

    __slots__ = ()

    WIDTH: ClassVar[int]
    MIN: ClassVar[int]
    MAX: ClassVar[int]

    def encode(self, value: int) -> bytes:
        name = type(self).__name__
        if isinstance(value, bool):
            raise CodecError(f"{name}.encode does not accept bool; pass int(value) explicitly")
        try:
            number = operator.index(value)
        except TypeError as exc:
            raise CodecError(f"{name}.encode expects int, got {_type_name(value)}") from exc
        try:
            return number.to_bytes(self.WIDTH, "big", signed=True)
        except OverflowError as exc:
            raise CodecError(
                f"{name}: {number} is out of range for a {self.WIDTH * 8}-bit signed integer "
                f"[{self.MIN}, {self.MAX}]"
            ) from exc

    def decode(self, data: bytes) -> int:
        raw = _require_bytes(self, data)
        if len(raw) != self.WIDTH:
            raise CodecError(
                f"{type(self).__name__}.decode expects exactly {self.WIDTH} bytes, got {len(raw)}"
            )
        return int.from_bytes(raw, "big", signed=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Int32Codec(_FixedWidthIntCodec):
    """32-bit signed integers as 4 big-endian bytes (Guava ``Ints.toByteArray`` layout).

    Accepts ``int`` (and objects with ``__index__``) in ``[-2**31, 2**31 - 1]``; ``bool`` and
    out-of-range values raise :class:`~etcd_recipes.errors.CodecError`, as does decoding
    anything but exactly 4 bytes. Use :data:`INT32` rather than a new instance.

    Example::

        from etcd_recipes import INT32

        assert INT32.encode(1) == b"\\x00\\x00\\x00\\x01"
        assert INT32.decode(b"\\xff" * 4) == -1
    """

    __slots__ = ()

    WIDTH: ClassVar[int] = 4
    MIN: ClassVar[int] = -(2**31)
    MAX: ClassVar[int] = 2**31 - 1


class Int64Codec(_FixedWidthIntCodec):
    """64-bit signed integers as 8 big-endian bytes (Guava ``Longs.toByteArray`` layout).

    Accepts ``int`` (and objects with ``__index__``) in ``[-2**63, 2**63 - 1]``; ``bool`` and
    out-of-range values raise :class:`~etcd_recipes.errors.CodecError`, as does decoding
    anything but exactly 8 bytes. Use :data:`INT64` rather than a new instance.

    Example::

        from etcd_recipes import INT64

        assert INT64.encode(1) == b"\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01"
        assert INT64.decode(b"\\x80" + b"\\x00" * 7) == -(2**63)
    """

    __slots__ = ()

    WIDTH: ClassVar[int] = 8
    MIN: ClassVar[int] = -(2**63)
    MAX: ClassVar[int] = 2**63 - 1


INT32: Final[Int32Codec] = Int32Codec()
"""The shared 32-bit integer codec. Example: ``INT32.encode(-1) == b"\\xff" * 4``."""

INT64: Final[Int64Codec] = Int64Codec()
"""The shared 64-bit integer codec. Example: ``INT64.decode(INT64.encode(7)) == 7``."""


# --------------------------------------------------------------------------- JSON


class JsonCodec:
    """JSON values via the standard library, encoded as UTF-8.

    Defaults: compact separators (``","`` and ``":"``), ``ensure_ascii=False`` (non-ASCII text
    is stored as UTF-8, not ``\\u`` escapes) and ``allow_nan=False`` (``NaN``/``Infinity`` are
    not JSON and other languages reject them). ``dumps_kwargs`` and ``loads_kwargs`` are
    passed to :func:`json.dumps` / :func:`json.loads` and override those defaults (for example
    ``{"sort_keys": True}`` for byte-stable dictionaries, or ``{"cls": MyEncoder}``).

    Values that cannot be serialized and bytes that are not valid UTF-8 JSON raise
    :class:`~etcd_recipes.errors.CodecError`. Decoding returns plain JSON types (tuples come
    back as lists); use :class:`PydanticCodec` for typed records.

    Example::

        from etcd_recipes import JSON, JsonCodec

        assert JSON.encode({"n": 1, "s": "é"}) == b'{"n":1,"s":"\\xc3\\xa9"}'
        ordered = JsonCodec(dumps_kwargs={"sort_keys": True})
        assert ordered.encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
        assert JSON.decode(b'{"a":[1,2]}') == {"a": [1, 2]}
    """

    __slots__ = ("_dumps_kwargs", "_loads_kwargs")

    _DEFAULT_DUMPS: ClassVar[Mapping[str, Any]] = {
        "separators": (",", ":"),
        "ensure_ascii": False,
        "allow_nan": False,
    }

    def __init__(
        self,
        *,
        dumps_kwargs: Mapping[str, Any] | None = None,
        loads_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._dumps_kwargs: dict[str, Any] = {**self._DEFAULT_DUMPS, **(dumps_kwargs or {})}
        self._loads_kwargs: dict[str, Any] = dict(loads_kwargs or {})

    def encode(self, value: Any) -> bytes:
        """Return ``value`` serialized as compact UTF-8 JSON."""
        try:
            text = json.dumps(value, **self._dumps_kwargs)
            return text.encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise CodecError(
                f"JsonCodec cannot serialize value of type {_type_name(value)}: {exc}"
            ) from exc

    def decode(self, data: bytes) -> Any:
        """Return the value parsed from UTF-8 JSON ``data``."""
        raw = _require_bytes(self, data)
        try:
            return json.loads(raw.decode("utf-8"), **self._loads_kwargs)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError/UnicodeError are ValueErrors
            raise CodecError(f"value is not valid UTF-8 JSON: {exc}") from exc

    def __repr__(self) -> str:
        return "JsonCodec()"


JSON: Final[JsonCodec] = JsonCodec()
"""The shared JSON codec with default settings. Example: ``JSON.encode({}) == b"{}"``."""


# --------------------------------------------------------------------------- pydantic


class PydanticCodec(Generic[M]):
    """Pydantic v2 models, stored as the model's JSON (``model_dump_json``) in UTF-8.

    Pydantic is an optional dependency, imported only when a ``PydanticCodec`` is created;
    without it (or with pydantic 1) the constructor raises
    :class:`~etcd_recipes.errors.CodecError` telling you to ``pip install pydantic``.

    ``encode`` accepts instances of ``model`` (including subclasses); ``decode`` validates
    with ``model.model_validate_json``, and validation failures raise
    :class:`~etcd_recipes.errors.CodecError` carrying pydantic's message.

    Example::

        import pydantic

        from etcd_recipes import PydanticCodec

        class Job(pydantic.BaseModel):
            id: int
            name: str

        jobs = PydanticCodec(Job)
        assert jobs.encode(Job(id=1, name="x")) == b'{"id":1,"name":"x"}'
        assert jobs.decode(b'{"id":1,"name":"x"}') == Job(id=1, name="x")
    """

    __slots__ = ("_model",)

    def __init__(self, model: type[M]) -> None:
        try:
            import pydantic
        except ImportError as exc:
            raise CodecError(
                "PydanticCodec needs pydantic v2, which is not installed: pip install pydantic"
            ) from exc
        base = getattr(pydantic, "BaseModel", None)
        if base is None or not hasattr(base, "model_validate_json"):
            version = getattr(pydantic, "VERSION", "unknown")
            raise CodecError(
                f"PydanticCodec needs pydantic v2, found version {version}: "
                "pip install 'pydantic>=2'"
            )
        if not (isinstance(model, type) and issubclass(model, base)):
            raise CodecError(f"PydanticCodec expects a pydantic BaseModel subclass, got {model!r}")
        self._model: type[M] = model

    @property
    def model(self) -> type[M]:
        """The model class values are decoded into.

        Example::

            import pydantic

            from etcd_recipes import PydanticCodec

            Job = pydantic.create_model("Job", id=(int, ...))
            assert PydanticCodec(Job).model is Job
        """
        return self._model

    def encode(self, value: M) -> bytes:
        """Return ``value.model_dump_json()`` as UTF-8 bytes.

        Example::

            import pydantic

            from etcd_recipes import PydanticCodec

            Job = pydantic.create_model("Job", id=(int, ...), name=(str, ...))
            assert PydanticCodec(Job).encode(Job(id=1, name="x")) == b'{"id":1,"name":"x"}'
        """
        if not isinstance(value, self._model):
            raise CodecError(
                f"PydanticCodec({self._model.__name__}).encode expects a "
                f"{self._model.__name__} instance, got {_type_name(value)}"
            )
        try:
            return value.model_dump_json().encode("utf-8")
        except ValueError as exc:  # PydanticSerializationError is a ValueError
            raise CodecError(f"cannot serialize {self._model.__name__} instance: {exc}") from exc

    def decode(self, data: bytes) -> M:
        """Return a validated ``model`` instance parsed from JSON ``data``.

        Example::

            import pydantic

            from etcd_recipes import PydanticCodec

            Job = pydantic.create_model("Job", id=(int, ...), name=(str, ...))
            assert PydanticCodec(Job).decode(b'{"id":1,"name":"x"}') == Job(id=1, name="x")
        """
        raw = _require_bytes(self, data)
        try:
            return self._model.model_validate_json(raw)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            raise CodecError(f"value is not a valid {self._model.__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"PydanticCodec({self._model.__qualname__})"


# --------------------------------------------------------------------------- helpers


def as_codec(codec: Codec[ValueT] | None) -> Codec[ValueT]:
    """Return ``codec``, or :data:`BYTES` when it is ``None`` (the library's default).

    Raises :class:`~etcd_recipes.errors.InvalidArgumentError` if ``codec`` lacks ``encode``
    or ``decode``, or is a codec *class* rather than an instance.

    Example::

        from etcd_recipes import BYTES, INT64, as_codec

        assert as_codec(None) is BYTES
        assert as_codec(INT64) is INT64
    """
    if codec is None:
        return cast("Codec[ValueT]", BYTES)  # nothing binds ValueT: bytes
    if isinstance(codec, type):
        raise InvalidArgumentError(
            f"codec must be an instance, not the class {codec.__name__}; "
            f"pass {codec.__name__}() or a ready instance such as UTF8"
        )
    if not isinstance(codec, Codec):
        raise InvalidArgumentError(
            f"codec must have encode() and decode() methods, got {_type_name(codec)}"
        )
    return codec


def to_bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    """Return a key or value as ``bytes``: ``str`` is encoded as UTF-8, bytes-likes are copied.

    Anything else raises :class:`~etcd_recipes.errors.InvalidArgumentError` naming its type;
    so does a ``str`` that is not encodable as UTF-8 (lone surrogates).

    Example::

        from etcd_recipes import to_bytes

        assert to_bytes("/locks/é") == b"/locks/\\xc3\\xa9"
        assert to_bytes(bytearray(b"k")) == b"k"
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(f"text is not encodable as UTF-8: {exc}") from exc
    if isinstance(data, _BytesLike):
        return bytes(data)
    raise InvalidArgumentError(
        f"expected str, bytes, bytearray or memoryview, got {_type_name(data)}"
    )


if TYPE_CHECKING:  # static conformance checks of the built-ins against the protocol
    _bytes_codec: Codec[bytes] = BYTES
    _str_codec: Codec[str] = UTF8
    _int32_codec: Codec[int] = INT32
    _int64_codec: Codec[int] = INT64
    _json_codec: Codec[Any] = JSON
