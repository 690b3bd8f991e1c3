"""Trace context through work items (``trace_propagation=``, ``contrib.otel``), against a real
etcd: the producer's context reaches a consumer on another client as a link of its
``queue.receive`` and ``queue.settle`` spans; with the option off the store holds exactly what
it holds without any tracing; ``trace/<id>`` goes with the item on ack and purge; a garbage
context never breaks a receive."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from etcd_recipes import (
    DistributedWorkQueue,
    EtcdClient,
    InvalidArgumentError,
    MetricsSpan,
    ResilienceConfig,
    connect,
)
from etcd_recipes.contrib.otel import OpenTelemetryMetrics, TraceContextPropagation


class Tracing:
    """One process's tracing: a provider with an in-memory exporter, and a sink on it."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")
        self.sink = OpenTelemetryMetrics(tracer_provider=self.provider)

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@asynccontextmanager
async def client_for(etcd_server: Any, tracing: Tracing | None) -> AsyncIterator[EtcdClient]:
    resilience = ResilienceConfig() if tracing is None else ResilienceConfig(metrics=tracing.sink)
    async with connect(**etcd_server.client_kwargs(), resilience=resilience) as client:
        yield client


async def dump(client: EtcdClient, prefix: str) -> dict[str, bytes]:
    result = await client.get_prefix(prefix)
    return {kv.key.decode()[len(prefix) :]: kv.value for kv in result.kvs}


async def test_the_producers_context_reaches_a_consumer_on_another_client(
    etcd_server: Any, etcd_prefix: str
) -> None:
    producer_side, consumer_side = Tracing(), Tracing()
    path = etcd_prefix + "jobs"
    propagation = TraceContextPropagation()
    async with (
        client_for(etcd_server, producer_side) as pc,
        client_for(etcd_server, consumer_side) as cc,
        DistributedWorkQueue(pc, path, trace_propagation=propagation) as producer,
        DistributedWorkQueue(cc, path, trace_propagation=TraceContextPropagation()) as consumer,
    ):
        with producer_side.tracer.start_as_current_span("checkout"):
            item_id = await producer.enqueue(b"ship-7")
        (enqueue,) = producer_side.spans("queue.enqueue")
        sent = enqueue.get_span_context()
        assert sent is not None
        # Stored beside the item: the W3C traceparent of the queue.enqueue span itself.
        stored = (await dump(pc, path + "/trace/"))[item_id]
        fields = json.loads(stored)
        flags = int(sent.trace_flags)
        tp = f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{flags:02x}"
        assert fields["traceparent"] == tp

        item = await consumer.receive(timeout=10)
        assert item is not None and item.id == item_id
        assert item.trace_context == stored
        with consumer_side.tracer.start_as_current_span("ship", context=propagation.extract(item)):
            pass
        assert await item.ack()

    (receive,) = consumer_side.spans("queue.receive")
    (settle,) = consumer_side.spans("queue.settle")
    for span in (receive, settle):
        # A link (the messaging conventions' advice for receive), not a parent: the consumer's
        # spans start their own traces.
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (sent.trace_id, sent.span_id)
        ]
        assert span.parent is None
    # extract() makes the producer's span the parent of a handler's span.
    (ship,) = consumer_side.spans("ship")
    assert ship.parent is not None
    assert (ship.parent.trace_id, ship.parent.span_id) == (sent.trace_id, sent.span_id)


async def test_without_a_sink_the_callers_span_is_stored(
    etcd_server: Any, etcd_prefix: str
) -> None:
    app = Tracing()  # the application traces; the client has the no-op sink (no spans)
    path = etcd_prefix + "jobs"
    async with (
        client_for(etcd_server, None) as client,
        DistributedWorkQueue(client, path, trace_propagation=TraceContextPropagation()) as q,
    ):
        with app.tracer.start_as_current_span("request") as request:
            await q.enqueue(b"a")
        await q.enqueue(b"outside any span")  # no valid current span: nothing is stored
        first = await q.receive(timeout=10)
        second = await q.receive(timeout=10)
        assert first is not None and second is not None
        sent = request.get_span_context()
        assert json.loads(first.trace_context or b"")["traceparent"].split("-")[1:3] == [
            f"{sent.trace_id:032x}",
            f"{sent.span_id:016x}",
        ]
        assert second.trace_context is None
        assert len(await dump(client, path + "/trace/")) == 1
        assert await first.ack() and await second.ack()
        assert await dump(client, path + "/") == {}


async def scenario(client: EtcdClient, path: str, **options: Any) -> dict[str, bytes]:
    """Every kind of write a work queue makes; the store afterwards with ids numbered."""
    async with DistributedWorkQueue(client, path, client_id="c1", **options) as queue:
        ids = [await queue.enqueue(b"one")]
        ids += await queue.enqueue_all([b"two"])
        ids += await queue.enqueue_all([b"three", b"four"])
        ids.append(await queue.enqueue(b"later", delay=3600))
        first = await queue.receive(timeout=10)
        second = await queue.receive(timeout=10)
        third = await queue.receive(timeout=10)
        assert first is not None and second is not None and third is not None
        assert await first.ack()
        assert await second.dead_letter("bad")
        assert await third.requeue()
        held = await queue.receive(timeout=10)  # the requeued one, attempt 2, left claimed
        assert held is not None and held.id == third.id
        store = await dump(client, path + "/")
    numbered = {}
    for key, value in store.items():
        for n, item_id in enumerate(ids):
            key = key.replace(item_id, f"#{n}")
        numbered[key] = value
    return numbered


async def test_off_by_default_the_store_is_what_it_is_without_tracing(
    etcd_server: Any, etcd_prefix: str
) -> None:
    tracing = Tracing()
    async with client_for(etcd_server, None) as plain:
        baseline = await scenario(plain, etcd_prefix + "plain")
    async with client_for(etcd_server, tracing) as traced:
        with tracing.tracer.start_as_current_span("request"):
            default = await scenario(traced, etcd_prefix + "default")
            explicit = await scenario(traced, etcd_prefix + "none", trace_propagation=None)
            on = await scenario(
                traced, etcd_prefix + "on", trace_propagation=TraceContextPropagation()
            )
    assert tracing.spans("queue.enqueue")  # spans were made: only propagation was off
    # The layout the JVM library knows, byte for byte, and nothing else.
    assert sorted(baseline) == [
        "attempts/#1",
        "attempts/#2",
        "claimed/#2",
        "claims/#2",
        "delayed/#4",
        "dlq/#1",
        "items/#3",
        "reasons/#1",
    ]
    assert baseline["attempts/#2"] == b"\x00\x00\x00\x02"
    assert baseline["claims/#2"] == b"c1"
    assert default == baseline
    assert explicit == baseline
    # With it on, the same store plus one trace/ key per item still in the queue (the acked
    # one's went with it; the dead letter keeps its own until purged).
    contexts = {k: v for k, v in on.items() if k.startswith("trace/")}
    assert sorted(contexts) == ["trace/#1", "trace/#2", "trace/#3", "trace/#4"]
    assert {k: v for k, v in on.items() if not k.startswith("trace/")} == baseline


async def test_ack_and_purge_remove_the_context_and_requeues_keep_it(
    etcd_server: Any, etcd_prefix: str
) -> None:
    tracing = Tracing()
    path = etcd_prefix + "jobs"
    propagation = TraceContextPropagation()
    async with (
        client_for(etcd_server, tracing) as client,
        DistributedWorkQueue(client, path, trace_propagation=propagation) as queue,
        DistributedWorkQueue(client, path) as untraced,  # a consumer with propagation off
    ):
        with tracing.tracer.start_as_current_span("request"):
            acked, dead, retried, other = await queue.enqueue_all([b"a", b"b", b"c", b"d"])

        async def contexts() -> set[str]:
            return set(await dump(client, path + "/trace/"))

        assert await contexts() == {acked, dead, retried, other}
        for expected in (acked, dead, retried):
            item = await queue.receive(timeout=10)
            assert item is not None and item.id == expected and item.trace_context
            if expected == acked:
                assert await item.ack()
            elif expected == dead:
                assert await item.dead_letter("poison")
            else:
                assert await item.requeue()
        assert await contexts() == {dead, retried, other}
        again = await queue.receive(timeout=10)  # the requeued item still carries its context
        assert again is not None and again.id == retried and again.attempt == 2
        assert again.trace_context
        assert await again.ack()
        # A consumer without propagation reads no context but still deletes it on ack.
        plain = await untraced.receive(timeout=10)
        assert plain is not None and plain.id == other and plain.trace_context is None
        assert await plain.ack()
        assert await contexts() == {dead}
        assert await queue.requeue_dead_letter(dead)  # back from the dead letters: kept
        assert await contexts() == {dead}
        revived = await queue.receive(timeout=10)
        assert revived is not None and revived.trace_context
        assert await revived.dead_letter("still poison")
        assert await queue.purge_dead_letter(dead)
        assert await dump(client, path + "/") == {}
    # ack, dead letter, requeue, ack, the untraced consumer's ack (no link), dead letter
    assert [len(s.links) for s in tracing.spans("queue.settle")] == [1, 1, 1, 1, 0, 1]


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json",
        b"[1, 2]",
        b'{"traceparent": 7}',
        b'{"traceparent": "00-zzzz-0000000000000001-01"}',
        b'{"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"}',
        b"\xff\xfe",
    ],
)
async def test_a_garbage_context_is_ignored(
    etcd_server: Any, etcd_prefix: str, garbage: bytes
) -> None:
    tracing = Tracing()
    path = etcd_prefix + "jobs"
    async with (
        client_for(etcd_server, tracing) as client,
        DistributedWorkQueue(client, path, trace_propagation=TraceContextPropagation()) as q,
    ):
        item_id = await q.enqueue(b"job")
        await client.put(f"{path}/trace/{item_id}", garbage)
        item = await q.receive(timeout=10)
        assert item is not None and item.id == item_id
        assert item.trace_context == garbage
        assert await item.ack()
        assert await dump(client, path + "/") == {}
    (receive,) = tracing.spans("queue.receive")
    assert receive.links == ()
    assert TraceContextPropagation().extract(garbage) == {}  # an empty context: a new trace


class Broken:
    """A propagation whose every call raises."""

    def inject(self, span: MetricsSpan | None) -> bytes | None:
        raise RuntimeError("inject bug")

    def link(self, span: MetricsSpan, context: bytes) -> None:
        raise RuntimeError("link bug")


class Junk:
    """A propagation that returns what a queue cannot store."""

    def inject(self, span: MetricsSpan | None) -> Any:
        return "a str, not bytes"

    def link(self, span: MetricsSpan, context: bytes) -> None:
        raise AssertionError("never called: nothing was stored")


async def test_a_failing_propagation_never_breaks_the_queue(
    etcd_server: Any, etcd_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    tracing = Tracing()
    path = etcd_prefix + "jobs"
    async with (
        client_for(etcd_server, tracing) as client,
        DistributedWorkQueue(client, path, trace_propagation=Broken()) as broken,
        DistributedWorkQueue(client, path, trace_propagation=Junk()) as junk,
    ):
        with caplog.at_level(logging.WARNING, logger="etcd_recipes.work_queue"):
            await junk.enqueue(b"a")
            await broken.enqueue(b"b")
            assert await dump(client, path + "/trace/") == {}  # nothing usable: none stored
            first_id = await broken.enqueue(b"c")
            await client.put(f"{path}/trace/{first_id}", b"ctx")  # so that link() is called
            for _ in range(3):
                item = await broken.receive(timeout=10)
                assert item is not None
                assert await item.ack()
        assert await dump(client, path + "/") == {}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("inject bug" in m for m in messages) == 1  # logged once, not per call
    assert sum("link bug" in m for m in messages) == 1
    assert any("returned str" in m for m in messages)


async def test_a_propagation_without_inject_and_link_is_refused(etcd_client: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="trace_propagation"):
        DistributedWorkQueue(etcd_client, "/q", trace_propagation=object())  # type: ignore[arg-type]
