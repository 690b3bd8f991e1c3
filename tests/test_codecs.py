"""Unit tests for :mod:`etcd_recipes.codecs` (no etcd needed)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from etcd_recipes import codecs as codecs_module
from etcd_recipes.codecs import (
    BYTES,
    INT32,
    INT64,
    JSON,
    UTF8,
    BytesCodec,
    Codec,
    Int32Codec,
    Int64Codec,
    JsonCodec,
    PydanticCodec,
    StrCodec,
    as_codec,
    to_bytes,
)
from etcd_recipes.errors import CodecError, EtcdRecipeError, InvalidArgumentError

try:
    import pydantic
except ImportError:  # pragma: no cover - pydantic is an optional dependency
    pydantic = None  # type: ignore[assignment]

requires_pydantic = pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")

if pydantic is not None:

    class Job(pydantic.BaseModel):
        id: int
        name: str
        tags: list[str] = pydantic.Field(default_factory=list)

    class SpecialJob(Job):
        priority: int = 0


def assert_codec_error(exc_info: pytest.ExceptionInfo[CodecError], *fragments: str) -> None:
    exc = exc_info.value
    assert isinstance(exc, CodecError)
    assert isinstance(exc, InvalidArgumentError)
    assert isinstance(exc, ValueError)
    assert isinstance(exc, EtcdRecipeError)
    message = str(exc)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# --------------------------------------------------------------------------- module surface


def test_public_names() -> None:
    assert set(codecs_module.__all__) == {
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
    }
    for name in codecs_module.__all__:
        assert getattr(codecs_module, name).__doc__, name


def test_ready_instances_have_expected_types() -> None:
    assert isinstance(BYTES, BytesCodec)
    assert isinstance(UTF8, StrCodec)
    assert UTF8.encoding == "utf-8"
    assert isinstance(INT32, Int32Codec)
    assert isinstance(INT64, Int64Codec)
    assert isinstance(JSON, JsonCodec)


@pytest.mark.parametrize("codec", [BYTES, UTF8, INT32, INT64, JSON])
def test_builtins_satisfy_runtime_protocol(codec: object) -> None:
    assert isinstance(codec, Codec)


@requires_pydantic
def test_pydantic_codec_satisfies_runtime_protocol() -> None:
    assert isinstance(PydanticCodec(Job), Codec)


def test_custom_structural_codec_is_a_codec() -> None:
    class Upper:
        def encode(self, value: str) -> bytes:
            return value.upper().encode()

        def decode(self, data: bytes) -> str:
            return data.decode()

    codec = Upper()
    assert isinstance(codec, Codec)
    assert as_codec(codec) is codec


def test_reprs() -> None:
    assert repr(BYTES) == "BytesCodec()"
    assert repr(UTF8) == "StrCodec('utf-8')"
    assert repr(INT32) == "Int32Codec()"
    assert repr(INT64) == "Int64Codec()"
    assert repr(JSON) == "JsonCodec()"


def test_importing_codecs_does_not_need_pydantic() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["pydantic"] = None  # makes "import pydantic" raise ImportError
        import etcd_recipes.codecs as c
        assert c.JSON.decode(c.JSON.encode([1])) == [1]
        try:
            c.PydanticCodec(object)
        except c.CodecError as exc:
            assert "pip install pydantic" in str(exc), exc
            assert isinstance(exc.__cause__, ImportError)
        else:
            raise AssertionError("PydanticCodec should fail without pydantic")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("value", [b"", b"abc", bytearray(b"abc"), memoryview(b"abc"), b"\x00\xff"])
def test_bytes_encode_accepts_bytes_likes(value: bytes | bytearray | memoryview) -> None:
    encoded = BYTES.encode(value)
    assert type(encoded) is bytes
    assert encoded == bytes(value)
    assert BYTES.decode(encoded) == bytes(value)


def test_bytes_encode_copies_mutable_input() -> None:
    buf = bytearray(b"abc")
    encoded = BYTES.encode(buf)
    buf[0] = ord("z")
    assert encoded == b"abc"


def test_bytes_encode_rejects_str_with_hint() -> None:
    with pytest.raises(CodecError) as exc_info:
        BYTES.encode("text")  # type: ignore[arg-type]
    assert_codec_error(exc_info, "expects bytes", "got str", "UTF8")


@pytest.mark.parametrize("value", [1, None, [1, 2], 1.5])
def test_bytes_encode_rejects_other_types(value: object) -> None:
    with pytest.raises(CodecError) as exc_info:
        BYTES.encode(value)  # type: ignore[arg-type]
    assert_codec_error(exc_info, "BytesCodec.encode", type(value).__name__)


def test_bytes_decode_rejects_non_bytes() -> None:
    with pytest.raises(CodecError) as exc_info:
        BYTES.decode("abc")  # type: ignore[arg-type]
    assert_codec_error(exc_info, "BytesCodec.decode expects bytes", "got str")


# --------------------------------------------------------------------------- text


@pytest.mark.parametrize("text", ["", "hello", "café", "日本語", "emoji 🎉", "\x00nul"])
def test_utf8_round_trip(text: str) -> None:
    assert UTF8.decode(UTF8.encode(text)) == text


def test_utf8_byte_layout() -> None:
    assert UTF8.encode("é") == b"\xc3\xa9"
    assert UTF8.decode(b"caf\xc3\xa9") == "café"


def test_utf8_decode_accepts_bytearray() -> None:
    assert UTF8.decode(bytearray(b"ok")) == "ok"  # type: ignore[arg-type]


def test_str_codec_other_encoding() -> None:
    latin1 = StrCodec("latin-1")
    assert latin1.encoding == "iso8859-1"
    assert latin1.encode("é") == b"\xe9"
    assert latin1.decode(b"\xe9") == "é"


def test_str_codec_normalises_and_compares_encodings() -> None:
    assert StrCodec("UTF8") == UTF8
    assert hash(StrCodec("utf_8")) == hash(UTF8)
    assert StrCodec("latin-1") != UTF8


def test_str_codec_unknown_encoding() -> None:
    with pytest.raises(CodecError) as exc_info:
        StrCodec("no-such-encoding")
    assert_codec_error(exc_info, "unknown text encoding", "no-such-encoding")
    assert isinstance(exc_info.value.__cause__, LookupError)


def test_utf8_decode_invalid_bytes() -> None:
    with pytest.raises(CodecError) as exc_info:
        UTF8.decode(b"\xff\xfe")
    assert_codec_error(exc_info, "not valid utf-8")
    assert isinstance(exc_info.value.__cause__, UnicodeDecodeError)


def test_str_encode_unencodable_character() -> None:
    with pytest.raises(CodecError) as exc_info:
        StrCodec("ascii").encode("é")
    assert_codec_error(exc_info, "cannot encode text as ascii")
    assert isinstance(exc_info.value.__cause__, UnicodeEncodeError)


def test_utf8_encode_lone_surrogate() -> None:
    with pytest.raises(CodecError) as exc_info:
        UTF8.encode("\ud800")
    assert_codec_error(exc_info, "utf-8")


@pytest.mark.parametrize("value", [b"bytes", 1, None])
def test_str_encode_rejects_non_str(value: object) -> None:
    with pytest.raises(CodecError) as exc_info:
        UTF8.encode(value)  # type: ignore[arg-type]
    assert_codec_error(exc_info, "StrCodec.encode expects str", type(value).__name__)


@given(st.text())
def test_utf8_round_trip_property(text: str) -> None:
    # st.text() may generate lone surrogates, which UTF-8 cannot represent.
    try:
        encoded = UTF8.encode(text)
    except CodecError:
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")
        return
    assert UTF8.decode(encoded) == text


# --------------------------------------------------------------------------- integers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00\x00\x00\x00"),
        (1, b"\x00\x00\x00\x01"),
        (-1, b"\xff\xff\xff\xff"),
        (256, b"\x00\x00\x01\x00"),
        (0x01020304, b"\x01\x02\x03\x04"),
        (2**31 - 1, b"\x7f\xff\xff\xff"),
        (-(2**31), b"\x80\x00\x00\x00"),
        (-2, b"\xff\xff\xff\xfe"),
    ],
)
def test_int32_byte_layout(value: int, expected: bytes) -> None:
    # Same layout as Guava Ints.toByteArray(value).
    assert INT32.encode(value) == expected
    assert INT32.decode(expected) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00" * 8),
        (1, b"\x00" * 7 + b"\x01"),
        (-1, b"\xff" * 8),
        (0x0102030405060708, b"\x01\x02\x03\x04\x05\x06\x07\x08"),
        (2**63 - 1, b"\x7f" + b"\xff" * 7),
        (-(2**63), b"\x80" + b"\x00" * 7),
        (2**32, b"\x00\x00\x00\x01\x00\x00\x00\x00"),
    ],
)
def test_int64_byte_layout(value: int, expected: bytes) -> None:
    # Same layout as Guava Longs.toByteArray(value).
    assert INT64.encode(value) == expected
    assert INT64.decode(expected) == value


def test_int_codec_bounds() -> None:
    assert (Int32Codec.WIDTH, Int32Codec.MIN, Int32Codec.MAX) == (4, -(2**31), 2**31 - 1)
    assert (Int64Codec.WIDTH, Int64Codec.MIN, Int64Codec.MAX) == (8, -(2**63), 2**63 - 1)


@pytest.mark.parametrize(
    ("codec", "value", "bits"),
    [
        (INT32, 2**31, "32-bit"),
        (INT32, -(2**31) - 1, "32-bit"),
        (INT64, 2**63, "64-bit"),
        (INT64, -(2**63) - 1, "64-bit"),
        (INT64, 10**30, "64-bit"),
    ],
)
def test_int_encode_out_of_range(codec: Codec[int], value: int, bits: str) -> None:
    with pytest.raises(CodecError) as exc_info:
        codec.encode(value)
    assert_codec_error(exc_info, str(value), "out of range", bits)
    assert isinstance(exc_info.value.__cause__, OverflowError)


@pytest.mark.parametrize("codec", [INT32, INT64])
@pytest.mark.parametrize("value", [True, False])
def test_int_encode_rejects_bool(codec: Codec[int], value: bool) -> None:
    with pytest.raises(CodecError) as exc_info:
        codec.encode(value)
    assert_codec_error(exc_info, "bool")


@pytest.mark.parametrize("codec", [INT32, INT64])
@pytest.mark.parametrize("value", [1.0, "1", b"\x01", None])
def test_int_encode_rejects_non_int(codec: Codec[int], value: object) -> None:
    with pytest.raises(CodecError) as exc_info:
        codec.encode(value)  # type: ignore[arg-type]
    assert_codec_error(exc_info, "expects int", type(value).__name__)


def test_int_encode_accepts_index_objects() -> None:
    class Index:
        def __index__(self) -> int:
            return 7

    assert INT64.encode(Index()) == b"\x00" * 7 + b"\x07"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("codec", "data", "expected", "actual"),
    [
        (INT32, b"", "4", "0"),
        (INT32, b"\x00" * 3, "4", "3"),
        (INT32, b"\x00" * 8, "4", "8"),
        (INT64, b"\x00" * 4, "8", "4"),
        (INT64, b"\x00" * 9, "8", "9"),
    ],
)
def test_int_decode_wrong_length(
    codec: Codec[int], data: bytes, expected: str, actual: str
) -> None:
    with pytest.raises(CodecError) as exc_info:
        codec.decode(data)
    assert_codec_error(exc_info, f"exactly {expected} bytes", f"got {actual}")


def test_int_decode_rejects_non_bytes() -> None:
    with pytest.raises(CodecError) as exc_info:
        INT64.decode(1)  # type: ignore[arg-type]
    assert_codec_error(exc_info, "Int64Codec.decode expects bytes", "got int")


def test_int_decode_accepts_memoryview() -> None:
    assert INT32.decode(memoryview(b"\x00\x00\x00\x2a")) == 42  # type: ignore[arg-type]


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_int32_round_trip_property(value: int) -> None:
    encoded = INT32.encode(value)
    assert len(encoded) == 4
    assert INT32.decode(encoded) == value
    # Two's complement big-endian, as Guava/Java DataOutput write it.
    assert encoded == (value & 0xFFFFFFFF).to_bytes(4, "big")


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int64_round_trip_property(value: int) -> None:
    encoded = INT64.encode(value)
    assert len(encoded) == 8
    assert INT64.decode(encoded) == value
    assert encoded == (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")


@given(st.binary(min_size=8, max_size=8))
def test_int64_decode_encode_property(data: bytes) -> None:
    assert INT64.encode(INT64.decode(data)) == data


@given(st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1))
def test_int64_out_of_range_property(value: int) -> None:
    with pytest.raises(CodecError):
        INT64.encode(value)


def test_int_order_preserved_for_non_negative_values() -> None:
    # Big-endian: for non-negative values byte order equals numeric order.
    values = [0, 1, 255, 256, 2**32, 2**63 - 1]
    encoded = [INT64.encode(v) for v in values]
    assert encoded == sorted(encoded)


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -5, 1.5, "s", [], {}, [1, "a", None], {"a": {"b": [1, 2.5, "é"]}}],
)
def test_json_round_trip(value: Any) -> None:
    assert JSON.decode(JSON.encode(value)) == value


def test_json_is_compact_utf8_and_not_ascii_escaped() -> None:
    assert JSON.encode({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'
    assert JSON.encode("é") == '"é"'.encode()
    assert JSON.encode("日") == b'"\xe6\x97\xa5"'


def test_json_tuple_comes_back_as_list() -> None:
    assert JSON.decode(JSON.encode((1, 2))) == [1, 2]


def test_json_dumps_kwargs_override_defaults() -> None:
    sorted_codec = JsonCodec(dumps_kwargs={"sort_keys": True})
    assert sorted_codec.encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    spaced = JsonCodec(dumps_kwargs={"separators": (", ", ": ")})
    assert spaced.encode({"a": [1, 2]}) == b'{"a": [1, 2]}'
    ascii_codec = JsonCodec(dumps_kwargs={"ensure_ascii": True})
    assert ascii_codec.encode("é") == b'"\\u00e9"'


def test_json_loads_kwargs() -> None:
    from decimal import Decimal

    codec = JsonCodec(loads_kwargs={"parse_float": Decimal})
    assert codec.decode(b"[1.10]") == [Decimal("1.10")]


def test_json_kwargs_are_copied() -> None:
    kwargs: dict[str, Any] = {"sort_keys": True}
    codec = JsonCodec(dumps_kwargs=kwargs)
    kwargs["sort_keys"] = False
    assert codec.encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


@pytest.mark.parametrize("value", [object(), {1, 2}, b"bytes", {"k": object()}])
def test_json_encode_non_serializable(value: object) -> None:
    with pytest.raises(CodecError) as exc_info:
        JSON.encode(value)
    assert_codec_error(exc_info, "JsonCodec cannot serialize", type(value).__name__)
    assert isinstance(exc_info.value.__cause__, TypeError)


@pytest.mark.parametrize("value", [math.nan, math.inf, [-math.inf]])
def test_json_encode_rejects_nan_and_infinity(value: object) -> None:
    with pytest.raises(CodecError) as exc_info:
        JSON.encode(value)
    assert_codec_error(exc_info, "JsonCodec cannot serialize")


def test_json_encode_circular_reference() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(CodecError) as exc_info:
        JSON.encode(value)
    assert_codec_error(exc_info, "Circular reference")


@pytest.mark.parametrize("data", [b"", b"{", b"{'a': 1}", b"nope", b"[1,]", b'{"a":1}x'])
def test_json_decode_invalid_json(data: bytes) -> None:
    with pytest.raises(CodecError) as exc_info:
        JSON.decode(data)
    assert_codec_error(exc_info, "not valid UTF-8 JSON")
    assert isinstance(exc_info.value.__cause__, ValueError)


def test_json_decode_invalid_utf8() -> None:
    with pytest.raises(CodecError) as exc_info:
        JSON.decode(b'"\xff"')
    assert_codec_error(exc_info, "not valid UTF-8 JSON")
    assert isinstance(exc_info.value.__cause__, UnicodeDecodeError)


def test_json_decode_rejects_non_bytes() -> None:
    with pytest.raises(CodecError) as exc_info:
        JSON.decode("{}")  # type: ignore[arg-type]
    assert_codec_error(exc_info, "JsonCodec.decode expects bytes", "got str")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children)
        | st.dictionaries(st.text(alphabet=st.characters(exclude_categories=["Cs"])), children)
    ),
    max_leaves=20,
)


@given(json_values)
def test_json_round_trip_property(value: Any) -> None:
    assert JSON.decode(JSON.encode(value)) == value


# --------------------------------------------------------------------------- pydantic


@requires_pydantic
def test_pydantic_repr() -> None:
    assert repr(PydanticCodec(Job)) == "PydanticCodec(Job)"


@requires_pydantic
def test_pydantic_round_trip() -> None:
    codec = PydanticCodec(Job)
    job = Job(id=1, name="büro", tags=["a", "b"])
    data = codec.encode(job)
    assert data == b'{"id":1,"name":"b\xc3\xbcro","tags":["a","b"]}'
    assert data == job.model_dump_json().encode()
    decoded = codec.decode(data)
    assert decoded == job
    assert type(decoded) is Job
    assert codec.model is Job


@requires_pydantic
def test_pydantic_encode_accepts_subclass_instance() -> None:
    codec = PydanticCodec(Job)
    data = codec.encode(SpecialJob(id=2, name="x", priority=9))
    assert codec.decode(data) == Job(id=2, name="x")


@requires_pydantic
def test_pydantic_decode_validation_failure() -> None:
    codec = PydanticCodec(Job)
    with pytest.raises(CodecError) as exc_info:
        codec.decode(b'{"id":"not-a-number","name":"x"}')
    assert_codec_error(exc_info, "not a valid Job", "id")
    assert isinstance(exc_info.value.__cause__, pydantic.ValidationError)


@requires_pydantic
def test_pydantic_decode_missing_field() -> None:
    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(Job).decode(b'{"id":1}')
    assert_codec_error(exc_info, "not a valid Job", "name")


@requires_pydantic
def test_pydantic_decode_invalid_json() -> None:
    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(Job).decode(b"{not json")
    assert_codec_error(exc_info, "not a valid Job")


@requires_pydantic
def test_pydantic_decode_rejects_non_bytes() -> None:
    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(Job).decode({"id": 1})  # type: ignore[arg-type]
    assert_codec_error(exc_info, "PydanticCodec.decode expects bytes", "got dict")


@requires_pydantic
def test_pydantic_encode_rejects_wrong_type() -> None:
    class Other(pydantic.BaseModel):
        id: int

    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(Job).encode(Other(id=1))  # type: ignore[arg-type]
    assert_codec_error(exc_info, "expects a Job instance", "Other")
    with pytest.raises(CodecError):
        PydanticCodec(Job).encode({"id": 1, "name": "x"})  # type: ignore[arg-type]


@requires_pydantic
def test_pydantic_encode_serialization_failure() -> None:
    class Holder(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
        thing: object

    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(Holder).encode(Holder(thing=object()))
    assert_codec_error(exc_info, "cannot serialize Holder")


@requires_pydantic
@pytest.mark.parametrize("model", [dict, int, "Job", "a Job instance"])
def test_pydantic_rejects_non_model(model: Any) -> None:
    if model == "a Job instance":
        model = Job(id=1, name="x")
    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(model)
    assert_codec_error(exc_info, "BaseModel subclass")


def test_pydantic_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic", None)
    with pytest.raises(CodecError) as exc_info:
        PydanticCodec(object)  # type: ignore[type-var]
    assert_codec_error(exc_info, "pip install pydantic")
    assert isinstance(exc_info.value.__cause__, ImportError)


@requires_pydantic
@given(st.integers(), st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_pydantic_round_trip_property(job_id: int, name: str) -> None:
    codec = PydanticCodec(Job)
    job = Job(id=job_id, name=name)
    assert codec.decode(codec.encode(job)) == job


# --------------------------------------------------------------------------- as_codec


def test_as_codec_none_is_bytes() -> None:
    assert as_codec(None) is BYTES


@pytest.mark.parametrize("codec", [BYTES, UTF8, INT32, INT64, JSON])
def test_as_codec_returns_given_codec(codec: Codec[Any]) -> None:
    assert as_codec(codec) is codec


def test_as_codec_rejects_codec_class() -> None:
    with pytest.raises(InvalidArgumentError) as exc_info:
        as_codec(StrCodec)  # type: ignore[arg-type]
    assert "instance" in str(exc_info.value)
    assert "StrCodec()" in str(exc_info.value)


@pytest.mark.parametrize("value", [b"x", "utf-8", 1, object()])
def test_as_codec_rejects_non_codec(value: object) -> None:
    with pytest.raises(InvalidArgumentError) as exc_info:
        as_codec(value)  # type: ignore[arg-type]
    assert isinstance(exc_info.value, ValueError)
    assert "encode() and decode()" in str(exc_info.value)
    assert type(value).__name__ in str(exc_info.value)


# --------------------------------------------------------------------------- to_bytes


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("", b""),
        ("/locks/a", b"/locks/a"),
        ("/é", b"/\xc3\xa9"),
        (b"\x00\xff", b"\x00\xff"),
        (bytearray(b"ab"), b"ab"),
        (memoryview(b"ab"), b"ab"),
    ],
)
def test_to_bytes(data: bytes | bytearray | memoryview | str, expected: bytes) -> None:
    result = to_bytes(data)
    assert type(result) is bytes
    assert result == expected


def test_to_bytes_returns_bytes_unchanged() -> None:
    data = b"key"
    assert to_bytes(data) is data


def test_to_bytes_copies_bytearray() -> None:
    buf = bytearray(b"key")
    result = to_bytes(buf)
    buf[0] = ord("z")
    assert result == b"key"


@pytest.mark.parametrize("data", [1, None, 1.5, ["a"], object()])
def test_to_bytes_rejects_other_types(data: object) -> None:
    with pytest.raises(InvalidArgumentError) as exc_info:
        to_bytes(data)  # type: ignore[arg-type]
    assert isinstance(exc_info.value, ValueError)
    assert not isinstance(exc_info.value, CodecError)
    assert type(data).__name__ in str(exc_info.value)
    assert "expected str, bytes" in str(exc_info.value)


def test_to_bytes_rejects_lone_surrogate() -> None:
    with pytest.raises(InvalidArgumentError) as exc_info:
        to_bytes("\udcff")
    assert "UTF-8" in str(exc_info.value)
    assert isinstance(exc_info.value.__cause__, UnicodeEncodeError)
