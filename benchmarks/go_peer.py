"""The Go peer rows of issue 15: our lock and election figures against Go's
``clientv3/concurrency`` (etcd 3.4 sources, the reference implementation of etcd recipes), in
one run against one etcd.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/go_peer.py [--rounds 2] [--duration 2] [--handoffs 1000]
                                           [--runs 15] [--endpoint HOST:PORT] [--json out.json]

Needs Go and the etcd 3.4 Go sources, which Debian packages (no module proxy needed)::

    apt-get install golang-go golang-etcd-server-dev

Without them it prints why and exits 0: the rows are optional (issue 15), nothing else
depends on them. ``benchmarks/go_peer/main.go`` is built in GOPATH mode against
``/usr/share/gocode`` (override with ``$ETCD_GO_PATH``) into a temporary directory.

Rows, each taking turns with its Python counterpart ``--rounds`` times (medians reported):

* **uncontended mutex**: acquire + release back to back for ``--duration`` s (Go: ``Mutex``
  ``Lock``/``Unlock`` on one session; ours: ``DistributedMutex`` on one client);
* **contended, 10 and 100 tasks in one process** on one path: hand-off latency from a release
  to the next acquisition returning, over ``--handoffs`` hand-offs; rate = 1 / mean latency
  (Go: a goroutine and a session each on one client; ours: ``handoff_latency`` of
  ``benchmarks/locks.py``, a task and a mutex each on one client);
* **graceful election hand-over**, 3 candidates: from the leader's resignation to the next
  leader's win, ``--runs`` hand-overs (Go: ``Election.Resign`` -> the next ``Campaign``
  returning, three clients in one process; ours: ``benchmarks/election.py``'s graceful mode,
  three ``LeaderLatch`` processes, and its floors: our layout's, Go's layout's and the delete's
  watch event alone, each between bare Python clients -- whether Go's figure is within a Python
  client's reach at all).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from election import run as election_run  # benchmarks/election.py, the script's sibling
from locks import cycles_per_second, handoff_latency  # benchmarks/locks.py

from etcd_recipes import DistributedMutex, EtcdConnectionError, connect
from etcd_recipes.testing import EtcdServer

SOURCE = Path(__file__).with_name("go_peer")
GOPATH = os.environ.get("ETCD_GO_PATH", "/usr/share/gocode")
CONCURRENCY = "go.etcd.io/etcd/clientv3/concurrency"


def build(out_dir: str) -> tuple[str | None, str]:
    """The built peer's path, or ``None`` and why it cannot be built here."""
    go = shutil.which("go")
    if go is None:
        return None, "no Go toolchain (apt-get install golang-go)"
    if not (Path(GOPATH) / "src" / CONCURRENCY).is_dir():
        return None, f"no etcd 3.4 Go sources in {GOPATH} (apt-get install golang-etcd-server-dev)"
    binary = os.path.join(out_dir, "gopeer")
    env = os.environ | {
        "GO111MODULE": "off",
        "GOPATH": GOPATH,
        "GOCACHE": os.path.join(out_dir, "cache"),
        "GOFLAGS": "",
    }
    done = subprocess.run(
        [go, "build", "-o", binary, "."],
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return None, f"go build failed: {done.stderr.strip()[-500:]}"
    return binary, ""


def go_figure(binary: str, figure: str, endpoint: str, *args: object) -> dict[str, Any]:
    done = subprocess.run(
        [binary, figure, endpoint, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"gopeer {figure} failed: {done.stderr.strip()[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def ours_uncontended(endpoint: str, duration: float) -> dict[str, Any]:
    async with connect(endpoint) as client:
        mutex = DistributedMutex(client, "/bench/go-peer/uncontended")

        async def cycle() -> None:
            await mutex.acquire()
            await mutex.release()

        for _ in range(200):
            await cycle()
        rate, _ = await cycles_per_second(cycle, duration)
        await mutex.aclose()
    return {"per_s": rate}


async def ours_contended(endpoint: str, tasks: int, handoffs: int) -> dict[str, Any]:
    async with connect(endpoint) as client:
        return await handoff_latency(client, tasks, handoffs)


async def ours_election(endpoint: str, runs: int) -> dict[str, Any]:
    result = await election_run(endpoint, runs, 2, 3, 0.3, modes=("graceful",))
    summary = result["summary"]
    return {
        "p50_ms": summary["graceful"]["p50"] * 1000,
        "p90_ms": summary["graceful"]["p90"] * 1000,
        "floor_p50_ms": summary["raw floor"]["p50"] * 1000,
        "go_layout_floor_p50_ms": summary["Go's layout"]["p50"] * 1000,
        "event_floor_p50_ms": summary["event only"]["p50"] * 1000,
    }


async def reachable(endpoint: str) -> bool:
    try:
        async with connect(endpoint) as client:
            return await client.check(timeout=3.0)
    except EtcdConnectionError:
        return False


def median_of(results: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in results)


def measure(binary: str, endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def both(name: str, go: Any, ours: Any) -> None:
        row = rows.setdefault(name, {"go": [], "ours": []})
        for i in range(args.rounds):
            order = [("go", go), ("ours", ours)] if i % 2 == 0 else [("ours", ours), ("go", go)]
            for side, fn in order:
                result = fn()
                row[side].append(result)
                print(f"  {name} {side} round {i + 1}: {result}", file=sys.stderr, flush=True)

    both(
        "uncontended",
        lambda: go_figure(binary, "uncontended", endpoint, args.duration),
        lambda: asyncio.run(ours_uncontended(endpoint, args.duration)),
    )
    for tasks in (10, 100):
        both(
            f"contended {tasks}",
            lambda t=tasks: go_figure(binary, "contended", endpoint, t, args.handoffs),
            lambda t=tasks: asyncio.run(ours_contended(endpoint, t, args.handoffs)),
        )
    both(
        "election",
        lambda: go_figure(binary, "election", endpoint, args.runs, 3, 0.3),
        lambda: asyncio.run(ours_election(endpoint, args.runs)),
    )
    return rows


def report(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> list[str]:
    lines = ["figure                      ours            Go              ours / Go"]

    def line(name: str, key: str, unit: str, higher_is_better: bool) -> None:
        ours, go = median_of(rows[name]["ours"], key), median_of(rows[name]["go"], key)
        ratio = ours / go
        verdict = "ours better" if (ratio >= 1) == higher_is_better else "Go better"
        lines.append(
            f"{name + ' ' + key:<27} {ours:9.2f} {unit:<5} {go:9.2f} {unit:<5} {ratio:6.2f}  "
            f"({verdict})"
        )

    line("uncontended", "per_s", "/s", True)
    for tasks in (10, 100):
        line(f"contended {tasks}", "per_s", "/s", True)
        line(f"contended {tasks}", "p99_ms", "ms", False)
    line("election", "p50_ms", "ms", False)
    floor = median_of(rows["election"]["ours"], "floor_p50_ms")
    queued = median_of(rows["election"]["ours"], "go_layout_floor_p50_ms")
    event = median_of(rows["election"]["ours"], "event_floor_p50_ms")
    lines.append(
        f"(election floors, bare Python clients in one process, p50: our layout's delete -> "
        f"event -> create {floor:.2f} ms; Go's layout's delete -> event -> read {queued:.2f} "
        f"ms; the delete's watch event alone {event:.2f} ms)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="turns per side and figure")
    parser.add_argument("--duration", type=float, default=2.0, help="uncontended seconds")
    parser.add_argument("--handoffs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=15, help="election hand-overs")
    parser.add_argument("--endpoint")
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        binary, why = build(out_dir)
        if binary is None:
            print(f"go peer skipped: {why}")
            return
        with contextlib.ExitStack() as stack:
            endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
            if not asyncio.run(reachable(endpoint)):  # Go's client would wait on it for good
                sys.exit(f"go peer: no etcd answers at {endpoint}")
            started = time.time()
            rows = measure(binary, endpoint, args)
    print("\n".join(report(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps({"started": started, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
