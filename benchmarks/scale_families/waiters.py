"""Parked waiters: ``DistributedMutex.acquire()``, ``DistributedSemaphore.acquire()`` (1
permit), ``DistributedQueue.dequeue()`` and ``DistributedWorkQueue.receive()``, N of a kind
parked on one path (each its own instance and task), in 1 process and spread over 4.

The waiters run in child processes (this module with ``--child``); per N and kind:

* **memory per waiter**, resident: ``growth 0->N`` (RSS after parking N, minus before, / N)
  and ``slope N->2N`` (N more parked on top, / N: what one more waiter adds once the
  allocator's first growth is absorbed); with 4 processes, each child parks N/4 (then N/4
  more) and the figures are the mean over the children;
* **park CPU per waiter**: client CPU (``time.process_time``) spent parking the 2N waiters /
  2N;
* **hand-off latency** p50: mutex and semaphore: the parent holds the lock while the waiters
  park, then releases it; each waiter that acquires stamps the time (``time.monotonic``,
  system-wide on Linux), releases at once and ends, until each child has made its share of
  ``HANDOFFS`` acquisitions (its next winner keeps the lock: the chain stops) -- a hand-off is
  a release's stamp to the next acquisition's; queues: the parent enqueues ``HANDOFFS`` items
  one at a time (20 ms apart) stamped with the time sent, a parked consumer takes (and acks)
  one and ends;
* **client CPU per hand-off**: CPU of every child during the hand-off phase / hand-offs;
* floor ``floor <kind> <mode>: put -> watch event``: while the waiters are parked, two bare
  clients in the parent: one puts, the other's watch sees it -- what etcd's own notification
  costs with the N waiters' keys, leases and watches in place.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from etcd_recipes import (
    DistributedMutex,
    DistributedQueue,
    DistributedSemaphore,
    DistributedWorkQueue,
    EtcdClient,
    connect,
)
from scale_families._api import FamilyResult, Row, ScaleContext, pct, rss

KINDS = ("mutex", "semaphore", "dequeue", "receive")
HANDOFFS = 30
BATCH = 250
HANDOFF_BUDGET = 60.0  # seconds of hand-offs per size at most
PARK_BUDGET = 150.0  # seconds: a size whose parking would take longer is skipped


def emit(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


async def settle(quiet: float = 0.003, window: float = 0.05, limit: float = 120.0) -> None:
    """Until this process spends under ``quiet`` CPU seconds in a ``window``: every waiter has
    made its reads and parked."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        c0 = time.process_time()
        await asyncio.sleep(window)
        if time.process_time() - c0 < quiet:
            return


def waiter(client: EtcdClient, kind: str, path: str, budget: list[int]) -> Any:
    """One parked waiter's coroutine."""
    if kind in ("mutex", "semaphore"):
        lock: Any = (
            DistributedMutex(client, path)
            if kind == "mutex"
            else DistributedSemaphore(client, path, 1)
        )

        async def take_lock() -> None:
            await lock.acquire()
            got = time.monotonic()
            if budget[0] <= 0:  # keep the lock: the chain stops here
                emit(event=[got, None])
                return
            budget[0] -= 1
            released = time.monotonic()
            emit(event=[got, released])
            await lock.release()

        return take_lock()
    if kind == "dequeue":
        queue = DistributedQueue(client, path)

        async def take_item() -> None:
            value = await queue.dequeue()
            emit(event=[float(value), time.monotonic()])

        return take_item()
    work = DistributedWorkQueue(client, path)

    async def take_work() -> None:
        item = await work.receive()
        got = time.monotonic()
        await item.ack()
        emit(event=[float(item.value), got])

    return take_work()


async def child(kind: str, n: int, endpoint: str, path: str, budget: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    left = [budget]
    async with connect(endpoint) as client:
        warm = asyncio.ensure_future(waiter(client, kind, path + "-warm", [1]))
        await settle()
        warm.cancel()
        await asyncio.gather(warm, return_exceptions=True)
        tasks: list[asyncio.Future[Any]] = []
        gc.collect()
        rss0, cpu0 = rss(), time.process_time()
        marks = []
        for _ in range(2):
            for start in range(0, n, BATCH):
                tasks += [
                    asyncio.ensure_future(waiter(client, kind, path, left))
                    for _ in range(min(BATCH, n - start))
                ]
                await settle()
            gc.collect()
            marks.append(rss())
        park_cpu = time.process_time() - cpu0
        emit(
            parked=len(tasks),
            growth=(marks[0] - rss0) / n,
            slope=(marks[1] - marks[0]) / n,
            park_cpu=park_cpu / (2 * n),
        )
        assert (await reader.readline()).strip() == b"go"
        cpu1 = time.process_time()
        assert (await reader.readline()).strip() == b"quit"
        handoff_cpu = time.process_time() - cpu1
        emit(cpu=handoff_cpu)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Children:
    """The child processes; every line they print lands in ``self.lines`` (a queue)."""

    def __init__(self, ctx: ScaleContext, kind: str, n: int, procs: int, path: str) -> None:
        share = max(1, n // procs)
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.procs = [
            subprocess.Popen(
                ctx.child_command(
                    "waiters", "--child", kind, str(share), ctx.endpoint, path, str(HANDOFFS)
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=ctx.child_env(),
            )
            for _ in range(procs)
        ]
        for proc in self.procs:
            threading.Thread(target=self._read, args=(proc, loop), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str], loop: asyncio.AbstractEventLoop) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            loop.call_soon_threadsafe(self.lines.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(self.lines.put_nowait, {"ended": proc.wait()})

    async def collect(self, key: str, count: int) -> list[dict[str, Any]]:
        """The next ``count`` lines holding ``key`` (other lines are dropped)."""
        out: list[dict[str, Any]] = []
        while len(out) < count:
            line = await asyncio.wait_for(self.lines.get(), 600)
            if "ended" in line:
                raise RuntimeError(f"a waiters child ended early (exit {line['ended']})")
            if key in line:
                out.append(line)
        return out

    async def next_event(self, timeout: float) -> list[Any] | None:
        """The next hand-off a child reports, or None after ``timeout`` seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            while True:
                line = await asyncio.wait_for(self.lines.get(), timeout)
                if "event" in line:
                    return list(line["event"])
        return None

    def send(self, word: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(word + "\n")
            p.stdin.flush()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


async def notify_floor(ctx: ScaleContext, path: str, samples: int = 20) -> float:
    """p50 seconds from a put to a second client's watch event."""
    out: list[float] = []
    async with ctx.connect() as a, ctx.connect() as b, b.watch(path) as watch:
        events = watch.__aiter__()
        for i in range(samples):
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            await a.put(path, b"%d" % i)
            await events.__anext__()
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


async def one(ctx: ScaleContext, kind: str, n: int, procs: int) -> dict[str, float]:
    path = ctx.fresh_prefix(f"waiters-{kind}").rstrip("/")
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(ctx.connect())
        holder: Any = None
        if kind == "mutex":
            holder = DistributedMutex(client, path)
        elif kind == "semaphore":
            holder = DistributedSemaphore(client, path, 1)
        if holder is not None:
            await holder.acquire()
        children = Children(ctx, kind, n, procs, path)
        stack.callback(children.stop)
        parked = await children.collect("parked", procs)
        floor = await notify_floor(ctx, ctx.fresh_prefix("waiters-floor") + "k")
        children.send("go")
        handoffs: list[float] = []
        deadline = time.monotonic() + HANDOFF_BUDGET
        if holder is not None:
            previous = time.monotonic()
            await holder.release()
            while time.monotonic() < deadline:
                event = await children.next_event(deadline - time.monotonic())
                if event is None:
                    break
                handoffs.append(event[0] - previous)
                if event[1] is None:  # a child made its share: it keeps the lock
                    break
                previous = event[1]
        else:
            queue: Any = (
                DistributedQueue(client, path)
                if kind == "dequeue"
                else DistributedWorkQueue(client, path)
            )
            for _ in range(HANDOFFS):
                await asyncio.sleep(0.02)
                await queue.enqueue(repr(time.monotonic()).encode())
                event = await children.next_event(max(0.0, deadline - time.monotonic()))
                if event is None:
                    break
                handoffs.append(event[1] - event[0])
            if isinstance(queue, DistributedWorkQueue):
                await queue.aclose()
        children.send("quit")
        done = await children.collect("cpu", procs)
        cpu = sum(d["cpu"] for d in done)
        return {
            "growth": statistics.mean(p["growth"] for p in parked) / 1024,
            "slope": statistics.mean(p["slope"] for p in parked) / 1024,
            "park_cpu": statistics.mean(p["park_cpu"] for p in parked) * 1e3,
            "handoff": pct(handoffs, 0.5) * 1e3 if handoffs else float("nan"),
            "handoff_cpu": cpu / max(1, len(handoffs)) * 1e3,
            "count": float(len(handoffs)),
            "floor": floor * 1e3,
        }


def kind_rows(label: str, got: dict[str, dict[int, float]]) -> list[Row]:
    """The rows of one kind and mode (``got``: a measured figure -> N -> value)."""
    floor = f"floor {label}: put -> watch event"
    return [
        Row(f"{label}: hand-off p50", "ms", got["handoff"], floor=floor),
        Row(floor, "ms", got["floor"]),
        Row(f"{label}: memory growth 0->N", "KB/waiter", got["growth"]),
        Row(f"{label}: memory slope N->2N", "KB/waiter", got["slope"]),
        Row(f"{label}: park CPU", "ms CPU/waiter", got["park_cpu"]),
        Row(f"{label}: CPU per hand-off", "ms CPU/hand-off", got["handoff_cpu"]),
    ]


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    rows: list[Row] = []
    notes: list[str] = []
    for procs in (1, 4):
        mode = f"{procs}p"
        for kind in KINDS:
            got: dict[str, dict[int, float]] = {}
            for n in sizes:
                t0 = time.perf_counter()
                result = await one(ctx, kind, n, procs)
                took = time.perf_counter() - t0
                print(f"  waiters {kind} {mode} N={n}: {took:.1f} s {result}", flush=True)
                for key, value in result.items():
                    got.setdefault(key, {})[n] = value
                if result["count"] < HANDOFFS * 0.8:
                    notes.append(f"{kind} {mode} N={n}: only {result['count']:.0f} hand-offs")
                bigger = [s for s in sizes if s > n]
                if bigger and took * bigger[0] / n > PARK_BUDGET:
                    notes.append(
                        f"{kind} {mode}: stopped at N={n} ({took:.0f} s for that size; "
                        f"N={bigger[0]} would take about {took * bigger[0] / n / 60:.0f} min)"
                    )
                    break
                await ctx.cleanup()
            rows += kind_rows(f"{kind} {mode}", got)
    notes.append(
        f"one park per kind, mode and N (2N waiters: N, then N more for the slope); the "
        f"hand-off p50 is over {HANDOFFS} hand-offs of that park, not repeated; memory is "
        "resident (RSS) growth, noisy at N=100 (a few hundred KB against the allocator's arenas)"
    )
    return FamilyResult("waiters", rows, notes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=5, required=True)
    args = parser.parse_args()
    kind, n, endpoint, path, budget = args.child
    asyncio.run(child(kind, int(n), endpoint, path, int(budget)))


if __name__ == "__main__":
    main()
