"""Election failover time: a new leader after the leader's process is SIGKILLed, and after the
leader closes gracefully.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/election.py [--runs 10] [--ttl 2] [--candidates 3]
                                            [--settle 0.5] [--endpoint HOST:PORT]
                                            [--mode graceful|sigkill] [--json out.json]

Starts its own etcd unless ``--endpoint`` is given. ``--candidates`` processes each run one
:class:`~etcd_recipes.LeaderLatch` on the same path (this script, re-run with
``--child``). For every run the current leader's process is either

* **killed** with SIGKILL: its term lease must expire on the server before anyone else can
  win, so the lease TTL is the floor (etcd expires a lease between TTL and TTL + 0.5 s after
  its last renewal, and renewals happen every TTL/3);
* **closed** gracefully (SIGTERM -> ``aclose()``; the old leader stamps the start of the close
  and reports it once closed, so that no line wakes this process mid-hand-over): the LEADER
  key is deleted at once; target
  **at most 3 ms p50** on loopback (Go's ``concurrency`` package: 2-3 ms).

With the graceful mode the run also measures the **raw floor** of a hand-over: the same three
RPCs (delete, the watch event, a create with a ``version == 0`` compare) between two bare
clients in this process, no recipe -- what this machine's etcd and gRPC cost alone -- and the
floor of **Go's layout** (delete, the watch event, a linearizable read: Go's candidates queue
their keys in advance, so the successor writes nothing), what a layout change could reach, and
the **event only** (delete to the watch event), the least any watch-announced hand-over takes;
and **one process**: the graceful hand-over between latches that share this process (a client
each), as Go's row runs its candidates -- the recipe without the cross-process wake-ups.

Failover = the new leader's own timestamp when it won, minus the moment of the kill (taken by
this process right before the signal) or the moment the old leader started to close (taken by
the old leader). ``time.monotonic()`` is system-wide on Linux, so stamps from different
processes compare. The killed/closed candidate is replaced by a fresh process before the next
run (and ``--settle`` seconds, 0.5 by default, are left for it to warm up: the benchmark
measures failover between running candidates, not process start-up). Reports p50 / p90 / min /
max per mode and the SIGKILL p50 against the TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from etcd_recipes import Cmp, LeaderLatch, Op, connect
from etcd_recipes.testing import EtcdServer

PATH = "/bench/election"


# --------------------------------------------------------------------------- child


def emit(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


async def child(endpoint: str, cid: str, ttl: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with connect(endpoint) as client:
        latch = LeaderLatch(client, PATH, client_id=cid, lease_ttl=ttl)

        def on_change(leading: bool) -> None:
            if leading:
                emit(leader=cid, t=time.monotonic(), token=latch.fencing_token)

        # Stamp the win from the leadership listener, as a user of the latch would see it.
        latch.add_leadership_listener(on_change)
        await latch.start()
        emit(ready=cid)
        await stop.wait()
        started = time.monotonic()
        await latch.aclose()
        # Reported after the close: a line printed now would wake the parent (and its reader
        # thread) in the middle of the hand-over it measures, on a machine of few cores.
        emit(closing=cid, t=started)


# --------------------------------------------------------------------------- parent


class Candidates:
    """The candidate processes and a queue of the JSON lines they print."""

    def __init__(self, endpoint: str, ttl: int, loop: asyncio.AbstractEventLoop) -> None:
        self.endpoint = endpoint
        self.ttl = ttl
        self.loop = loop
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.leader: str | None = None
        self._next = 0
        self._backlog: list[dict[str, Any]] = []  # lines read while waiting for another one

    def spawn(self) -> str:
        cid = f"cand-{self._next}"
        self._next += 1
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", cid, "--endpoint", self.endpoint],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs[cid] = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return cid

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.loop.call_soon_threadsafe(self.lines.put_nowait, json.loads(line))

    async def next_line(self, key: str, exclude: str | None = None) -> dict[str, Any]:
        """The next line that has ``key`` (with another value than ``exclude``), in the order
        printed per child; lines of other kinds read meanwhile are kept for a later call (the
        old leader's ``closing`` line comes after its successor's ``leader`` line)."""
        for i, line in enumerate(self._backlog):
            if key in line and line[key] != exclude:
                return self._backlog.pop(i)
        while True:
            line = await asyncio.wait_for(self.lines.get(), 60)
            if "leader" in line:
                self.leader = line["leader"]
            if key in line and line[key] != exclude:
                return line
            if "closing" in line or (key == "closing" and "leader" in line):
                self._backlog.append(line)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


async def raw_floor(
    endpoint: str, runs: int, settle: float, *, then: str = "create"
) -> list[float]:
    """The hand-over's RPCs alone, two bare clients in this process: one deletes a key (after
    an idle spell, as a closing leader does), the other's watch sees the delete and -- with
    ``then="create"``, our layout -- creates the key again with a ``version == 0`` compare, or
    -- with ``then="read"``, the layout of Go's ``concurrency`` package, where each candidate
    queued its own key beforehand -- confirms with a linearizable read that no earlier key is
    left; from the delete's start to that answer. ``then="nothing"``: to the watch event
    itself, the least any hand-over that a watch announces can take."""
    out: list[float] = []
    key = PATH + "-floor"
    async with connect(endpoint) as old, connect(endpoint) as new:
        for _ in range(runs):
            put = await old.put(key, b"leader")
            async with new.watch(key, start_revision=put.revision + 1, no_put=True) as watch:
                await asyncio.sleep(min(settle, 0.2))
                started = time.monotonic()
                delete = asyncio.ensure_future(old.delete(key))
                async for _event in watch:
                    if then == "create":
                        won = await new.txn([Cmp.missing(key)], [Op.put(key, b"next")])
                        assert won.succeeded
                    elif then == "read":
                        assert not (await new.range(key, prefix=True, limit=1)).kvs
                    out.append(time.monotonic() - started)
                    break
                await delete
            await old.delete(key)
    return out


async def in_process(endpoint: str, runs: int, n: int, settle: float) -> list[float]:
    """Graceful hand-overs between ``n`` :class:`~etcd_recipes.LeaderLatch` es in this process,
    a client each (the way Go's row runs its candidates): from the leader's ``aclose()`` to the
    next leader's listener; the closed latch is replaced by a new one on its client."""
    out: list[float] = []
    wins: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connect(endpoint)) for _ in range(n)]
        latches: list[LeaderLatch] = []

        async def candidate(i: int) -> LeaderLatch:
            latch = LeaderLatch(clients[i], PATH + "-inproc", client_id=f"in-{i}-{len(out)}")
            latch.add_leadership_listener(
                lambda leading: leading and wins.put_nowait((i, time.monotonic()))
            )
            await latch.start()
            return latch

        for i in range(n):
            latches.append(await candidate(i))
        leader = (await wins.get())[0]
        for _ in range(runs):
            await asyncio.sleep(settle)
            started = time.monotonic()
            await latches[leader].aclose()
            nxt, at = await asyncio.wait_for(wins.get(), 60)
            out.append(at - started)
            latches[leader] = await candidate(leader)
            leader = nxt
        for latch in latches:
            await latch.aclose()
    return out


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))],
        "min": ordered[0],
        "max": ordered[-1],
    }


async def run(
    endpoint: str,
    runs: int,
    ttl: int,
    n: int,
    settle: float,
    modes: tuple[str, ...] = ("graceful", "sigkill"),
) -> dict[str, Any]:
    cands = Candidates(endpoint, ttl, asyncio.get_running_loop())
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        for _ in range(n):
            cands.spawn()
        for _ in range(n):
            await cands.next_line("ready")
        while cands.leader is None:
            await cands.next_line("leader")
        await asyncio.sleep(settle)
        for mode in modes:
            for i in range(runs):
                old = cands.leader
                assert old is not None
                proc = cands.procs.pop(old)
                if mode == "sigkill":
                    started = time.monotonic()
                    proc.send_signal(signal.SIGKILL)
                    won = await cands.next_line("leader", exclude=old)
                else:
                    proc.send_signal(signal.SIGTERM)
                    won = await cands.next_line("leader", exclude=old)
                    started = (await cands.next_line("closing"))["t"]
                failover = won["t"] - started
                results[mode].append(failover)
                print(
                    f"{mode:8} run {i + 1:2}: {failover * 1000:8.1f} ms  "
                    f"({old} -> {won['leader']}, token {won['token']})",
                    file=sys.stderr,
                )
                proc.wait()
                cands.spawn()
                await cands.next_line("ready")
                await asyncio.sleep(settle)  # measure warmed-up candidates, not start-up
    finally:
        cands.stop_all()
    if "graceful" in results:
        results["raw floor"] = await raw_floor(endpoint, runs, settle)
        results["Go's layout"] = await raw_floor(endpoint, runs, settle, then="read")
        results["event only"] = await raw_floor(endpoint, runs, settle, then="nothing")
        results["one process"] = await in_process(endpoint, runs, n, settle)
    return {
        "ttl": ttl,
        "candidates": n,
        "runs": runs,
        "samples": results,
        "summary": {mode: summary(values) for mode, values in results.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ttl", type=int, default=2, help="lease TTL of the latches (seconds)")
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument(
        "--settle", type=float, default=0.5, help="seconds between a respawn and the next run"
    )
    parser.add_argument("--endpoint")
    parser.add_argument(
        "--mode", choices=("graceful", "sigkill"), action="append", help="only these modes"
    )
    parser.add_argument("--json", type=Path, help="write every sample and the summary here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.endpoint, args.child, args.ttl))
        return
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        modes = tuple(args.mode or ("graceful", "sigkill"))
        report = asyncio.run(
            run(endpoint, args.runs, args.ttl, args.candidates, args.settle, modes)
        )
    ttl = report["ttl"]
    print(f"\nfailover, {args.candidates} candidate processes, lease TTL {ttl} s, {args.runs} runs")
    print(f"{'mode':14} {'p50':>10} {'p90':>10} {'min':>10} {'max':>10}")
    for mode, s in report["summary"].items():
        cells = " ".join(f"{s[k] * 1000:8.1f}ms" for k in ("p50", "p90", "min", "max"))
        print(f"{mode:14} {cells}")
    if "sigkill" in report["summary"]:
        kill = report["summary"]["sigkill"]["p50"]
        print(f"\nSIGKILL p50 = {kill / ttl:.2f} x TTL (floor: the dead term lease must expire)")
    if "graceful" in report["summary"]:
        graceful = report["summary"]["graceful"]["p50"]
        floor = report["summary"]["raw floor"]["p50"]
        verdict = "PASS" if graceful <= 0.003 else "FAIL"
        print(
            f"graceful p50 = {graceful * 1000:.2f} ms (target <= 3 ms): {verdict}; the raw "
            f"floor (delete -> watch event -> create, bare clients) p50 = {floor * 1000:.2f} ms"
        )
        queued = report["summary"]["Go's layout"]["p50"]
        print(
            f"Go's layout (delete -> watch event -> read, bare clients) p50 = "
            f"{queued * 1000:.2f} ms: what a hand-over could cost here with candidates queued "
            f"in advance; the delete's watch event alone: "
            f"{report['summary']['event only']['p50'] * 1000:.2f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
