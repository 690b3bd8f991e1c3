"""ServiceInstance: the JVM library's JSON byte for byte (golden files), typed payloads,
defaults and leniency when decoding, and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from etcd_recipes import (
    JSON,
    CodecError,
    InvalidArgumentError,
    PydanticCodec,
    ServiceInstance,
    ServiceType,
)

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.json"))


def test_there_are_golden_files():
    assert len(GOLDEN) >= 4


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_round_trips_byte_for_byte(path):
    data = path.read_bytes()
    assert not data.endswith(b"\n")
    instance = ServiceInstance.from_json(data)
    assert instance.to_json() == data
    doc = json.loads(data)
    assert list(doc) == [
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
    ]
    assert instance.id == doc["id"] and instance.payload == doc["jsonPayload"]
    assert instance.service_type is ServiceType(doc["serviceType"])


def test_golden_typed_payload_round_trips_through_the_json_codec():
    data = (Path(__file__).parent / "golden" / "json_payload.json").read_bytes()
    instance = ServiceInstance.from_json(data, JSON)
    assert instance.payload == {"zone": "eu-west-1", "weight": 3, "tags": ["a", "b"]}
    assert instance.to_json(JSON) == data


def test_the_reference_example_fields():
    i = ServiceInstance.from_json(
        (Path(__file__).parent / "golden" / "reference_example.json").read_bytes()
    )
    assert (i.name, i.payload, i.address, i.port, i.ssl_port) == ("svc", "{...}", "", -1, -1)
    assert (i.registration_time_utc, i.uri, i.enabled, i.id) == (1752192000123, "", True, "Ab3x9Qz")


def test_pydantic_payload():
    pydantic = pytest.importorskip("pydantic")

    class Meta(pydantic.BaseModel):
        zone: str
        weight: int = 1

    codec = PydanticCodec(Meta)
    i = ServiceInstance("orders", Meta(zone="eu"), port=80)
    back = ServiceInstance.from_json(i.to_json(codec), codec)
    assert back == i and back.payload.zone == "eu" and back.id == i.id


def test_equality_ignores_the_id_but_the_id_round_trips():
    a = ServiceInstance("s", "p", registration_time_utc=5, id="aaaaaaa")
    b = dataclasses.replace(a, id="bbbbbbb")
    assert a == b and a.id != b.id and hash(a) == hash(b)
    assert dataclasses.replace(a, port=80) != a
    assert ServiceInstance.from_json(a.to_json()).id == "aaaaaaa"


def test_defaults():
    i = ServiceInstance("s", "")
    assert (i.port, i.ssl_port, i.service_type, i.enabled, i.uri) == (
        -1,
        -1,
        ServiceType.DYNAMIC,
        True,
        "",
    )
    assert len(i.id) == 7 and i.id.isalnum() and i.registration_time_utc > 1_600_000_000_000


def test_decoding_fills_defaults_and_ignores_unknown_fields():
    i = ServiceInstance.from_json(b'{"name":"s","jsonPayload":"x","future":{"a":1}}')
    assert (i.port, i.ssl_port, i.enabled, i.service_type) == (-1, -1, True, ServiceType.DYNAMIC)
    assert len(i.id) == 7 and i.registration_time_utc > 0  # as the JVM library back-fills


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[1, 2]",
        b'{"jsonPayload":"x"}',  # no name
        b'{"name":"s"}',  # no payload
        b'{"name":"s","jsonPayload":{"a":1}}',  # the payload must be a string
        b'{"name":"s","jsonPayload":"x","port":70000}',
        b'{"name":"s","jsonPayload":"x","port":"80"}',
        b'{"name":"s","jsonPayload":"x","port":true}',
        b'{"name":"s","jsonPayload":"x","sslPort":-2}',
        b'{"name":"s","jsonPayload":"x","serviceType":"ROGUE"}',
        b'{"name":"a/b","jsonPayload":"x"}',
        b'{"name":"s","jsonPayload":"x","id":""}',
        b'{"name":"s","jsonPayload":"x","enabled":"yes"}',
        b"\xff\xfe",
    ],
)
def test_bad_records_raise_codec_error(data):
    with pytest.raises(CodecError):
        ServiceInstance.from_json(data)


def test_a_payload_the_codec_rejects_is_a_codec_error():
    with pytest.raises(CodecError):
        ServiceInstance.from_json(b'{"name":"s","jsonPayload":"{not json"}', JSON)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": 0},
        {"port": 65536},
        {"ssl_port": -5},
        {"port": True},
        {"port": 80.0},
        {"name": ""},
        {"name": "a/b"},
        {"id": "x/y"},
        {"registration_time_utc": -1},
        {"service_type": "DYNAMIC"},
        {"enabled": 1},
    ],
)
def test_bad_fields_are_refused_at_construction(kwargs):
    args = {"name": "s", "payload": ""} | kwargs
    with pytest.raises(InvalidArgumentError):
        ServiceInstance(**args)


def test_a_non_text_payload_needs_a_codec():
    with pytest.raises(CodecError, match="codec"):
        ServiceInstance("s", {"a": 1}).to_json()
    with pytest.raises(CodecError, match="UTF-8"):
        ServiceInstance("s", b"\xff").to_json()


text = st.text(st.characters(blacklist_categories=("Cs",)))


@given(
    name=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/"), min_size=1),
    payload=text,
    address=text,
    uri=text,
    port=st.integers(1, 65535) | st.just(-1),
    when=st.integers(0, 2**63 - 1),
    kind=st.sampled_from(list(ServiceType)),
    enabled=st.booleans(),
)
def test_any_instance_round_trips(name, payload, address, uri, port, when, kind, enabled):
    i = ServiceInstance(
        name,
        payload,
        address=address,
        port=port,
        ssl_port=port,
        registration_time_utc=when,
        service_type=kind,
        uri=uri,
        enabled=enabled,
    )
    data = i.to_json()
    back = ServiceInstance.from_json(data)
    assert back == i and back.id == i.id and back.to_json() == data
