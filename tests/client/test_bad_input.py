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


# ---------------------------------------------------------------- issue 16, items 16, 17 and 5


async def _revision(client) -> int:
    return (await client.range("/", count_only=True)).revision


async def test_relative_and_malformed_recipe_paths_are_rejected_before_any_io(
    etcd_client, etcd_prefix
):
    from etcd_recipes import (
        DistributedAtomicLong,
        DistributedMutex,
        DistributedQueue,
        InvalidPathError,
    )

    before = await _revision(etcd_client)
    for path in ("holdout-bad-relative", "__x", "/a//b", etcd_prefix + "a\x00b"):
        for recipe in (DistributedMutex, DistributedQueue, DistributedAtomicLong):
            with pytest.raises(InvalidPathError, match="path") as info:
                recipe(etcd_client, path)
            assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidPathError, match="did you mean '/visits'"):
        await DistributedAtomicLong.delete(etcd_client, "visits")
    assert await _revision(etcd_client) == before
    assert await etcd_client.count("holdout-bad-relative") == 0
    assert await etcd_client.count("__x") == 0


async def test_one_trailing_slash_is_accepted_each_recipe_keeping_its_layout(
    etcd_client, etcd_prefix
):
    from etcd_recipes import DistributedMutex, DistributedQueue

    # The mutex keeps etcd's lock layout, "<path>/<lease hex>", exactly as `etcdctl lock` and
    # Go's concurrency.Mutex do for the same path (interop beats tidiness) ...
    async with DistributedMutex(etcd_client, etcd_prefix + "lock/") as mutex, mutex:
        keys = [kv.key for kv in await etcd_client.get_prefix(etcd_prefix + "lock/")]
    assert len(keys) == 1 and keys[0].startswith((etcd_prefix + "lock//").encode())
    # ... the reference's layouts join without doubling the slash.
    async with DistributedQueue(etcd_client, etcd_prefix + "q/") as queue:
        await queue.enqueue(b"x")
        keys = [kv.key for kv in await etcd_client.get_prefix(etcd_prefix + "q/")]
    assert len(keys) == 1 and b"//" not in keys[0]


async def test_counter_add_beyond_int64_writes_nothing(etcd_client, etcd_prefix):
    from etcd_recipes import DistributedAtomicLong

    before = await _revision(etcd_client)
    counter = DistributedAtomicLong(etcd_client, etcd_prefix + "c")  # add() creates the key
    for delta in (2**63, -(2**63) - 1, True, 1.5):
        with pytest.raises(InvalidArgumentError, match="delta"):
            await counter.add(delta)
    with pytest.raises(InvalidArgumentError, match="delta"):
        await counter.subtract(-(2**63))
    assert await etcd_client.get(etcd_prefix + "c") is None
    assert await _revision(etcd_client) == before
    with pytest.raises(InvalidArgumentError, match="default"):
        DistributedAtomicLong(etcd_client, etcd_prefix + "c", default=2**63)


async def test_client_call_timeouts_are_checked_before_the_call(etcd_client, etcd_prefix):
    from etcd_recipes import InvalidArgumentTypeError

    key = etcd_prefix + "k"
    before = await _revision(etcd_client)
    # timeout=0 on a client call is rejected (it could only fail); None means no deadline.
    for bad in (0, -1, float("nan")):
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await etcd_client.get(key, timeout=bad)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await etcd_client.put(key, b"v", timeout=bad)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await etcd_client.lease_revoke(1, timeout=bad)  # not swallowed into False
    with pytest.raises(TypeError, match="timeout"):
        await etcd_client.put(key, b"v", timeout="5")
    with pytest.raises(InvalidArgumentTypeError, match="lease"):
        await etcd_client.put(key, b"v", lease="abc")
    with pytest.raises(InvalidArgumentTypeError, match="limit"):
        await etcd_client.range(key, prefix=True, limit="5")
    with pytest.raises(InvalidArgumentError, match="revision"):
        await etcd_client.get(key, revision=2**63)
    assert await _revision(etcd_client) == before
    assert await etcd_client.get(key, timeout=None) is None
    assert await etcd_client.get(key, timeout=float("inf")) is None


async def test_a_wrong_client_is_a_typed_type_error(etcd_client, etcd_prefix):
    from etcd_recipes import (
        DistributedBarrier,
        DistributedMutex,
        InvalidArgumentTypeError,
        LeaderLatch,
        get_participants,
        server_lock,
    )

    for bad in (None, "etcd", 42):
        for recipe in (DistributedMutex, DistributedBarrier, LeaderLatch):
            with pytest.raises(InvalidArgumentTypeError, match="client") as info:
                recipe(bad, etcd_prefix + "x")
            assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
        with pytest.raises(InvalidArgumentTypeError, match="client"):
            await get_participants(bad, etcd_prefix + "e")
        with pytest.raises(InvalidArgumentTypeError, match="client"):
            await server_lock(bad, etcd_prefix + "l", 1)


def test_a_wrong_client_is_a_typed_type_error_in_the_blocking_facade(etcd_server, etcd_prefix):
    import etcd_recipes
    import etcd_recipes.sync as sync

    with sync.connect(**etcd_server.client_kwargs()) as client:
        for bad in (None, "etcd", client._a):
            with pytest.raises(etcd_recipes.InvalidArgumentTypeError, match="client"):
                sync.DistributedMutex(bad, etcd_prefix + "x")
            with pytest.raises(etcd_recipes.InvalidArgumentTypeError, match="client"):
                sync.get_participants(bad, etcd_prefix + "e")
        with pytest.raises(etcd_recipes.InvalidPathError):
            sync.DistributedMutex(client, "relative")


async def test_non_integer_and_non_finite_ttls_are_rejected_not_truncated(etcd_client, etcd_prefix):
    from etcd_recipes import DistributedMutex, TransientKeyValue, WorkQueueConfig

    for ttl in (2.5, float("nan"), float("inf"), 2**63, True):
        with pytest.raises(InvalidArgumentError, match="lease_ttl"):
            DistributedMutex(etcd_client, etcd_prefix + "m", lease_ttl=ttl)
        with pytest.raises(InvalidArgumentError, match="lease_ttl"):
            TransientKeyValue(etcd_client, etcd_prefix + "t", b"v", lease_ttl=ttl)
        with pytest.raises(InvalidArgumentError, match="visibility_timeout"):
            WorkQueueConfig(visibility_timeout=ttl)
        with pytest.raises(InvalidArgumentError, match="ttl"):
            await etcd_client.lease_grant(ttl)
    assert DistributedMutex(etcd_client, etcd_prefix + "m", lease_ttl=3.0).lease_ttl == 3


async def test_batches_must_be_iterables_of_values(etcd_client, etcd_prefix):
    from etcd_recipes import DistributedQueue, DistributedWorkQueue, InvalidArgumentTypeError

    before = await _revision(etcd_client)
    for recipe in (DistributedQueue, DistributedWorkQueue):
        async with recipe(etcd_client, etcd_prefix + recipe.__name__) as queue:
            for bad in (None, 42, "abc", b"abc"):
                with pytest.raises(InvalidArgumentTypeError, match="values"):
                    await queue.enqueue_all(bad)
    assert await _revision(etcd_client) == before
