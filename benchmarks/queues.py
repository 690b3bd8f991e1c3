"""Queue throughput against the raw RPC floor, hand-off latency, and memory of parked consumers.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/queues.py [--items 4000] [--repeats 3] [--endpoint HOST:PORT]
    .venv/bin/python benchmarks/queues.py --only memory     # one part: throughput, latency, memory
    .venv/bin/python benchmarks/queues.py --only work-throughput --repeats 5  # work queue vs floor

Starts its own etcd unless --endpoint is given. Everything is measured in one run, on one
client, with 4 producer and 4 consumer asyncio tasks:

* **floor** -- the raw RPCs a queue needs per item, with no coordination at all: a put, then a
  range and a guarded delete (compare ``mod_revision``), each consumer reading only its own
  producer's keys and learning about them in-process (no watch, no contention);
* **FIFO** -- ``DistributedQueue.enqueue`` / ``dequeue`` (target: >= 60% of the floor);
* **work queue** -- ``DistributedWorkQueue.enqueue`` / ``receive`` + ``ack`` (target: >= 60%);
* **latency** -- enqueue -> item in hand with one consumer parked on an empty queue (p50 target
  under 5 ms on loopback), for both queues;
* **memory** -- resident memory per parked ``dequeue()`` / ``receive()`` consumer, 1,000 of
  them in one process (each its own queue instance and task; target <= 10 KB each): the
  growth from 1,000 to 2,000 parked consumers of a kind, and the Python heap of 1,000.

Throughput rows run ``--repeats`` times, alternating their order; the medians are reported,
with the CPU time (this process + etcd) spent per item when the benchmark started etcd itself
-- a steadier comparison than items/s on a machine that is busy with other work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import psutil

from etcd_recipes import (
    Cmp,
    DistributedQueue,
    DistributedWorkQueue,
    EtcdClient,
    Op,
    WorkQueueConfig,
    connect,
)
from etcd_recipes.testing import EtcdServer

PRODUCERS = CONSUMERS = 4
VALUE = b"x" * 64


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


async def floor(client: EtcdClient, root: str, items: int) -> float:
    """Items/s of put + range + guarded delete, 4 producers and 4 consumers, no contention."""
    per = items // PRODUCERS
    handoffs = [asyncio.Queue[str]() for _ in range(PRODUCERS)]

    async def produce(i: int) -> None:
        for j in range(per):
            key = f"{root}{i}/{j:08d}"
            await client.put(key, VALUE)
            handoffs[i].put_nowait(key)

    async def consume(i: int) -> None:
        for _ in range(per):
            await handoffs[i].get()
            head = (await client.range(f"{root}{i}/", prefix=True, limit=1)).kvs[0]
            done = await client.txn(
                [Cmp.mod_revision(head.key) == head.mod_revision], [Op.delete(head.key)]
            )
            assert done.succeeded

    start = time.perf_counter()
    await asyncio.gather(
        *(produce(i) for i in range(PRODUCERS)), *(consume(i) for i in range(CONSUMERS))
    )
    return per * PRODUCERS / (time.perf_counter() - start)


async def run_queue(
    items: int,
    enqueue: Callable[[bytes], Awaitable[object]],
    takes: list[Callable[[], Awaitable[bytes]]],
) -> float:
    """Items/s of ``enqueue``/``take`` with 4 producers and 4 consumers; checks exactly-once."""
    per = items // PRODUCERS
    total = per * PRODUCERS
    seen: list[bytes] = []
    all_taken = asyncio.Event()

    async def produce(i: int) -> None:
        for j in range(per):
            await enqueue(b"%d:%d:" % (i, j) + VALUE)

    async def consume(take: Callable[[], Awaitable[bytes]]) -> None:
        while True:
            seen.append(await take())
            if len(seen) >= total:
                all_taken.set()

    start = time.perf_counter()
    consumers = [asyncio.create_task(consume(take)) for take in takes]
    await asyncio.gather(*(produce(i) for i in range(PRODUCERS)))
    await all_taken.wait()
    elapsed = time.perf_counter() - start
    for task in consumers:
        task.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    assert len(seen) == total == len(set(seen)), (len(seen), total, len(set(seen)))
    return total / elapsed


async def fifo(client: EtcdClient, root: str, items: int) -> float:
    queues = [DistributedQueue(client, root) for _ in range(PRODUCERS + CONSUMERS)]
    producers, consumers = queues[:PRODUCERS], queues[PRODUCERS:]
    turn = iter(range(10**9))

    async def enqueue(value: bytes) -> None:
        await producers[next(turn) % PRODUCERS].enqueue(value)

    return await run_queue(items, enqueue, [queue.dequeue for queue in consumers])


async def work_queue(client: EtcdClient, root: str, items: int) -> float:
    config = WorkQueueConfig(visibility_timeout=10, sweep_interval=5)
    producers = [DistributedWorkQueue(client, root, config) for _ in range(PRODUCERS)]
    consumers = [DistributedWorkQueue(client, root, config) for _ in range(CONSUMERS)]
    turn = iter(range(10**9))

    async def enqueue(value: bytes) -> None:
        await producers[next(turn) % PRODUCERS].enqueue(value)

    def taker(queue: DistributedWorkQueue[bytes]) -> Callable[[], Awaitable[bytes]]:
        async def take() -> bytes:
            item = await queue.receive()
            assert await item.ack()
            assert isinstance(item.value, bytes)
            return item.value

        return take

    try:
        return await run_queue(items, enqueue, [taker(queue) for queue in consumers])
    finally:
        for queue in consumers + producers:
            await queue.aclose()


BATCH = 16  # items per enqueue_all / receive_many / ack_many in the batched row


async def work_batches(client: EtcdClient, root: str, items: int) -> float:
    """Items/s of the work queue in batches of 16: ``enqueue_all`` of 16 values, then
    ``receive_many(16)`` + ``ack_many`` (4 producers, 4 consumers; checks exactly-once)."""
    config = WorkQueueConfig(visibility_timeout=10, sweep_interval=5)
    producers = [DistributedWorkQueue(client, root, config) for _ in range(PRODUCERS)]
    consumers = [DistributedWorkQueue(client, root, config) for _ in range(CONSUMERS)]
    per = items // PRODUCERS // BATCH * BATCH
    total = per * PRODUCERS
    seen: list[bytes] = []
    all_taken = asyncio.Event()

    async def produce(i: int) -> None:
        for j in range(0, per, BATCH):
            values = [b"%d:%d:" % (i, j + k) + VALUE for k in range(BATCH)]
            await producers[i].enqueue_all(values)

    async def consume(queue: DistributedWorkQueue[bytes]) -> None:
        while True:
            batch = await queue.receive_many(BATCH)
            assert all(await queue.ack_many(batch))
            seen.extend(item.value for item in batch)
            if len(seen) >= total:
                all_taken.set()

    start = time.perf_counter()
    tasks = [asyncio.create_task(consume(queue)) for queue in consumers]
    try:
        await asyncio.gather(*(produce(i) for i in range(PRODUCERS)))
        await all_taken.wait()
        elapsed = time.perf_counter() - start
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for queue in consumers + producers:
            await queue.aclose()
    assert len(seen) == total == len(set(seen)), (len(seen), total, len(set(seen)))
    return total / elapsed


async def latency(client: EtcdClient, root: str, samples: int, kind: str) -> list[float]:
    """Seconds from just before ``enqueue`` to the item in a parked consumer's hands."""
    out: list[float] = []
    got = asyncio.Queue[float]()
    if kind == "fifo":
        producer: DistributedQueue[bytes] | DistributedWorkQueue[bytes] = DistributedQueue(
            client, root
        )
        consumer_q = DistributedQueue(client, root)

        async def consumer() -> None:
            while True:
                await consumer_q.dequeue()
                got.put_nowait(time.perf_counter())
    else:
        config = WorkQueueConfig(visibility_timeout=10, sweep_interval=5)
        producer = DistributedWorkQueue(client, root, config)
        consumer_w = DistributedWorkQueue(client, root, config)

        async def consumer() -> None:
            while True:
                item = await consumer_w.receive()
                got.put_nowait(time.perf_counter())
                await item.ack()

    task = asyncio.create_task(consumer())
    try:
        for _ in range(samples):
            await asyncio.sleep(0.02)  # the consumer is parked on its watch again
            sent = time.perf_counter()
            await producer.enqueue(VALUE)
            out.append(await got.get() - sent)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if kind != "fifo":
            await consumer_w.aclose()
            await producer.aclose()
    return out


def parked_waiters(client: EtcdClient) -> int:
    """Consumers parked on the client's shared put-waits (``_recipe/waiting.py``; before those,
    a watch each)."""
    from etcd_recipes._recipe import waiting  # the put-waker registry lives there now

    if hasattr(waiting, "_shared"):
        shared = list(waiting._shared(client).values())
    elif hasattr(client._watch_hub, "shared"):  # before issue 30: on the watch hub
        shared = list(client._watch_hub.shared.values())
    else:
        return client._watch_hub.watcher_count
    return len({future for waker in shared for future in getattr(waker, "waiters", ())})


async def park(client: EtcdClient, root: str, n: int, kind: str) -> list[asyncio.Task[object]]:
    """Start ``n`` consumers (each its own queue instance and task), return once all wait."""
    base = parked_waiters(client)
    tasks: list[asyncio.Task[object]] = []
    for start in range(0, n, 250):  # in batches: in-flight RPC buffers are not per-consumer
        for _ in range(start, min(n, start + 250)):
            if kind == "fifo":
                tasks.append(asyncio.create_task(DistributedQueue(client, root).dequeue()))
            else:
                tasks.append(asyncio.create_task(DistributedWorkQueue(client, root).receive()))
        while parked_waiters(client) < base + len(tasks):
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    return tasks


async def release(tasks: list[asyncio.Task[object]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def memory(client: EtcdClient, root: str, n: int) -> dict[str, tuple[float, float, float]]:
    """Per parked consumer: (growth of resident memory, Python heap traced by tracemalloc,
    resident growth from 0 to ``n``).

    Resident memory is the slope between ``n`` and ``2 n`` parked consumers of a kind -- what
    each further consumer adds, not the allocator's first growth for the in-flight reads of a
    batch, which the first ``n`` absorb -- for each kind on top of the other (no release in
    between, so neither reuses memory the other freed); then the Python heap of ``n``, in a
    second round under tracemalloc."""
    out: dict[str, list[float]] = {"fifo": [], "work": []}
    first: dict[str, float] = {}
    parked: list[asyncio.Task[object]] = []
    for kind in out:
        gc.collect()
        empty = rss()
        parked += await park(client, f"{root}{kind}/", n, kind)
        gc.collect()
        before = rss()
        first[kind] = (before - empty) / n  # the growth from 0 to n, the other measure
        parked += await park(client, f"{root}{kind}/", n, kind)
        gc.collect()
        out[kind].append((rss() - before) / n)
    await release(parked)
    for kind in out:
        gc.collect()
        tracemalloc.start()
        tasks = await park(client, f"{root}{kind}/", n, kind)
        gc.collect()
        out[kind].append(tracemalloc.get_traced_memory()[0] / n)
        tracemalloc.stop()
        await release(tasks)
    return {kind: (v[0], v[1], first[kind]) for kind, v in out.items()}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(proc: psutil.Process | None) -> float:
    if proc is None:
        return float("nan")
    times = proc.cpu_times()
    return float(times.user + times.system)


PARTS = ("throughput", "latency", "memory")
WORK_ONLY = "work-throughput"  # the work queue's throughput row and its floor, nothing else


async def main_async(
    endpoint: str,
    etcd_pid: int | None,
    items: int,
    repeats: int,
    samples: int,
    parked: int,
    parts: tuple[str, ...] = PARTS,
) -> None:
    async with connect(endpoint) as client:
        await fifo(client, "/bench/warmup/", 200)  # imports, stream set-up
        if "throughput" in parts:
            await throughput(client, etcd_pid, items, repeats)
        elif WORK_ONLY in parts:
            await throughput(client, etcd_pid, items, repeats, ("floor", "work", "batch"))
        if "latency" in parts:
            for kind, label in (("fifo", "DistributedQueue"), ("work", "DistributedWorkQueue")):
                lat = await latency(client, f"/bench/latency-{kind}/", samples, kind)
                print(
                    f"latency enqueue -> item in hand, parked consumer, {label:20s}: "
                    f"p50 {pct(lat, 0.5) * 1e3:.2f} ms, p99 {pct(lat, 0.99) * 1e3:.2f} ms "
                    f"({samples} samples; target p50 < 5 ms)"
                )
            print()
        if "memory" in parts:
            sizes = await memory(client, "/bench/parked/", parked)
            for kind, label in (("fifo", "dequeue()"), ("work", "receive()")):
                resident, heap, first = sizes[kind]
                print(
                    f"memory per parked {label:10s}: {resident / 1024:.1f} KB resident "
                    f"({parked} -> {2 * parked}), {first / 1024:.1f} KB resident (0 -> "
                    f"{parked}), {heap / 1024:.1f} KB Python heap ({parked} consumers in one "
                    f"process, each its own queue instance; target <= 10 KB by both measures)"
                )


async def throughput(
    client: EtcdClient,
    etcd_pid: int | None,
    items: int,
    repeats: int,
    names: tuple[str, ...] = ("floor", "fifo", "work", "batch"),
) -> None:
    me = psutil.Process()
    etcd = psutil.Process(etcd_pid) if etcd_pid else None
    runs = {"floor": floor, "fifo": fifo, "work": work_queue, "batch": work_batches}
    rows: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    order = list(names)
    for r in range(repeats):
        for name in order if r % 2 == 0 else reversed(order):
            root = f"/bench/{name}-{r}/"
            c0, e0 = cpu_seconds(me), cpu_seconds(etcd)
            rate = await runs[name](client, root, items)
            used = (cpu_seconds(me) - c0 + cpu_seconds(etcd) - e0) / items
            rows[name].append(rate)
            cpu[name].append(used)
            print(
                f"  run {r + 1} {name:5s}: {rate:7.0f} items/s, "
                f"{used * 1e3:.2f} ms CPU per item (client + etcd)",
                flush=True,
            )
            await client.delete(root, prefix=True)
            status = await client.status()
            await client.compact(status.revision)
    med = {name: statistics.median(v) for name, v in rows.items()}
    per = {name: statistics.median(v) for name, v in cpu.items()}
    labels = {
        "fifo": "DistributedQueue enqueue/dequeue        ",
        "work": "DistributedWorkQueue enqueue/receive+ack",
        "batch": f"work queue, batches of {BATCH}             ",
    }
    targets = {"batch": "target >= 150%"}
    print()
    print(
        f"throughput, {PRODUCERS} producers + {CONSUMERS} consumers, {items} items, "
        f"median of {repeats}:"
    )
    print(f"  raw floor (put + range + guarded delete) : {med['floor']:7.0f} items/s")
    for name in names[1:]:
        print(
            f"  {labels[name]}: {med[name]:7.0f} items/s "
            f"= {med[name] / med['floor']:.0%} of the floor ({targets.get(name, 'target >= 60%')})"
        )
    for name in ("work", "batch"):  # a run's own floor: the fairest yardstick on a busy box
        if name not in names:
            continue
        ratios = [w / f for w, f in zip(rows[name], rows["floor"])]
        print(
            f"  {name} / floor, run by run: {', '.join(f'{x:.2f}' for x in ratios)} "
            f"(median {statistics.median(ratios):.2f})"
        )
    if etcd is not None:  # a steadier view on a busy machine: CPU spent per item
        shares = ", ".join(
            f"{name} {per[name] * 1e3:.2f} ms ({per['floor'] / per[name]:.0%})"
            for name in names[1:]
        )
        print(f"  CPU per item (client + etcd): floor {per['floor'] * 1e3:.2f} ms, {shares}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300, help="latency samples per queue")
    parser.add_argument("--parked", type=int, default=1000, help="parked consumers (memory)")
    parser.add_argument("--endpoint")
    parser.add_argument(
        "--only",
        choices=(*PARTS, WORK_ONLY),
        action="append",
        help=f"run only these parts ({WORK_ONLY}: the work queue's row and the floor)",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.endpoint:
            endpoint, pid = args.endpoint, None
        else:
            server = stack.enter_context(EtcdServer())
            endpoint, pid = server.endpoint, server.pid
        parts = tuple(args.only or PARTS)
        asyncio.run(
            main_async(endpoint, pid, args.items, args.repeats, args.samples, args.parked, parts)
        )


if __name__ == "__main__":
    main()
