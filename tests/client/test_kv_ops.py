"""Happy paths of every raw operation against a real etcd: get/range/put/delete, transactions
through Cmp/Op, status, member list, leases, namespaces and typed values.

Compaction is destructive for the whole keyspace, so it runs on a private server."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    INT64,
    JSON,
    Cmp,
    CompactedError,
    DeleteResult,
    EventType,
    FutureRevisionError,
    KeyValue,
    Op,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    TxnResult,
    WatchEvent,
    connect,
)

# --------------------------------------------------------------------------- get / range


async def test_get_missing_returns_none(etcd_client, etcd_prefix):
    assert await etcd_client.get(etcd_prefix + "nothing-here") is None


async def test_put_then_get_roundtrip(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    r1 = await etcd_client.put(key, "hello")
    assert isinstance(r1, PutResult)
    assert r1.revision > 0
    assert r1.prev_kv is None
    kv = await etcd_client.get(key)
    assert isinstance(kv, KeyValue)
    assert kv.key == key.encode()
    assert kv.value == b"hello"
    assert kv.text == "hello"
    assert kv.create_revision == kv.mod_revision == r1.revision
    assert kv.version == 1
    assert kv.lease == 0

    r2 = await etcd_client.put(key, b"world", prev_kv=True)
    assert r2.revision > r1.revision
    assert r2.prev_kv is not None
    assert r2.prev_kv.value == b"hello"
    assert r2.prev_kv.mod_revision == r1.revision
    kv2 = await etcd_client.get(key)
    assert kv2 is not None
    assert kv2.value == b"world"
    assert kv2.version == 2
    assert kv2.create_revision == r1.revision
    assert kv2.mod_revision == r2.revision


async def test_range_prefix_sort_limit_count_keys_only(etcd_client, etcd_prefix):
    p = etcd_prefix + "q/"
    # Written in an order that differs from key order: c, a, b.
    revs = {}
    for name, value in (("c", b"3"), ("a", b"1"), ("b", b"2")):
        revs[name] = (await etcd_client.put(p + name, value)).revision
    await etcd_client.put(etcd_prefix + "q0", b"outside")  # just past the prefix's range

    everything = await etcd_client.range(p, prefix=True)
    assert isinstance(everything, RangeResult)
    assert [kv.key for kv in everything] == [(p + n).encode() for n in "abc"]
    assert everything.count == 3
    assert everything.more is False
    assert len(everything) == 3
    assert everything.revision >= revs["b"]

    by_mod = await etcd_client.range(
        p, prefix=True, sort_target=SortTarget.MOD, sort_order=SortOrder.ASCEND
    )
    assert [kv.key for kv in by_mod] == [(p + n).encode() for n in "cab"]
    by_key_desc = await etcd_client.range(
        p, prefix=True, sort_target=SortTarget.KEY, sort_order=SortOrder.DESCEND
    )
    assert [kv.key for kv in by_key_desc] == [(p + n).encode() for n in "cba"]
    by_value_desc = await etcd_client.range(
        p, prefix=True, sort_target=SortTarget.VALUE, sort_order=SortOrder.DESCEND
    )
    assert [kv.value for kv in by_value_desc] == [b"3", b"2", b"1"]

    limited = await etcd_client.range(
        p, prefix=True, sort_target=SortTarget.MOD, sort_order=SortOrder.ASCEND, limit=2
    )
    assert [kv.key for kv in limited] == [(p + n).encode() for n in "ca"]
    assert limited.more is True
    assert limited.count == 3

    counted = await etcd_client.range(p, prefix=True, count_only=True)
    assert counted.count == 3
    assert counted.kvs == []
    assert await etcd_client.count(p) == 3

    keys = await etcd_client.range(p, prefix=True, keys_only=True)
    assert [kv.key for kv in keys] == [(p + n).encode() for n in "abc"]
    assert all(kv.value == b"" for kv in keys)

    # An explicit [key, range_end) range: a..b (b excluded).
    half_open = await etcd_client.range(p + "a", range_end=p + "c")
    assert [kv.key for kv in half_open] == [(p + n).encode() for n in "ab"]

    via_get_prefix = await etcd_client.get_prefix(p)
    assert via_get_prefix.count == 3


async def test_range_at_a_past_revision(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    r1 = await etcd_client.put(key, b"v1")
    await etcd_client.put(key, b"v2")
    await etcd_client.delete(key)
    assert await etcd_client.get(key) is None
    old = await etcd_client.get(key, revision=r1.revision)
    assert old is not None
    assert old.value == b"v1"
    assert old.mod_revision == r1.revision
    before = await etcd_client.range(etcd_prefix, prefix=True, revision=r1.revision - 1)
    assert before.count == 0
    at = await etcd_client.range(etcd_prefix, prefix=True, revision=r1.revision)
    assert [kv.value for kv in at] == [b"v1"]


async def test_future_revision_is_a_clear_error(etcd_client, etcd_prefix):
    head = (await etcd_client.put(etcd_prefix + "k", b"v")).revision
    with pytest.raises(FutureRevisionError):
        await etcd_client.get(etcd_prefix + "k", revision=head + 1000)
    with pytest.raises(FutureRevisionError):
        await etcd_client.range(etcd_prefix, prefix=True, revision=head + 1000)


# --------------------------------------------------------------------------- delete


async def test_delete_single_prefix_and_prev_kv(etcd_client, etcd_prefix):
    p = etcd_prefix
    for name in ("a", "d/1", "d/2", "d/3", "e"):
        await etcd_client.put(p + name, name)

    missing = await etcd_client.delete(p + "nope")
    assert isinstance(missing, DeleteResult)
    assert missing.deleted == 0

    single = await etcd_client.delete(p + "a")
    assert single.deleted == 1
    assert single.prev_kvs == []
    assert await etcd_client.get(p + "a") is None

    with_prev = await etcd_client.delete(p + "e", prev_kv=True)
    assert with_prev.deleted == 1
    assert [(kv.key, kv.value) for kv in with_prev.prev_kvs] == [((p + "e").encode(), b"e")]

    by_prefix = await etcd_client.delete(p + "d/", prefix=True, prev_kv=True)
    assert by_prefix.deleted == 3
    assert sorted(kv.value for kv in by_prefix.prev_kvs) == [b"d/1", b"d/2", b"d/3"]
    assert by_prefix.revision > with_prev.revision
    assert await etcd_client.count(p) == 0


async def test_put_with_lease_attaches_key(etcd_client, etcd_prefix):
    grant = await etcd_client.lease_grant(30)
    try:
        key = etcd_prefix + "leased"
        await etcd_client.put(key, b"x", lease=grant.id)
        kv = await etcd_client.get(key)
        assert kv is not None
        assert kv.lease == grant.id
    finally:
        assert await etcd_client.lease_revoke(grant.id) is True
    assert await etcd_client.get(key) is None


# --------------------------------------------------------------------------- transactions


async def test_txn_create_if_absent_and_failure_branch(etcd_client, etcd_prefix):
    key = etcd_prefix + "leader"
    first = await etcd_client.txn([Cmp.missing(key)], [Op.put(key, b"me")], [Op.get(key)])
    assert isinstance(first, TxnResult)
    assert first.succeeded is True
    assert len(first.responses) == 1
    assert isinstance(first.responses[0], PutResult)
    assert first.revision == first.responses[0].revision

    second = await etcd_client.txn([Cmp.missing(key)], [Op.put(key, b"you")], [Op.get(key)])
    assert second.succeeded is False
    (got,) = second.responses
    assert isinstance(got, RangeResult)
    assert [kv.value for kv in got] == [b"me"]
    assert (await etcd_client.get(key)).value == b"me"  # type: ignore[union-attr]

    exists = await etcd_client.txn([Cmp.exists(key)], [Op.delete(key, prev_kv=True)])
    assert exists.succeeded
    (deleted,) = exists.responses
    assert isinstance(deleted, DeleteResult)
    assert deleted.deleted == 1
    assert deleted.prev_kvs[0].value == b"me"


async def test_txn_cas_on_mod_revision(etcd_client, etcd_prefix):
    key = etcd_prefix + "cas"
    rev = (await etcd_client.put(key, b"1")).revision
    ok = await etcd_client.txn([Cmp.mod_revision(key) == rev], [Op.put(key, b"2", prev_kv=True)])
    assert ok.succeeded
    assert ok.responses[0].prev_kv.value == b"1"  # type: ignore[union-attr]
    # The same stale revision now fails and the failure branch runs (empty here).
    stale = await etcd_client.txn([Cmp.mod_revision(key) == rev], [Op.put(key, b"3")])
    assert stale.succeeded is False
    assert stale.responses == []
    assert (await etcd_client.get(key)).value == b"2"  # type: ignore[union-attr]
    newer = await etcd_client.txn([Cmp.mod_revision(key) > rev], [Op.get(key)])
    assert newer.succeeded
    assert newer.responses[0].kvs[0].value == b"2"
    assert (await etcd_client.txn([Cmp.version(key) == 2], [])).succeeded
    assert (await etcd_client.txn([Cmp.create_revision(key) == rev], [])).succeeded
    assert (await etcd_client.txn([Cmp.lease(key) == 0], [])).succeeded


async def test_txn_value_compare(etcd_client, etcd_prefix):
    key = etcd_prefix + "mode"
    await etcd_client.put(key, "on")
    hit = await etcd_client.txn([Cmp.value(key) == "on"], [Op.put(key, "off")])
    assert hit.succeeded
    miss = await etcd_client.txn([Cmp.value(key) == b"on"], [Op.put(key, "again")], [Op.get(key)])
    assert not miss.succeeded
    assert miss.responses[0].kvs[0].value == b"off"
    assert (await etcd_client.txn([Cmp.value(key) != b"on"], [])).succeeded


async def test_txn_nested_with_get_results_and_multiple_ops(etcd_client, etcd_prefix):
    p = etcd_prefix
    await etcd_client.put(p + "x/1", b"a")
    await etcd_client.put(p + "x/2", b"b")
    result = await etcd_client.txn(
        [Cmp.exists(p + "x/1")],
        [
            Op.put(p + "y", b"y"),
            Op.get(p + "x/", prefix=True, sort_order=SortOrder.DESCEND),
            Op.txn(
                [Cmp.missing(p + "z")],
                [Op.put(p + "z", b"z"), Op.get(p + "x/", prefix=True, count_only=True)],
                [Op.get(p + "z")],
            ),
        ],
    )
    assert result.succeeded
    put, got, nested = result.responses
    assert isinstance(put, PutResult)
    assert isinstance(got, RangeResult)
    assert [kv.value for kv in got] == [b"b", b"a"]
    assert isinstance(nested, TxnResult)
    assert nested.succeeded
    nested_put, nested_count = nested.responses
    assert isinstance(nested_put, PutResult)
    assert isinstance(nested_count, RangeResult)
    assert nested_count.count == 2
    assert (await etcd_client.get(p + "z")).value == b"z"  # type: ignore[union-attr]

    # Nested failure branch: z exists now.
    again = await etcd_client.txn(
        [], [Op.txn([Cmp.missing(p + "z")], [Op.put(p + "z", b"!")], [Op.get(p + "z")])]
    )
    assert again.succeeded
    (inner,) = again.responses
    assert isinstance(inner, TxnResult)
    assert inner.succeeded is False
    assert inner.responses[0].kvs[0].value == b"z"  # type: ignore[union-attr]


async def test_txn_defaults_and_empty_parts_reach_etcd(etcd_server, etcd_prefix):
    # Requests are filled in place with only the non-default fields set: a compare against 0,
    # an empty nested transaction, a lease-less put and a namespaced "to the end" range must
    # still arrive as written (an unset oneof would make etcd reject or misread them).
    ns = etcd_prefix + "ns/"
    async with connect(**etcd_server.client_kwargs(), namespace=ns) as client:
        await client.put("a", b"1")
        result = await client.txn(
            [Cmp.version("missing") == 0, Cmp.lease("a") == 0, Cmp.value("a") != b""],
            [
                Op.txn([], [], []),
                Op.put("b", b""),
                Op.get("a", range_end="\0", keys_only=True),
                Op.delete("zz", prefix=True),
            ],
        )
        assert result.succeeded
        empty, put, got, deleted = result.responses
        assert isinstance(empty, TxnResult) and empty.succeeded and empty.responses == []
        assert isinstance(put, PutResult)
        assert isinstance(got, RangeResult) and [kv.key for kv in got] == [b"a", b"b"]
        assert got.kvs[0].value == b""  # keys only
        assert isinstance(deleted, DeleteResult) and deleted.deleted == 0
        assert (await client.get("b")).value == b""


async def test_txn_prefix_compare(etcd_client, etcd_prefix):
    p = etcd_prefix + "dir/"
    # No key under the prefix yet: every version is 0.
    empty = await etcd_client.txn([Cmp.version(p, prefix=True) == 0], [Op.put(p + "a", b"1")])
    assert empty.succeeded
    again = await etcd_client.txn([Cmp.version(p, prefix=True) == 0], [Op.put(p + "b", b"1")])
    assert not again.succeeded
    assert await etcd_client.count(p) == 1


# --------------------------------------------------------------------------- compaction


async def test_compact_then_old_revision_raises(fresh_etcd_server):
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        r1 = await client.put("/c/k", b"1")
        await client.put("/c/k", b"2")
        r3 = await client.put("/c/k", b"3")
        assert (await client.get("/c/k", revision=r1.revision)).value == b"1"  # type: ignore[union-attr]
        await client.compact(r3.revision)
        with pytest.raises(CompactedError):
            await client.get("/c/k", revision=r1.revision)
        with pytest.raises(CompactedError):
            await client.range("/c/", prefix=True, revision=r3.revision - 1)
        # The compaction revision itself, and the present, are still readable.
        at = await client.get("/c/k", revision=r3.revision)
        assert at is not None
        assert at.value == b"3"
        # Compacting again at an older revision is itself a compaction error.
        with pytest.raises(CompactedError):
            await client.compact(r1.revision)
        with pytest.raises(FutureRevisionError):
            await client.compact(r3.revision + 1000)
        await client.put("/c/k", b"4")
        await client.compact((await client.status()).revision, physical=True)
        assert (await client.get("/c/k")).value == b"4"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- cluster info


async def test_status_and_member_list(etcd_client, etcd_server, etcd_prefix):
    rev = (await etcd_client.put(etcd_prefix + "k", b"v")).revision
    st = await etcd_client.status()
    assert st.version.startswith("3.")
    assert st.leader != 0
    assert st.leader == st.member_id
    assert st.revision >= rev
    assert st.raft_index > 0
    assert st.raft_term >= 1
    assert st.db_size > 0
    assert st.errors == []

    members = await etcd_client.member_list()
    assert len(members) == 1
    (m,) = members
    assert m.id == st.member_id
    assert m.name == "n1"
    assert m.is_learner is False
    assert etcd_server.url in m.client_urls
    assert m.peer_urls
    assert all(u.startswith("http://") for u in m.peer_urls)
    assert await etcd_client.ping() is True


# --------------------------------------------------------------------------- leases


async def test_lease_grant_time_to_live_revoke(etcd_client, etcd_prefix):
    grant = await etcd_client.lease_grant(20)
    assert grant.id > 0
    assert grant.ttl == 20
    await etcd_client.put(etcd_prefix + "a", b"1", lease=grant.id)
    await etcd_client.put(etcd_prefix + "b", b"2", lease=grant.id)
    info = await etcd_client.lease_time_to_live(grant.id, keys=True)
    assert info.id == grant.id
    assert info.granted_ttl == 20
    assert 0 < info.ttl <= 20
    assert sorted(info.keys) == [(etcd_prefix + "a").encode(), (etcd_prefix + "b").encode()]
    no_keys = await etcd_client.lease_time_to_live(grant.id)
    assert no_keys.keys == []

    assert await etcd_client.lease_revoke(grant.id) is True
    assert await etcd_client.count(etcd_prefix) == 0
    gone = await etcd_client.lease_time_to_live(grant.id)
    assert gone.ttl == -1
    # Revoking an unknown lease is best-effort: False, not an exception.
    assert await etcd_client.lease_revoke(grant.id) is False


async def test_lease_keep_alive_once(etcd_client):
    grant = await etcd_client.lease_grant(5)
    await asyncio.sleep(1.2)
    before = await etcd_client.lease_time_to_live(grant.id)
    assert before.ttl <= 4
    assert await etcd_client.lease_keep_alive_once(grant.id) == 5
    after = await etcd_client.lease_time_to_live(grant.id)
    assert after.ttl >= 4  # renewed back to (nearly) the full TTL
    await etcd_client.lease_revoke(grant.id)
    assert await etcd_client.lease_keep_alive_once(grant.id) == 0


@pytest.mark.slow
async def test_acquisition_lease_keeps_key_alive(etcd_client, etcd_prefix):
    key = etcd_prefix + "presence"
    async with etcd_client.lease(2) as lease:
        assert lease.id > 0
        assert lease.granted_ttl >= 2
        await etcd_client.put(key, b"here", lease=lease.id)
        for _ in range(10):  # 5 s: more than twice the TTL
            await asyncio.sleep(0.5)
            kv = await etcd_client.get(key)
            assert kv is not None
            assert kv.lease == lease.id
        assert not lease.is_lost
        assert etcd_client._leases.lease_count == 1
    # Leaving the block revokes the lease: the key vanishes at once.
    assert await etcd_client.get(key) is None
    assert etcd_client._leases.lease_count == 0
    assert (await etcd_client.lease_time_to_live(lease.id)).ttl == -1


# --------------------------------------------------------------------------- namespace


async def test_namespace_prefixes_keys_and_strips_results(etcd_server, etcd_client, etcd_prefix):
    ns = etcd_prefix + "ns/"
    # Keys just outside the namespace that a naive "from key to the end" range would include.
    await etcd_client.put(etcd_prefix + "ns0", b"outside-after")
    await etcd_client.put(etcd_prefix + "zz", b"outside-far")
    await etcd_client.put(etcd_prefix + "a", b"outside-before")
    async with connect(**etcd_server.client_kwargs(), namespace=ns) as client:
        assert client.namespace == ns.encode()
        r = await client.put("a", b"1")
        await client.put("p/1", b"p1")
        await client.put("p/2", b"p2", prev_kv=True)
        put_prev = await client.put("a", b"1b", prev_kv=True)
        assert put_prev.prev_kv is not None
        assert put_prev.prev_kv.key == b"a"

        # On the server, keys carry the namespace.
        raw = await etcd_client.get(ns + "a")
        assert raw is not None
        assert raw.value == b"1b"
        assert raw.create_revision == r.revision
        # In results, it is stripped.
        kv = await client.get("a")
        assert kv is not None
        assert kv.key == b"a"

        prefixed = await client.range("p/", prefix=True)
        assert [k.key for k in prefixed] == [b"p/1", b"p/2"]
        # "From key on" stays inside the namespace.
        from_a = await client.range("a", range_end="\x00")
        assert [k.key for k in from_a] == [b"a", b"p/1", b"p/2"]
        assert await client.count("p/") == 2

        txn = await client.txn(
            [Cmp.value("a") == b"1b"], [Op.get("p/", prefix=True), Op.put("t", b"t")]
        )
        assert txn.succeeded
        assert [k.key for k in txn.responses[0].kvs] == [b"p/1", b"p/2"]
        assert (await etcd_client.get(ns + "t")) is not None

        grant = await client.lease_grant(30)
        await client.put("leased", b"x", lease=grant.id)
        info = await client.lease_time_to_live(grant.id, keys=True)
        assert info.keys == [b"leased"]
        await client.lease_revoke(grant.id)

        deleted = await client.delete("p/", prefix=True, prev_kv=True)
        assert sorted(k.key for k in deleted.prev_kvs) == [b"p/1", b"p/2"]

        # Watches stay inside the namespace and report stripped keys.
        start = (await client.status()).revision + 1
        async with client.watch("a", range_end="\x00", start_revision=start) as watch:
            await etcd_client.put(etcd_prefix + "ns0", b"outside-2")  # not in the namespace
            await etcd_client.put(etcd_prefix + "zz", b"outside-3")
            await client.put("w/1", b"in")
            item = await asyncio.wait_for(watch.__anext__(), 5)
            assert isinstance(item, WatchEvent)
            assert item.type is EventType.PUT
            assert item.kv.key == b"w/1"
        async with client.watch("w/", prefix=True, prev_kv=True) as pwatch:
            await client.delete("w/1")
            item = await asyncio.wait_for(pwatch.__anext__(), 5)
            assert isinstance(item, WatchEvent)
            assert item.type is EventType.DELETE
            assert item.kv.key == b"w/1"
            assert item.prev_kv is not None
            assert item.prev_kv.key == b"w/1"
            assert item.prev_kv.value == b"in"

    # Outside keys were never touched.
    assert (await etcd_client.get(etcd_prefix + "zz")).value == b"outside-3"  # type: ignore[union-attr]
    assert (await etcd_client.get(etcd_prefix + "a")).value == b"outside-before"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- typed values


async def test_typed_values_with_codecs(etcd_client, etcd_prefix):
    n_key = etcd_prefix + "counter"
    assert await etcd_client.get_value(n_key, INT64) is None
    assert await etcd_client.get_value(n_key, INT64, default=0) == 0
    await etcd_client.put_value(n_key, 42, INT64)
    raw = await etcd_client.get(n_key)
    assert raw is not None
    assert raw.value == b"\x00" * 7 + b"*"
    assert await etcd_client.get_value(n_key, INT64) == 42
    await etcd_client.put_value(n_key, -(2**63), INT64)
    assert await etcd_client.get_value(n_key, INT64) == -(2**63)

    j_key = etcd_prefix + "config"
    doc = {"mode": "on", "n": [1, 2], "s": "é"}
    grant = await etcd_client.lease_grant(30)
    await etcd_client.put_value(j_key, doc, JSON, lease=grant.id)
    stored = await etcd_client.get(j_key)
    assert stored is not None
    assert stored.lease == grant.id
    assert stored.value == '{"mode":"on","n":[1,2],"s":"é"}'.encode()
    assert await etcd_client.get_value(j_key, JSON) == doc
    await etcd_client.lease_revoke(grant.id)
