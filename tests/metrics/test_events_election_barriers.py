"""Election, barriers and transient key/values report the metrics SPI v2 events: one
``leadership_changed`` per transition (``acquired``, then ``relinquished`` or ``lost`` with a
``lease_lost``), one ``election.campaign`` span per campaign, one ``barrier_wait_finished`` and
``barrier.wait`` span per barrier wait, and ``lease_lost`` when a self-healing lease is lost.
Against a real etcd; a cancelled campaign or wait is checked to leave nothing in etcd."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    DistributedAtomicLong,
    DistributedBarrier,
    DistributedBarrierWithCount,
    DistributedDoubleBarrier,
    EtcdClient,
    InvalidArgumentError,
    LeaderLatch,
    LeaderObserver,
    LeaderSelector,
    LeadershipTerm,
    ResilienceConfig,
    TransientKeyValue,
    connect,
    naming_registration,
)
from etcd_recipes import sync as blocking

from ..helpers import eventually
from .recording import RecordingMetrics

QUEUED = ("leadership_changed", "barrier_wait_finished", "lease_lost")


def events(sink: RecordingMetrics) -> list[tuple[str, tuple[object, ...]]]:
    """The queued election/barrier events recorded, in order, after a flush (durations
    checked, then dropped)."""
    return sink.events(("barrier_wait_finished",), QUEUED)


async def keys_under(client: EtcdClient, prefix: str) -> list[str]:
    return [kv.key.decode() for kv in (await client.range(prefix, prefix=True)).kvs]


# ------------------------------------------------------------------------------- election


async def test_latch_term_acquired_then_relinquished(client, sink, etcd_prefix):
    path = etcd_prefix + "e"
    async with LeaderLatch(client, path, metrics_name="orders") as latch:
        assert await latch.await_leadership(timeout=10)
    assert events(sink) == [
        ("leadership_changed", ("LeaderLatch", "orders", "acquired")),
        ("leadership_changed", ("LeaderLatch", "orders", "relinquished")),
    ]
    assert sink.spans(attributes=True) == [
        ("LeaderLatch", "orders", "election.campaign", path, {}),
        ("election.campaign", "elected"),
    ]


async def test_lost_term_reports_lost_and_the_lease_kind(client, sink, etcd_prefix, etcd_server):
    path = etcd_prefix + "e"
    async with LeaderLatch(client, path, client_id="a") as latch:
        assert await latch.await_leadership(timeout=10)
        lease_id = latch.lease_id
        assert lease_id is not None
        async with connect(**etcd_server.client_kwargs()) as other:
            await other.lease_revoke(lease_id)  # out of band: the term is over
        # The latch notices, steps down, contests again by itself and wins the next term
        # (perhaps before a poll of is_leader could see it step down).
        await eventually(
            lambda: latch.is_leader and latch.lease_id != lease_id, what="the next term"
        )
    got = events(sink)
    assert got[:3] == [
        ("leadership_changed", ("LeaderLatch", "", "acquired")),
        ("leadership_changed", ("LeaderLatch", "", "lost")),
        ("lease_lost", ("LeaderLatch", "", "revoked")),
    ]
    assert got[3:] == [
        ("leadership_changed", ("LeaderLatch", "", "acquired")),
        ("leadership_changed", ("LeaderLatch", "", "relinquished")),
    ]
    assert [s for s in sink.spans(attributes=True) if len(s) == 2] == [
        ("election.campaign", "elected")
    ] * 2


async def test_cancelled_campaign_reports_cancelled_and_leaves_no_key(client, sink, etcd_prefix):
    path = etcd_prefix + "e"
    async with LeaderLatch(client, path, client_id="first") as first:
        assert await first.await_leadership(timeout=10)
        second = LeaderLatch(client, path, client_id="second", metrics_name="b")
        await second.start()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await second.await_leadership()  # cancelled mid-wait: withdraws the candidacy
        assert second.is_closed
        assert await keys_under(client, path + "/participants/") == [path + "/participants/first"]
        leader = await client.get(path + "/LEADER")
        assert leader is not None and leader.value.startswith(b"first:")
    assert ("LeaderLatch", "b", "election.campaign", path, {}) in sink.spans(attributes=True)
    ended = [s for s in sink.spans(attributes=True) if len(s) == 2]
    assert sorted(ended) == [("election.campaign", "cancelled"), ("election.campaign", "elected")]
    assert ("leadership_changed", ("LeaderLatch", "b", "acquired")) not in events(sink)
    assert await keys_under(client, path) == []


async def test_selector_run_reports_one_term(client, sink, etcd_prefix):
    path = etcd_prefix + "e"
    seen: list[int] = []

    async def lead(selector: LeaderSelector, term: LeadershipTerm) -> None:
        seen.append(term.fencing_token)

    async with LeaderSelector(client, path, lead, metrics_name="jobs") as selector:
        assert await selector.run() is not None
    assert len(seen) == 1
    assert events(sink) == [
        ("leadership_changed", ("LeaderSelector", "jobs", "acquired")),
        ("leadership_changed", ("LeaderSelector", "jobs", "relinquished")),
    ]


# ------------------------------------------------------------------------------- barriers


async def test_gate_wait_timeout_then_passed(client, sink, etcd_prefix):
    path = etcd_prefix + "gate"
    async with DistributedBarrier(client, path) as gate:
        assert await gate.set_barrier()
        # wait_on_missing_barriers=False: the second wait passes even when the removal comes
        # before its first read.
        waiter = DistributedBarrier(
            client, path, wait_on_missing_barriers=False, metrics_name="deploy"
        )
        async with waiter:
            assert not await waiter.wait_on_barrier(timeout=0.2)
            wait = asyncio.create_task(waiter.wait_on_barrier(timeout=10))
            await eventually(lambda: len(sink.of("start_span")) == 2, what="the second wait")
            await gate.remove_barrier()
            assert await wait
    assert events(sink) == [
        ("barrier_wait_finished", ("DistributedBarrier", "deploy", "timeout")),
        ("barrier_wait_finished", ("DistributedBarrier", "deploy", "passed")),
    ]
    assert sink.spans(attributes=True) == [
        ("DistributedBarrier", "deploy", "barrier.wait", path, {}),
        ("barrier.wait", "timeout"),
        ("DistributedBarrier", "deploy", "barrier.wait", path, {}),
        ("barrier.wait", "passed"),
    ]


async def test_counted_wait_cancelled_leaves_no_waiting_key(client, sink, etcd_prefix):
    path = etcd_prefix + "rv"
    async with DistributedBarrierWithCount(client, path, member_count=2) as barrier:
        task = asyncio.create_task(barrier.wait_on_barrier())

        async def arrived() -> bool:
            return await barrier.waiter_count() == 1

        await eventually(arrived, what="the member to arrive")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await barrier.waiter_count() == 0
    assert events(sink) == [
        ("barrier_wait_finished", ("DistributedBarrierWithCount", "", "cancelled")),
    ]
    assert sink.spans(attributes=True)[-1] == ("barrier.wait", "cancelled")
    assert await keys_under(client, path + "/waiting/") == []


async def test_counted_wait_closed_meanwhile_is_cancelled(client, sink, etcd_prefix):
    barrier = DistributedBarrierWithCount(client, etcd_prefix + "rv", member_count=2)
    task = asyncio.create_task(barrier.wait_on_barrier())

    async def arrived() -> bool:
        return await barrier.waiter_count() == 1

    await eventually(arrived, what="the member to arrive")
    await barrier.aclose()
    assert await task is False
    assert events(sink) == [
        ("barrier_wait_finished", ("DistributedBarrierWithCount", "", "cancelled")),
    ]


async def test_double_barrier_reports_its_own_phases_once(client, sink, etcd_prefix):
    path = etcd_prefix + "phase"
    async with DistributedDoubleBarrier(client, path, 1, metrics_name="p1") as barrier:
        assert await barrier.enter(timeout=10)
        assert await barrier.leave(timeout=10)
    assert events(sink) == [
        ("barrier_wait_finished", ("DistributedDoubleBarrier", "p1", "passed")),
        ("barrier_wait_finished", ("DistributedDoubleBarrier", "p1", "passed")),
    ]  # not the inner counted barriers' as well
    assert sink.spans(attributes=True) == [
        ("DistributedDoubleBarrier", "p1", "barrier.wait", path, {"barrier.phase": "enter"}),
        ("barrier.wait", "passed"),
        ("DistributedDoubleBarrier", "p1", "barrier.wait", path, {"barrier.phase": "leave"}),
        ("barrier.wait", "passed"),
    ]


async def test_double_barrier_enter_cancelled_mid_wait_leaves_nothing(client, sink, etcd_prefix):
    path = etcd_prefix + "phase"
    async with DistributedDoubleBarrier(client, path, 2, metrics_name="p2") as barrier:
        task = asyncio.create_task(barrier.enter())

        async def arrived() -> bool:
            return await barrier.enter_waiter_count() == 1

        await eventually(arrived, what="the member to enter")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Its waiting key and that key's lease are gone (the round's lease-less ready key is
        # the family's layout: it stays for the next arrivals).
        assert await keys_under(client, path + "/enter/waiting/") == []
        assert await keys_under(client, path + "/leave/") == []
        assert await barrier.enter_waiter_count() == 0
    assert events(sink) == [
        ("barrier_wait_finished", ("DistributedDoubleBarrier", "p2", "cancelled")),
    ]
    assert sink.spans()[-1] == ("barrier.wait", "cancelled")


async def test_bad_timeout_is_not_a_wait(client, sink, etcd_prefix):
    async with DistributedBarrier(client, etcd_prefix + "gate") as gate:
        with pytest.raises(InvalidArgumentError):
            await gate.wait_on_barrier(timeout=-1)
    assert events(sink) == [] and sink.spans(attributes=True) == []


# ------------------------------------------------------------------------------- lease loss


@pytest.mark.parametrize("kind", ["gate", "transient", "naming"])
async def test_a_lost_self_healing_lease_is_one_lease_lost(
    client, sink, etcd_prefix, etcd_server, kind
):
    key = etcd_prefix + kind
    if kind == "gate":
        recipe: object = DistributedBarrier(client, key, metrics_name="g")
        assert await recipe.set_barrier()  # type: ignore[attr-defined]
        lease_id = recipe._lease.current_lease_id  # type: ignore[attr-defined]
        label = ("DistributedBarrier", "g")
    elif kind == "transient":
        recipe = TransientKeyValue(client, key, b"x", metrics_name="t")
        await recipe.start()  # type: ignore[attr-defined]
        lease_id = recipe.lease_id  # type: ignore[attr-defined]
        label = ("TransientKeyValue", "t")
    else:
        recipe = naming_registration(client, key, "127.0.0.1:1", metrics_name="n")
        await recipe.start()  # type: ignore[attr-defined]
        lease_id = recipe.lease_id  # type: ignore[attr-defined]
        label = (type(recipe).__name__, "n")
    async with connect(**etcd_server.client_kwargs()) as other:
        await other.lease_revoke(lease_id)  # out of band
    await eventually(lambda: bool(sink.of("lease_lost")), what="the loss to be reported")
    await recipe.aclose()  # type: ignore[attr-defined]
    assert events(sink) == [("lease_lost", (*label, "expired"))]
    assert await keys_under(client, key) == []


async def test_bad_metrics_name_everywhere(client, etcd_prefix):
    p = etcd_prefix

    async def lead(term: LeadershipTerm) -> None:
        pass

    for make in (
        lambda: LeaderLatch(client, p + "e", metrics_name="no spaces"),
        lambda: LeaderSelector(client, p + "e", lead, metrics_name="x" * 65),
        lambda: LeaderObserver(client, p + "e", metrics_name=7),
        lambda: DistributedBarrier(client, p + "b", metrics_name="a b"),
        lambda: DistributedBarrierWithCount(client, p + "b", 2, metrics_name="a b"),
        lambda: DistributedDoubleBarrier(client, p + "b", 2, metrics_name="a b"),
        lambda: DistributedAtomicLong(client, p + "c", metrics_name="a b"),
        lambda: TransientKeyValue(client, p + "k", b"v", metrics_name="a b"),
        lambda: naming_registration(client, p + "n", "127.0.0.1:1", metrics_name="a b"),
    ):
        with pytest.raises(InvalidArgumentError):
            make()


def test_sync_facade_latch_and_barrier_from_a_thread(etcd_server, etcd_prefix):
    sink = RecordingMetrics()
    config = ResilienceConfig(metrics=sink)
    with blocking.connect(**etcd_server.client_kwargs(), resilience=config) as client:
        with blocking.LeaderLatch(client, etcd_prefix + "e", metrics_name="s") as latch:
            assert latch.await_leadership(timeout=10)
        barrier = blocking.DistributedBarrierWithCount(
            client, etcd_prefix + "b", 1, metrics_name="s"
        )
        assert barrier.wait_on_barrier(timeout=10)
        barrier.close()
    assert events(sink) == [
        ("leadership_changed", ("LeaderLatch", "s", "acquired")),
        ("leadership_changed", ("LeaderLatch", "s", "relinquished")),
        ("barrier_wait_finished", ("DistributedBarrierWithCount", "s", "passed")),
    ]
