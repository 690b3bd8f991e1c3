"""SetPartitioner against a real etcd: items divided once each with fencing tokens, a stable
hand-over on joins and leaves, lost leases and deleted owner keys, cancellation leaving
nothing, and recovery after a compaction and a restart."""

from __future__ import annotations

import asyncio
import random

import pytest

from etcd_recipes import (
    Cmp,
    InvalidArgumentError,
    ItemAssigned,
    ItemNotOwnedError,
    ItemReleased,
    Op,
    PartitionState,
    SetPartitioner,
    connect,
)
from etcd_recipes.groups._assign import assignment, owner_of
from etcd_recipes.testing import TcpProxy
from tests.helpers import ETCD_QUIET_BEFORE_KILL, eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}
ITEMS = [f"item-{i:02d}" for i in range(12)]


async def owners(client, path) -> dict[str, tuple[str, int]]:
    """item -> (owner member id, create revision), read from etcd."""
    start = len(path) + len("/owners/")
    return {
        kv.key_text[start:]: (kv.value.decode(), kv.create_revision)
        for kv in await client.get_prefix(f"{path}/owners/")
    }


async def all_stable(*partitioners, timeout=15.0) -> None:
    for p in partitioners:
        assert await p.wait_stable(timeout=timeout), repr(p)


def expected(members) -> dict[str, str]:
    return {item: owner_of(item, sorted(members)) for item in ITEMS}


async def converged(client, path, partitioners) -> bool:
    """Every item owned once, by the member the assignment names, with its own token."""
    on_server = await owners(client, path)
    if {i: m for i, (m, _) in on_server.items()} != expected([p.member_id for p in partitioners]):
        return False
    return all(
        p.state is PartitionState.STABLE
        and p.assigned() == {i: r for i, (m, r) in on_server.items() if m == p.member_id}
        for p in partitioners
    )


async def test_items_are_divided_once_each_with_fencing_tokens(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    parts = [SetPartitioner(etcd_client, path, ITEMS, member_id=m) for m in "abc"]
    for p in parts:
        await p.start()
    await eventually(lambda: converged(etcd_client, path, parts), what="convergence")
    on_server = await owners(etcd_client, path)
    a = parts[0]
    mine = a.assigned()
    assert mine and all(on_server[item] == ("a", token) for item, token in mine.items())
    item = next(iter(mine))
    assert a.fencing_token(item) == mine[item]
    assert (await etcd_client.txn([a.compare(item)], [Op.put(f"{path}-out", item)])).succeeded
    assert "stable" in repr(a) and f"owned={len(mine)}/12" in repr(a)
    with pytest.raises(ItemNotOwnedError):
        a.compare(next(i for i in ITEMS if i not in mine))
    for p in parts:
        await p.aclose()
        assert p.state is PartitionState.CLOSED
    assert len(await etcd_client.get_prefix(path + "/")) == 0
    assert etcd_client._leases.lease_count == 0
    # The fencing token is dead with the ownership:
    assert not (
        await etcd_client.txn([Cmp.create_revision(a.owner_key(item)) == mine[item]], [])
    ).succeeded


async def test_a_join_moves_only_the_items_the_newcomer_wins(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    parts = [SetPartitioner(etcd_client, path, ITEMS, member_id=m) for m in "abc"]
    for p in parts:
        await p.start()
    await eventually(lambda: converged(etcd_client, path, parts), what="convergence")
    before = {i: m for i, (m, _) in (await owners(etcd_client, path)).items()}
    released: list[ItemReleased] = []
    for p in parts:
        p.add_listener(lambda e: released.append(e) if isinstance(e, ItemReleased) else None)
    d = SetPartitioner(etcd_client, path, ITEMS, member_id="d")
    d_events = d.events()
    await d.start()
    parts.append(d)
    await eventually(lambda: converged(etcd_client, path, parts), what="convergence after a join")
    after = {i: m for i, (m, _) in (await owners(etcd_client, path)).items()}
    moved = {i for i in ITEMS if before[i] != after[i]}
    assert moved == set(assignment(ITEMS, list("abcd"), "d"))  # and only to the newcomer
    await eventually(lambda: len(released) == len(moved), what="the release events")
    assert {e.item for e in released} == moved and not any(e.lost for e in released)
    got = [await asyncio.wait_for(anext(d_events), 5) for _ in moved]
    assert all(isinstance(e, ItemAssigned) for e in got) and {e.item for e in got} == moved
    # A leave spreads only the leaver's items:
    await parts.pop(1).aclose()
    await eventually(lambda: converged(etcd_client, path, parts), what="convergence after a leave")
    final = {i: m for i, (m, _) in (await owners(etcd_client, path)).items()}
    assert {i for i in ITEMS if final[i] != after[i]} == {i for i in ITEMS if after[i] == "b"}
    for p in parts:
        await p.aclose()


async def test_a_lost_lease_loses_every_item_then_heals(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    async with (
        SetPartitioner(etcd_client, path, ITEMS, member_id="a") as a,
        SetPartitioner(etcd_client, path, ITEMS, member_id="b") as b,
    ):
        await eventually(lambda: converged(etcd_client, path, [a, b]), what="convergence")
        events = a.events()
        old = a.assigned()
        await etcd_client.lease_revoke(a.member.lease_id)  # out of band: keys gone
        lost = [await asyncio.wait_for(anext(events), 10) for _ in old]
        assert all(isinstance(e, ItemReleased) and e.lost for e in lost), lost
        assert {e.item: e.fencing_token for e in lost} == old
        await eventually(lambda: converged(etcd_client, path, [a, b]), what="healed")
        new = a.assigned()
        assert new.keys() == old.keys()  # the same items (the same member id) ...
        assert all(new[i] > old[i] for i in new)  # ... with new fencing tokens
        assert a.has_exceptions  # the expiry was recorded


async def test_an_owner_key_deleted_out_of_band_is_lost_and_taken_again(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    async with SetPartitioner(etcd_client, path, ["x", "y"], member_id="a") as a:
        await a.wait_stable(timeout=10)
        events = a.events()
        token = a.fencing_token("x")
        await etcd_client.delete(a.owner_key("x"))
        assert await asyncio.wait_for(anext(events), 10) == ItemReleased("x", token, lost=True)
        again = await asyncio.wait_for(anext(events), 10)
        assert isinstance(again, ItemAssigned) and again.item == "x" and again.fencing_token > token


async def test_a_member_key_deleted_out_of_band_comes_back(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    async with (
        SetPartitioner(etcd_client, path, ITEMS, member_id="a") as a,
        SetPartitioner(etcd_client, path, ITEMS, member_id="b") as b,
    ):
        await eventually(lambda: converged(etcd_client, path, [a, b]), what="convergence")
        await etcd_client.delete(a.member.key)  # a is out of the group for a moment ...
        await eventually(lambda: a.member.is_member and converged(etcd_client, path, [a, b]))
        assert (await etcd_client.get(a.member.key)) is not None  # ... and back in it


async def test_an_item_held_by_someone_else_is_waited_for(etcd_client, etcd_prefix):
    """A foreign owner key (a dead owner whose lease has not expired yet) blocks the item
    until it goes; the partitioner never overwrites it."""
    path = etcd_prefix + "p"
    async with etcd_client.lease(30) as foreign:
        await etcd_client.put(f"{path}/owners/x", b"ghost", lease=foreign.id)
        async with SetPartitioner(etcd_client, path, ["x", "y"], member_id="a") as a:
            assert not await a.wait_stable(timeout=1.5)
            assert a.state is PartitionState.ACQUIRING and list(a.assigned()) == ["y"]
            assert "acquiring" in repr(a)
            assert (await etcd_client.get(f"{path}/owners/x")).value == b"ghost"
            await foreign.revoke()
            assert await a.wait_stable(timeout=10)
            assert list(a.assigned()) == ["x", "y"]


async def test_cancelled_wait_and_cancelled_starts_leave_nothing(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    async with etcd_client.lease(30) as foreign:
        await etcd_client.put(f"{path}/owners/x", b"ghost", lease=foreign.id)
        a = SetPartitioner(etcd_client, path, ["x", "y"], member_id="a")
        await a.start()
        waiting = asyncio.create_task(a.wait_stable())
        await asyncio.sleep(0.5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert a.state is PartitionState.ACQUIRING  # the cancel changed nothing
        await a.aclose()
        left = {kv.key_text for kv in await etcd_client.get_prefix(path + "/")}
        assert left == {f"{path}/owners/x"}  # only the foreign key
    rng = random.Random(5)
    for i in range(15):
        p = SetPartitioner(etcd_client, path, ["x", "y"], member_id=f"m{i}")
        task = asyncio.create_task(p.start())
        await asyncio.sleep(rng.uniform(0, 0.03))
        task.cancel()
        with contextlib_suppress():
            await task
        await p.aclose()
    assert len(await etcd_client.get_prefix(path + "/")) == 0
    assert etcd_client._leases.lease_count == 0


def contextlib_suppress():
    import contextlib

    return contextlib.suppress(asyncio.CancelledError)


async def test_bad_input_raises_before_anything_is_written(etcd_client, etcd_prefix):
    path = etcd_prefix + "p"
    for items in ([], "abc", ["a/b"], [""], [1]):
        with pytest.raises(InvalidArgumentError):
            SetPartitioner(etcd_client, path, items)
    with pytest.raises(InvalidArgumentError):
        SetPartitioner(etcd_client, path, ["a"], member_id="x/y")
    with pytest.raises(InvalidArgumentError):
        SetPartitioner(etcd_client, path, ["a"], lease_ttl=0)
    assert len(await etcd_client.get_prefix(path)) == 0


@pytest.mark.slow
async def test_a_compaction_while_cut_off_converges(fresh_etcd_server):
    """a cannot see b leave (its proxy blackholes) and the history is compacted: a re-reads
    both views and takes b's items."""
    server = fresh_etcd_server
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            a = await SetPartitioner(through, "/p", ITEMS, member_id="a", lease_ttl=30).start()
            b = await SetPartitioner(direct, "/p", ITEMS, member_id="b").start()
            await eventually(lambda: converged(direct, "/p", [a, b]), what="convergence")
            proxy.blackhole()
            await eventually(lambda: a.connection_state.value == "SUSPENDED", timeout=8)
            await b.aclose()
            await direct.compact((await direct.status()).revision)
            proxy.restore()
            await eventually(lambda: converged(direct, "/p", [a]), timeout=30, what="a has all")
            assert a.member.members() == {"a": b""}
            await a.aclose()
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_a_restart_past_the_ttl_heals_and_converges(fresh_etcd_server):
    server = fresh_etcd_server
    async with (
        connect(**server.client_kwargs(), **FAST) as c1,
        connect(**server.client_kwargs(), **FAST) as c2,
    ):
        a = await SetPartitioner(c1, "/p", ITEMS, member_id="a").start()
        b = await SetPartitioner(c2, "/p", ITEMS, member_id="b").start()
        await eventually(lambda: converged(c1, "/p", [a, b]), what="convergence")
        tokens = {**a.assigned(), **b.assigned()}
        await asyncio.sleep(ETCD_QUIET_BEFORE_KILL)
        server.kill()
        await asyncio.sleep(3.5)  # past the TTL: both leases are given up
        server.restart()
        await eventually(lambda: converged(c1, "/p", [a, b]), timeout=30, what="healed")
        again = {**a.assigned(), **b.assigned()}
        assert again.keys() == tokens.keys() and all(again[i] > tokens[i] for i in again)
        for p in (a, b):
            await p.aclose()
        assert len(await c1.get_prefix("/p/")) == 0


async def test_on_release_returns_before_anyone_can_take_the_item(etcd_client, etcd_prefix):
    """The hook runs while the owner key still exists (with the releasing member's token),
    and the new owner takes the item only after it returned; closing runs it too."""
    path = etcd_prefix + "p"
    log: list[tuple[str, str]] = []

    async def on_release(item: str, token: int) -> None:
        kv = await etcd_client.get(f"{path}/owners/{item}")
        assert kv is not None and kv.create_revision == token  # not given back yet
        log.append(("hook", item))
        await asyncio.sleep(0.3)
        log.append(("hook done", item))

    a = SetPartitioner(etcd_client, path, ITEMS, member_id="a", on_release=on_release)
    await a.start()
    assert await a.wait_stable(timeout=10)
    b = SetPartitioner(etcd_client, path, ITEMS, member_id="b")
    b.add_listener(
        lambda e: log.append(("b took", e.item)) if isinstance(e, ItemAssigned) else None
    )
    await b.start()
    await eventually(lambda: converged(etcd_client, path, [a, b]), what="convergence")
    moved = set(assignment(ITEMS, ["a", "b"], "b"))
    assert {i for kind, i in log if kind == "b took"} == moved
    for item in moved:
        assert log.index(("hook done", item)) < log.index(("b took", item))
    kept = set(a.assigned())
    await a.aclose()  # closing gives back, through the hook
    assert {i for kind, i in log if kind == "hook done"} == moved | kept
    assert not a.has_exceptions or all("on_release" not in e.context for e in a.exceptions)
    await b.aclose()


async def test_a_failing_or_slow_on_release_is_recorded_and_the_item_given_back(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "p"

    async def broken(item: str, token: int) -> None:
        if item == "x":
            raise RuntimeError("flush failed")
        await asyncio.sleep(30)

    a = SetPartitioner(
        etcd_client, path, ["x", "y"], member_id="a", on_release=broken, release_timeout=0.3
    )
    await a.start()
    assert await a.wait_stable(timeout=10)
    await a.aclose()
    assert len(await etcd_client.get_prefix(path + "/")) == 0
    contexts = [e for e in a.exceptions if e.context.endswith("on_release")]
    assert sorted(type(e.exception).__name__ for e in contexts) == [
        "EtcdTimeoutError",
        "RuntimeError",
    ]
    with pytest.raises(InvalidArgumentError):
        SetPartitioner(etcd_client, path, ["x"], on_release=42)
    with pytest.raises(InvalidArgumentError):
        SetPartitioner(etcd_client, path, ["x"], release_timeout=0)
