"""Every public member of the sync ``EtcdClient`` runs through the facade (real etcd)."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import pytest

import etcd_recipes.client
import etcd_recipes.errors
from etcd_recipes.sync import (
    JSON,
    AcquisitionLease,
    ClientClosedError,
    Cmp,
    ConnectionState,
    ElectionLeaderKey,
    EmptyKeyError,
    EtcdClient,
    InvalidArgumentError,
    LeaseGrant,
    Op,
    RangeResult,
    ResilienceConfig,
    SelfHealingLease,
    SortOrder,
    SortTarget,
    Watch,
    WatchEvent,
    connect,
)

from .conftest import Trace

Case = Callable[[EtcdClient, str, pytest.FixtureRequest], "str | None"]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    """Register the check for ``EtcdClient.<name>``; it returns the async name expected to run
    (default: the same name), ``_unary_<name>`` for a plain KV call sent from the calling thread
    (``Runtime.direct``), or ``""`` when no loop call is expected."""

    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn

    return register


@case("endpoints")
def _endpoints(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.endpoints == c._a.endpoints
    assert "127.0.0.1" in c.endpoints
    return "<lambda>"


@case("namespace")
def _namespace(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.namespace == b""
    return "<lambda>"


@case("resilience")
def _resilience(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert isinstance(c.resilience, ResilienceConfig)
    return "<lambda>"


@case("is_open")
def _is_open(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.is_open is True
    return "<lambda>"


@case("open")
def _open(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.open() is c  # idempotent, and the same twin object
    return "open"


@case("get")
def _get(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    rev = c.put(p + "k", "v").revision
    kv = c.get(p + "k")
    assert kv is not None
    assert (kv.value, kv.mod_revision) == (b"v", rev)
    assert c.get(p + "missing") is None
    assert c.get(p + "k", revision=rev - 1) is None
    return "_unary_get"


@case("range")
def _range(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    for i in range(3):
        c.put(f"{p}r/{i}", str(i))
    res = c.range(p + "r/", prefix=True, sort_target=SortTarget.KEY, sort_order=SortOrder.DESCEND)
    assert [kv.value for kv in res.kvs] == [b"2", b"1", b"0"]
    assert c.range(p + "r/", prefix=True, limit=1).more is True
    assert c.range(p + "r/0", range_end=p + "r/2").count == 2
    return "_unary_range"


@case("get_prefix")
def _get_prefix(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.put(p + "gp/a", "1")
    c.put(p + "gp/b", "2")
    assert [kv.key for kv in c.get_prefix(p + "gp/", keys_only=True).kvs] == [
        (p + "gp/a").encode(),
        (p + "gp/b").encode(),
    ]
    return "_unary_get_prefix"


@case("count")
def _count(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.put(p + "c/1", "x")
    c.put(p + "c/2", "x")
    assert c.count(p + "c/") == 2
    return "_unary_count"


@case("put")
def _put(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    first = c.put(p + "k", b"1")
    second = c.put(p + "k", "2", prev_kv=True)
    assert second.revision > first.revision
    assert second.prev_kv is not None
    assert second.prev_kv.value == b"1"
    return "_unary_put"


@case("delete")
def _delete(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.put(p + "d/1", "x")
    c.put(p + "d/2", "y")
    res = c.delete(p + "d/", prefix=True, prev_kv=True)
    assert res.deleted == 2
    assert sorted(kv.value for kv in res.prev_kvs) == [b"x", b"y"]
    return "_unary_delete"


@case("txn")
def _txn(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    key = p + "leader"
    won = c.txn([Cmp.missing(key)], [Op.put(key, b"me")], [Op.get(key)])
    lost = c.txn([Cmp.missing(key)], [Op.put(key, b"you")], [Op.get(key)])
    assert won.succeeded
    assert not lost.succeeded
    read = lost.responses[0]
    assert isinstance(read, RangeResult)
    assert read.kvs[0].value == b"me"
    return "_unary_txn"


@case("compact")
def _compact(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    # Compaction is global: do it on a private server, with that client traced instead.
    server = r.getfixturevalue("fresh_etcd_server")
    with connect(**server.client_kwargs()) as other:
        spy = Trace(other, r.getfixturevalue("monkeypatch"))
        old = other.put("/x", "1").revision
        other.put("/x", "2")
        other.compact(old + 1)
        watch = other.watch("/x", start_revision=old)
        with watch, pytest.raises(etcd_recipes.errors.CompactedError):
            next(watch)
        assert "compact" in spy.names()
        assert spy.threads("compact") == {other._rt.loop_thread}
        assert spy.threads("_unary_put") == {threading.current_thread()}
    return ""


@case("get_value")
def _get_value(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.put(p + "json", b'{"a": 1}')
    assert c.get_value(p + "json", JSON) == {"a": 1}
    assert c.get_value(p + "nope", JSON, default=7) == 7
    return "_unary_get_value"


@case("put_value")
def _put_value(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.put_value(p + "json", {"b": [1, 2]}, JSON)
    kv = c.get(p + "json")
    assert kv is not None
    assert JSON.decode(kv.value) == {"b": [1, 2]}
    return "_unary_put_value"


@case("status")
def _status(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    st = c.status()
    assert st.version.startswith("3.")
    assert st.revision > 0
    return "status"


@case("alarms")
def _alarms(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.alarms() == []  # a healthy server has none
    return ""


@case("compact_revision")
def _compact_revision(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    # Compaction is global: do it on a private server.
    server = r.getfixturevalue("fresh_etcd_server")
    with connect(**server.client_kwargs()) as other:
        assert other.compact_revision() == 0
        old = other.put("/x", "1").revision
        other.put("/x", "2")
        other.compact(old + 1)
        assert other.compact_revision() == old + 1
    return ""


@case("member_list")
def _member_list(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    members = c.member_list()
    assert len(members) == 1
    assert members[0].client_urls
    return "member_list"


@case("ping")
def _ping(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.ping() is True
    return "ping"


@case("check")
def _check(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.check(timeout=2) is True
    return "check"


@case("sync_endpoints")
def _sync_endpoints(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.sync_endpoints() is False  # a one-member server: the endpoints are the members
    return "sync_endpoints"


@case("is_live")
def _is_live(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.is_live() is True  # run on the client's loop: "this loop" is its own
    return "is_live"


@case("lease_grant")
def _lease_grant(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    grant = c.lease_grant(30)
    assert isinstance(grant, LeaseGrant)
    assert grant.ttl >= 30
    c.lease_revoke(grant.id)
    return "lease_grant"


@case("lease_revoke")
def _lease_revoke(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    grant = c.lease_grant(30)
    c.put(p + "leased", "x", lease=grant.id)
    assert c.lease_revoke(grant.id) is True
    assert c.get(p + "leased") is None
    return "lease_revoke"


@case("lease_time_to_live")
def _lease_ttl(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    grant = c.lease_grant(30)
    c.put(p + "leased", "x", lease=grant.id)
    info = c.lease_time_to_live(grant.id, keys=True)
    assert 0 < info.ttl <= 30
    assert info.keys == [(p + "leased").encode()]
    c.lease_revoke(grant.id)
    assert c.lease_time_to_live(grant.id).ttl == -1
    return "lease_time_to_live"


@case("lease_keep_alive_once")
def _keep_alive_once(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    grant = c.lease_grant(30)
    assert c.lease_keep_alive_once(grant.id) >= 30
    c.lease_revoke(grant.id)
    assert c.lease_keep_alive_once(grant.id) == 0
    return "lease_keep_alive_once"


@case("lease")
def _lease(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    lease = c.lease(30)
    assert isinstance(lease, AcquisitionLease)
    assert lease.id == 0
    with lease as held:
        assert held is lease
        assert lease.id != 0
        c.put(p + "held", "x", lease=lease.id)
    assert c.get(p + "held") is None  # revoked on exit
    return "lease"


@case("self_healing_lease")
def _self_healing(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    hook_threads: list[threading.Thread] = []

    def establish(lease_id: int) -> bool:
        hook_threads.append(threading.current_thread())
        return c.txn([Cmp.missing(p + "me")], [Op.put(p + "me", "1", lease=lease_id)]).succeeded

    lease = c.self_healing_lease(30, establish)
    assert isinstance(lease, SelfHealingLease)
    assert lease.start() is True
    kv = c.get(p + "me")
    assert kv is not None
    assert kv.lease == lease.current_lease_id
    lease.close()
    assert c.get(p + "me") is None
    assert hook_threads
    assert hook_threads[0] not in (threading.current_thread(), c._rt.loop_thread)
    return "self_healing_lease"


@case("lock")
def _lock(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        key = c.lock(p + "v3lock", lease.id, timeout=5)
        assert key == f"{p}v3lock/{lease.id:x}".encode()
        c.unlock(key)
    return "lock"


@case("unlock")
def _unlock(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        key = c.lock(p + "v3unlock", lease.id)
        c.unlock(key)
        assert c.get(key) is None
        c.unlock(key)  # idempotent
    return "unlock"


@case("election_campaign")
def _campaign(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        leader = c.election_campaign(p + "elect", "me", lease=lease.id, timeout=5)
        assert isinstance(leader, ElectionLeaderKey)
        assert leader.key == f"{p}elect/{lease.id:x}".encode()
        c.election_resign(leader)
    return "election_campaign"


@case("election_proclaim")
def _proclaim(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        leader = c.election_campaign(p + "proclaim", "v1", lease=lease.id)
        c.election_proclaim(leader, "v2")
        kv = c.election_leader(p + "proclaim")
        assert kv is not None and kv.value == b"v2"
        c.election_resign(leader)
    return "election_proclaim"


@case("election_leader")
def _leader(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.election_leader(p + "nobody") is None
    with c.lease(30) as lease:
        leader = c.election_campaign(p + "nobody", "me", lease=lease.id)
        kv = c.election_leader(p + "nobody")
        assert kv is not None and kv.key == leader.key
        c.election_resign(leader)
    return "election_leader"


@case("election_observe")
def _observe(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        leader = c.election_campaign(p + "observe", "v1", lease=lease.id)
        seen = c.election_observe(p + "observe")
        assert next(seen).value == b"v1"
        seen.close()
        c.election_resign(leader)
    return "election_observe"


@case("election_resign")
def _resign(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.lease(30) as lease:
        leader = c.election_campaign(p + "resign", "me", lease=lease.id)
        c.election_resign(leader)
        assert c.election_leader(p + "resign") is None
    return "election_resign"


@case("watch")
def _watch(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    rev = c.put(p + "w/1", "a").revision
    c.put(p + "w/2", "b")
    with c.watch(p + "w/", prefix=True, start_revision=rev) as watch:
        assert isinstance(watch, Watch)
        items = [next(watch), next(watch)]
    assert all(isinstance(i, WatchEvent) for i in items)
    assert [i.kv.value for i in items if isinstance(i, WatchEvent)] == [b"a", b"b"]
    return "watch"


@case("request_progress")
def _request_progress(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.watch(p + "progress"):
        c.request_progress()
    return "request_progress"


@case("close")
def _close(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.close()
    assert c.is_open is False  # still readable after the loop stopped
    with pytest.raises(ClientClosedError):
        c.get(p + "k")
    c.close()  # idempotent
    return "aclose"


@case("connection_state")
def _connection_state(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    assert c.connection_state is ConnectionState.CONNECTED
    return "<lambda>"


@case("connection_states")
def _connection_states(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    with c.connection_states() as states:
        assert next(states) is ConnectionState.CONNECTED
    assert list(states) == []  # closed by `with`
    return "connection_states"


@case("add_connection_state_listener")
def _add_connection_state_listener(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.add_connection_state_listener(print)
    assert len(c._a._conn.listeners) == 1
    c.remove_connection_state_listener(print)
    return "add_connection_state_listener"


@case("remove_connection_state_listener")
def _remove_connection_state_listener(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    c.add_connection_state_listener(print)
    c.remove_connection_state_listener(print)  # the same wrapper is found and removed
    assert len(c._a._conn.listeners) == 0
    return "remove_connection_state_listener"


@case("__enter__")
def _enter(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    fresh = connect(c.endpoints)
    with fresh as entered:
        assert entered is fresh
        assert fresh.is_open
    return ""


@case("__exit__")
def _exit(c: EtcdClient, p: str, r: pytest.FixtureRequest) -> str:
    fresh = connect(c.endpoints)
    thread = fresh._rt.loop_thread
    with fresh:
        fresh.put(p + "e", "1")
    assert not fresh.is_open
    assert not thread.is_alive()
    return ""


def _public_members(cls: type) -> set[str]:
    names = {n for n in vars(cls) if not n.startswith("_") or n in ("__enter__", "__exit__")}
    return names


def test_every_public_member_has_a_case() -> None:
    assert _public_members(EtcdClient) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_member_runs_through_the_facade(
    name: str, client: EtcdClient, trace: Trace, etcd_prefix: str, request: pytest.FixtureRequest
) -> None:
    expected = CASES[name](client, etcd_prefix, request)
    if expected.startswith("_unary_"):
        # A plain KV call is sent from the calling thread: no call reaches the loop at all.
        assert expected in trace.names()
        assert {kind for kind, _, _ in trace.calls} == {"direct"}  # (the cases put with it)
        assert trace.threads(expected) == {threading.current_thread()}
        assert trace.threads() == {threading.current_thread()}
    elif expected:
        assert expected in trace.names()
        # It ran on the client's loop thread, never in the test's thread.
        assert trace.threads(expected) == {client._rt.loop_thread}
        if name != "close":  # after close(), properties are read inline (the loop is gone)
            hops = {thread for kind, _, thread in trace.calls if kind != "direct"}
            assert hops == {client._rt.loop_thread}


def test_signatures_match_the_async_client() -> None:
    for name in _public_members(EtcdClient):
        sync = getattr(EtcdClient, name)
        original = getattr(etcd_recipes.client.EtcdClient, _async_name(name))
        if isinstance(sync, property):
            assert (sync.__doc__ is None) == (original.__doc__ is None)
            continue
        sync_params = inspect.signature(sync).parameters
        async_params = inspect.signature(original).parameters
        assert list(sync_params) == list(async_params), name
        for pname, param in sync_params.items():
            assert param.kind == async_params[pname].kind
            assert param.default == async_params[pname].default
    connect_sig = inspect.signature(connect)
    assert connect_sig.parameters == inspect.signature(etcd_recipes.client.connect).parameters


def _async_name(name: str) -> str:
    return {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}.get(name, name)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c, p: c.put("", "x"), EmptyKeyError),
        (lambda c, p: c.get(b""), EmptyKeyError),
        (lambda c, p: c.range(p, limit=-1), InvalidArgumentError),
        (lambda c, p: c.range(p, prefix=True, range_end=p + "z"), InvalidArgumentError),
        (lambda c, p: c.lease_grant(0), InvalidArgumentError),
        (lambda c, p: c.watch(p, start_revision=-1), InvalidArgumentError),
        (lambda c, p: c.txn(["not a compare"]), InvalidArgumentError),
    ],
)
def test_errors_are_the_async_api_types(
    client: EtcdClient, etcd_prefix: str, call: Callable[[EtcdClient, str], Any], error: type
) -> None:
    with pytest.raises(error) as info:
        call(client, etcd_prefix)
    assert type(info.value) is getattr(etcd_recipes.errors, type(info.value).__name__)
    assert type(info.value).__module__ == "etcd_recipes"  # the public module (anyio's way)
    assert isinstance(info.value, ValueError)  # misuse errors stay ValueErrors


def test_twins_are_stable_objects(client: EtcdClient, etcd_prefix: str) -> None:
    watch = client.watch(etcd_prefix)
    assert watch.start() is watch
    watch.close()
    watch.close()
    assert watch.is_closed
    assert repr(client).startswith("<blocking <etcd_recipes.EtcdClient")
    with pytest.raises(TypeError, match="created by the facade"):
        EtcdClient()


def test_many_threads_share_one_client(client: EtcdClient, etcd_prefix: str) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                key = f"{etcd_prefix}{n}/{i}"
                client.put(key, str(i))  # sent from this thread (no hop), as is the get
                assert client.get(key).value == str(i).encode()  # type: ignore[union-attr]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert client.count(etcd_prefix) == 160
