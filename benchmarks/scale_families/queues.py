"""Queue depth: what one operation costs when N items wait (issue 33 item 1: within 1.5x of its
cost at depth 100, at depth 100,000).

Each row fills a fresh queue with N items (raw transactions of 100 puts in the queue's own key
layout: the fill is not what is measured), then times ``OPS`` operations one after another
and reports the **mean** per operation (the per-item cost a consumer pays, amortised reads
included; a median hides a read paid once per window):

* ``fifo take`` -- ``DistributedQueue.try_dequeue()``, 1,024 of them (what one ordering read
  serves: the depth goes from N + 1,024 to N); ``fifo enqueue``;
* ``priority take`` / ``priority enqueue`` -- 10 priority levels, N items spread over them;
* ``work receive+ack`` -- ``receive(timeout=0)`` then ``ack()``; ``work enqueue``;
* ``work receive+ack, N delayed`` -- 200 ready items beside N delayed ones not yet due;
* ``work receive+dead_letter, N dead`` -- items dead-lettered with N dead letters already;
* ``work batch of 16, per item`` -- ``receive_many(16)`` + ``ack_many``, per item;
* ``work size()`` and ``queue stats`` (``inspection.queue_stats``) -- exact counts: etcd
  visits every key to count, so these follow their floor;
* floors, bare etcd beside them: ``etcd: range limit 4 of the prefix`` (what an unbounded
  head read costs), ``etcd: range limit 4 below a bound`` (what a bounded one costs) and
  ``etcd: count of the prefix``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from etcd_recipes import (
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    EtcdClient,
    Op,
    WorkQueueConfig,
)
from etcd_recipes.queues.inspection import queue_stats
from scale_families._api import FamilyResult, Row, ScaleContext

OPS = 200  # operations timed per row and size
# A FIFO take reads a window of up to 1,024 names sorted by revision (etcd sorts the whole
# queue for it) and serves the next takes from it: time as many takes as a window serves.
FIFO_OPS = 1024
VALUE = b"x" * 64
CONFIG = WorkQueueConfig(visibility_timeout=30, sweep_interval=5)
NOW = int(time.time() * 1000)


async def fill(client: EtcdClient, keys: list[str]) -> None:
    for start in range(0, len(keys), 100):
        await client.txn([], [Op.put(k, VALUE) for k in keys[start : start + 100]])


def work_keys(prefix: str, n: int, *, part: str = "items", ahead: int = 0) -> list[str]:
    """N work-queue names, one per millisecond, ending now (``ahead`` ms in the future)."""
    return [f"{prefix}{part}/{NOW - n + i + ahead:019d}-aaa" for i in range(n)]


async def mean_time(op: Callable[[], Awaitable[object]], n: int = OPS) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await op()
    return (time.perf_counter() - started) / n


async def fifo_rows(ctx: ScaleContext, client: EtcdClient, n: int) -> dict[str, float]:
    prefix = ctx.fresh_prefix("fifo")
    await fill(client, [f"{prefix}{NOW - n + i:019d}-aaa" for i in range(n + FIFO_OPS)])
    queue = DistributedQueue(client, prefix)
    take = await mean_time(queue.try_dequeue, FIFO_OPS)
    put = await mean_time(lambda: queue.enqueue(VALUE))
    size = await mean_time(queue.size, 20)
    return {"fifo take": take, "fifo enqueue": put, "fifo size()": size}


async def priority_rows(ctx: ScaleContext, client: EtcdClient, n: int) -> dict[str, float]:
    prefix = ctx.fresh_prefix("prio")
    total = n + OPS
    await fill(client, [f"{prefix}{i % 10:05d}/{i // 10:016d}" for i in range(total)])
    for level in range(10):  # the guards, as this library's enqueues leave them
        await client.put(f"__{prefix.rstrip('/')}/{level:05d}", str(total // 10))
    queue = DistributedPriorityQueue(client, prefix)
    take = await mean_time(queue.try_dequeue)
    turn = iter(range(10**9))
    put = await mean_time(lambda: queue.enqueue(VALUE, next(turn) % 10))
    await client.delete(f"__{prefix.rstrip('/')}/", prefix=True)
    return {"priority take": take, "priority enqueue": put}


async def receive_ack(queue: DistributedWorkQueue[bytes]) -> None:
    item = await queue.receive(timeout=0)
    assert item is not None
    assert await item.ack()


async def work_rows(ctx: ScaleContext, client: EtcdClient, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    prefix = ctx.fresh_prefix("work")
    await fill(client, work_keys(prefix, n + OPS))
    async with DistributedWorkQueue(client, prefix, CONFIG) as queue:
        await receive_ack(queue)  # the consumer lease
        out["work receive+ack"] = await mean_time(lambda: receive_ack(queue))
        out["work enqueue"] = await mean_time(lambda: queue.enqueue(VALUE))
        out["work size()"] = await mean_time(queue.size, 20)
        out["queue stats"] = await mean_time(lambda: queue_stats(client, prefix), 20)

        got = 0

        async def batch() -> None:  # up to 16: fewer where the keys leave a gap
            nonlocal got
            items = await queue.receive_many(16, timeout=0)
            assert items
            assert all(await queue.ack_many(items))
            got += len(items)

        spent = await mean_time(batch, OPS // 16) * (OPS // 16)
        out["work batch of 16, per item"] = spent / got

    prefix = ctx.fresh_prefix("delayed")
    await fill(client, work_keys(prefix, OPS + 1))
    await fill(client, work_keys(prefix, n, part="delayed", ahead=3_600_000))
    async with DistributedWorkQueue(client, prefix, CONFIG) as queue:
        await receive_ack(queue)
        out["work receive+ack, N delayed"] = await mean_time(lambda: receive_ack(queue))

    prefix = ctx.fresh_prefix("dead")
    await fill(client, work_keys(prefix, OPS + 1))
    await fill(client, work_keys(prefix, n, part="dlq"))
    async with DistributedWorkQueue(client, prefix, CONFIG) as queue:
        await receive_ack(queue)

        async def dead() -> None:
            item = await queue.receive(timeout=0)
            assert item is not None
            assert await item.dead_letter("benchmark")

        out["work receive+dead_letter, N dead"] = await mean_time(dead)
    return out


async def floor_rows(ctx: ScaleContext, client: EtcdClient, n: int) -> dict[str, float]:
    prefix = ctx.fresh_prefix("floor")
    keys = work_keys(prefix, n)
    await fill(client, keys)
    bound = keys[min(63, n - 1)]
    return {
        "etcd: range limit 4 of the prefix": await mean_time(
            lambda: client.range(prefix, prefix=True, limit=4)
        ),
        "etcd: range limit 4 below a bound": await mean_time(
            lambda: client.range(prefix, range_end=bound, limit=4)
        ),
        "etcd: count of the prefix": await mean_time(lambda: client.count(prefix), 20),
    }


BOUNDED = "etcd: range limit 4 below a bound"
FLOORS = {
    "priority take": BOUNDED,
    "work receive+ack": BOUNDED,
    "work receive+ack, N delayed": BOUNDED,
    "work receive+dead_letter, N dead": BOUNDED,
    "fifo size()": "etcd: count of the prefix",
    "work size()": "etcd: count of the prefix",
    "queue stats": "etcd: count of the prefix",
}
UNITS = "ms"


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    points: dict[str, dict[int, float]] = {}
    notes = [
        f"mean of {OPS} operations per row and size (batches: {OPS // 16} of 16), one after "
        "another on one client; each size fills fresh queues in their own key layout",
        "size() and queue stats count exactly: etcd visits every key of a count, so they "
        "follow 'etcd: count of the prefix' (no exact count is flat in etcd)",
    ]
    async with ctx.connect() as client:
        for n in sizes:
            rows: dict[str, list[float]] = {}
            for part in (fifo_rows, priority_rows, work_rows, floor_rows):
                for _ in range(ctx.repeats):
                    for name, value in (await part(ctx, client, n)).items():
                        rows.setdefault(name, []).append(value)
                    await ctx.cleanup(client)
            for name, values in rows.items():  # the median of the repeats
                points.setdefault(name, {})[n] = sorted(values)[len(values) // 2] * 1e3
            print(f"  queues N={n}: " + ", ".join(f"{k} {v[n]:.2f}" for k, v in points.items()))
    out = [
        Row(name, UNITS, values, floor=FLOORS.get(name), note="mean per operation")
        for name, values in points.items()
    ]
    return FamilyResult("queues", out, notes)
