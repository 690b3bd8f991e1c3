"""The groups family's metrics: one ``partition_changed`` per item taken, given back or lost
(``assigned``, ``released``, ``lost``), ``lease_lost`` when a member's lease is lost, the
member view's cache events under the partitioner's ``metrics_name``; and the two sinks'
series for them (Prometheus ``partition_transitions_total`` / ``partition_items``,
OpenTelemetry ``partition.transitions`` / ``partition.items``)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from etcd_recipes import GroupMember, ResilienceConfig, SetPartitioner, connect
from tests.helpers import eventually
from tests.metrics.recording import RecordingMetrics


@pytest.fixture
def sink() -> RecordingMetrics:
    return RecordingMetrics()


@pytest.fixture
async def client(etcd_server, sink):
    async with connect(
        **etcd_server.client_kwargs(), resilience=ResilienceConfig(metrics=sink)
    ) as c:
        yield c


async def test_a_partitioner_reports_each_transition(client, sink, etcd_prefix):
    p = SetPartitioner(client, etcd_prefix + "p", ["a", "b", "c"], metrics_name="jobs")
    await p.start()
    assert await p.wait_stable(timeout=10)
    token = p.fencing_token("a")
    await client.delete(p.owner_key("a"))  # out of band: lost, then taken again
    await eventually(lambda: p.assigned().get("a", token) != token, what="retaken")
    await p.aclose()
    sink.flush()
    transitions = Counter(t for recipe, name, t in sink.of("partition_changed"))
    assert {r for r, _, _ in sink.of("partition_changed")} == {"SetPartitioner"}
    assert {n for _, n, _ in sink.of("partition_changed")} == {"jobs"}
    assert transitions == {"assigned": 4, "lost": 1, "released": 3}
    # The two views (members, owners) load under the partitioner's metrics_name:
    loads = [(r, n, k) for r, n, k, _, _ in sink.of("cache_synced")]
    assert loads == [("PrefixCache", "jobs", "initial")] * 2


async def test_a_member_reports_its_lost_lease(client, sink, etcd_prefix):
    async with GroupMember(client, etcd_prefix + "g", metrics_name="workers") as me:
        restored = asyncio.Event()
        me.add_listener(lambda e: restored.set() if type(e).__name__ == "LeaseRestored" else None)
        await client.lease_revoke(me.lease_id)
        await asyncio.wait_for(restored.wait(), 10)
    sink.flush()
    assert sink.of("lease_lost") == [("GroupMember", "workers", "expired")] or sink.of(
        "lease_lost"
    ) == [("GroupMember", "workers", "revoked")]


def test_the_prometheus_series() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from etcd_recipes.contrib.prometheus import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    sink = PrometheusMetrics(registry=registry)
    for transition in ("assigned", "assigned", "assigned", "released", "lost"):
        sink.partition_changed("SetPartitioner", "jobs", transition)
    labels = {"recipe": "SetPartitioner", "name": "jobs"}
    assert registry.get_sample_value("etcd_recipes_partition_items", labels) == 1
    total = "etcd_recipes_partition_transitions_total"
    assert registry.get_sample_value(total, {**labels, "transition": "assigned"}) == 3
    assert registry.get_sample_value(total, {**labels, "transition": "lost"}) == 1


def test_the_opentelemetry_instruments() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from tests.contrib.test_otel import Rig, _key

    rig = Rig()
    for transition in ("assigned", "assigned", "released"):
        rig.sink.partition_changed("SetPartitioner", "jobs", transition)
    p = rig.points()
    jobs = {"recipe": "SetPartitioner", "name": "jobs"}
    assert p[_key("etcd_recipes.partition.items", **jobs)].value == 1
    key = _key("etcd_recipes.partition.transitions", **jobs, transition="assigned")
    assert p[key].value == 2
