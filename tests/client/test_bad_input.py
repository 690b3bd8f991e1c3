"""Bad input is rejected with a specific, catchable error -- before any I/O where possible,
otherwise mapped from the server's answer."""

from __future__ import annotations

import pytest

from etcd_recipes import (
    Cmp,
    DuplicateKeyError,
    EmptyKeyError,
    InvalidArgumentError,
    InvalidEndpointError,
    Op,
    TooManyOperationsError,
    ValueTooLargeError,
    connect,
)


async def test_empty_key(etcd_client):
    for call in (
        lambda: etcd_client.get(""),
        lambda: etcd_client.put("", b"x"),
        lambda: etcd_client.put(b"", b"x"),
        lambda: etcd_client.delete(""),
        lambda: etcd_client.range("", prefix=True),
    ):
        with pytest.raises(EmptyKeyError):
            await call()
    with pytest.raises(EmptyKeyError):
        Op.put("", b"x")
    with pytest.raises(EmptyKeyError):
        Cmp.version("")
    with pytest.raises(EmptyKeyError):
        etcd_client.watch("")
    # EmptyKeyError is also a ValueError.
    with pytest.raises(ValueError):
        await etcd_client.get("")


async def test_value_over_the_server_limit(etcd_client, etcd_prefix):
    key = etcd_prefix + "big"
    with pytest.raises(ValueTooLargeError) as info:
        await etcd_client.put(key, b"x" * (2 * 1024 * 1024))
    assert "large" in str(info.value)
    assert await etcd_client.get(key) is None
    # Just under the default 1.5 MiB request limit is fine.
    await etcd_client.put(key, b"y" * (1024 * 1024))
    assert len((await etcd_client.get(key)).value) == 1024 * 1024  # type: ignore[union-attr]


async def test_too_many_operations_in_txn(etcd_client, etcd_prefix):
    ops = [Op.put(etcd_prefix + f"k{i}", b"v") for i in range(129)]
    with pytest.raises(TooManyOperationsError):
        await etcd_client.txn([], ops)
    assert await etcd_client.count(etcd_prefix) == 0
    # 128 is the limit and is accepted.
    result = await etcd_client.txn([], ops[:128])
    assert result.succeeded
    assert len(result.responses) == 128


async def test_duplicate_key_in_txn(etcd_client, etcd_prefix):
    key = etcd_prefix + "dup"
    with pytest.raises(DuplicateKeyError):
        await etcd_client.txn([], [Op.put(key, b"1"), Op.put(key, b"2")])
    with pytest.raises(DuplicateKeyError):
        await etcd_client.txn([], [Op.put(key, b"1"), Op.delete(key)])
    assert await etcd_client.get(key) is None


@pytest.mark.parametrize(
    "endpoints",
    [
        "",
        "   ",
        "host",
        "host:notaport",
        "host:",
        ":2379",
        "host:0",
        "host:70000",
        "ftp://x:1",
        "http://x:1/path",
        "[::1]",
        ["http://a:1", "https://b:2"],
        "http://a:1,https://b:2",
        [],
    ],
)
async def test_malformed_endpoints_rejected_at_connect(endpoints):
    with pytest.raises(InvalidEndpointError):
        connect(endpoints)


async def test_tls_material_with_http_endpoint_rejected():
    with pytest.raises(InvalidEndpointError):
        connect("http://127.0.0.1:2379", ca_cert=b"-----BEGIN CERTIFICATE-----\n")


async def test_no_endpoints_and_no_environment(monkeypatch):
    monkeypatch.delenv("ETCD_ENDPOINTS", raising=False)
    with pytest.raises(InvalidEndpointError, match="ETCD_ENDPOINTS"):
        connect()


async def test_negative_revision_and_limit(etcd_client, etcd_prefix):
    with pytest.raises(InvalidArgumentError):
        await etcd_client.get(etcd_prefix + "k", revision=-1)
    with pytest.raises(InvalidArgumentError):
        await etcd_client.range(etcd_prefix, prefix=True, limit=-1)
    with pytest.raises(InvalidArgumentError):
        await etcd_client.range(etcd_prefix, prefix=True, revision=-5)
    with pytest.raises(InvalidArgumentError):
        etcd_client.watch(etcd_prefix + "k", start_revision=-1)
    with pytest.raises(InvalidArgumentError):
        await etcd_client.txn([], [Op.get(etcd_prefix, prefix=True, limit=-1)])
    with pytest.raises(InvalidArgumentError):
        await etcd_client.range(etcd_prefix, prefix=True, range_end=etcd_prefix + "z")


async def test_invalid_ttls(etcd_client):
    for ttl in (0, 0.5, -1):
        with pytest.raises(InvalidArgumentError):
            await etcd_client.lease_grant(ttl)
        with pytest.raises(InvalidArgumentError):
            etcd_client.lease(ttl)

        async def establish(lease_id: int) -> bool:
            return True

        with pytest.raises(InvalidArgumentError):
            etcd_client.self_healing_lease(ttl, establish)
    for ttl in ("5", None, True):
        with pytest.raises(InvalidArgumentError):
            etcd_client.lease(ttl)


async def test_cert_without_key_and_other_connect_arguments(etcd_server, tmp_path):
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(InvalidArgumentError, match="cert"):
        connect("https://127.0.0.1:2379", cert=str(cert))
    with pytest.raises(InvalidArgumentError, match="cert"):
        connect("https://127.0.0.1:2379", key=str(cert))
    with pytest.raises(InvalidArgumentError):
        connect("https://127.0.0.1:2379", ca_cert=str(tmp_path / "missing.pem"))
    with pytest.raises(InvalidArgumentError):
        connect(etcd_server.url, user="root")  # a user without a password
    with pytest.raises(InvalidArgumentError):
        connect(etcd_server.url, password="x")
    with pytest.raises(InvalidArgumentError):
        connect(etcd_server.url, connect_timeout=0)
    with pytest.raises(InvalidArgumentError):
        connect(etcd_server.url, keepalive_time=0)
    with pytest.raises(InvalidArgumentError):
        connect(etcd_server.url, keepalive_timeout=-1)


async def test_wrong_types_are_invalid_arguments(etcd_client):
    with pytest.raises(InvalidArgumentError):
        await etcd_client.get(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await etcd_client.txn(["not a compare"], [])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError):
        await etcd_client.txn([], ["not an op"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        Cmp.mod_revision("/k") == "1"  # noqa: B015
