"""What a growth-curve family module gets and returns (see ``benchmarks/scale.py``).

A family is a module of this package with ``async def run(ctx, sizes) -> FamilyResult``. It
measures each of its rows at every N of ``sizes`` it can afford (a row may stop lower and say
why in ``FamilyResult.notes``), ``ctx.repeats`` times per size, and reports medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import math
import os
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from etcd_recipes import CompactedError, EtcdClient, connect

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent


@dataclass
class Row:
    """One curve: ``points[N]`` is the median value of the row at size N, in ``unit``.

    ``floor`` names another row of the same family: etcd's own cost of the same reads,
    measured beside this one (plotted dashed); the driver then judges this row's growth
    against the floor's. ``note`` says in a few words what one point is.
    """

    name: str
    unit: str
    points: dict[int, float]
    floor: str | None = None
    note: str = ""


@dataclass
class FamilyResult:
    """What ``run()`` returns: the family's name, its rows, and notes (sizes skipped and why,
    what the floor is, anything odd seen while measuring)."""

    family: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)


@dataclass
class Usage:
    """What a block cost this process: wall and CPU seconds, resident and heap growth."""

    wall: float = 0.0
    cpu: float = 0.0
    rss: int = 0
    heap: int | None = None


def rss() -> int:
    """This process's resident memory, bytes."""
    return int(psutil.Process().memory_info().rss)


@contextmanager
def measure(*, heap: bool = False, collect: bool = True) -> Iterator[Usage]:
    """Measure the block: wall (perf_counter), client CPU (process_time), RSS growth, and
    with ``heap=True`` the Python heap's growth under tracemalloc (slower: only for memory).

    ``gc.collect()`` runs before and after (``collect=False`` to skip it)."""
    usage = Usage()
    if collect:
        gc.collect()
    started_tracing = False
    if heap and not tracemalloc.is_tracing():
        tracemalloc.start()
        started_tracing = True
    heap0 = tracemalloc.get_traced_memory()[0] if heap else 0
    rss0, cpu0, wall0 = rss(), time.process_time(), time.perf_counter()
    try:
        yield usage
    finally:
        usage.wall = time.perf_counter() - wall0
        usage.cpu = time.process_time() - cpu0
        if collect:
            gc.collect()
        usage.rss = rss() - rss0
        if heap:
            usage.heap = tracemalloc.get_traced_memory()[0] - heap0
            if started_tracing:
                tracemalloc.stop()


class ScaleContext:
    """The run's shared state, handed to every family's ``run()``.

    - ``endpoint``: ``host:port`` of the etcd under test; ``server_pid``: its process id when
      the driver started it (``None`` with ``--endpoint``), for :meth:`etcd_cpu`;
    - ``repeats``: how many times a family measures each size (it reports medians);
    - :meth:`fresh_prefix`: a key prefix no other row or run uses; :meth:`cleanup` deletes
      every prefix handed out and compacts (the driver calls it after each family);
    - :meth:`measure`: client CPU (process_time), RSS and optionally tracemalloc heap growth;
    - :meth:`child_command` / :meth:`child_env`: run a family module as a child process.
    """

    def __init__(self, endpoint: str, server_pid: int | None = None, repeats: int = 3) -> None:
        self.endpoint = endpoint
        self.server_pid = server_pid
        self.repeats = repeats
        self._run = uuid.uuid4().hex[:6]
        self._count = 0
        self._prefixes: list[str] = []
        self.measure = measure

    def __repr__(self) -> str:
        return f"<ScaleContext {self.endpoint} etcd pid {self.server_pid} x{self.repeats}>"

    def fresh_prefix(self, label: str = "p") -> str:
        """A new key prefix ``/scale/<run>/<label>-<n>/``."""
        self._count += 1
        prefix = f"/scale/{self._run}/{label}-{self._count}/"
        self._prefixes.append(prefix)
        return prefix

    def connect(self) -> Any:
        """``connect(endpoint)``: an async context manager yielding an ``EtcdClient``."""
        return connect(self.endpoint)

    def etcd_cpu(self) -> float:
        """CPU seconds etcd has used so far (NaN when the driver did not start it)."""
        if self.server_pid is None:
            return float("nan")
        times = psutil.Process(self.server_pid).cpu_times()
        return float(times.user + times.system)

    async def cleanup(self, client: EtcdClient | None = None) -> None:
        """Delete every prefix handed out so far and compact etcd's history."""
        if client is None:
            async with self.connect() as own:
                await self.cleanup(own)
            return
        for prefix in self._prefixes:
            await client.delete(prefix, prefix=True)
        self._prefixes.clear()
        status = await client.status()
        with contextlib.suppress(CompactedError):  # nothing written since the last one
            await client.compact(status.revision)

    def child_command(self, module: str, *args: str) -> list[str]:
        """The command that runs ``scale_families.<module>`` as a script with ``args``."""
        return [sys.executable, "-m", f"scale_families.{module}", *args]

    def child_env(self) -> dict[str, str]:
        """The environment for :meth:`child_command`: this tree and ``benchmarks/`` importable."""
        env = dict(os.environ)
        paths = [str(BENCHMARKS), str(REPO), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return env


async def median_time(coro_fn: Callable[[], Awaitable[object]], n: int) -> float:
    """Median seconds of ``n`` sequential ``await coro_fn()`` calls."""
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await coro_fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def growth(points: dict[int, float]) -> float:
    """The largest growth per 10x of N between neighbouring sizes: ``(v2 / v1) ** (1 /
    log10(n2 / n1))``; 1.0 is flat, 10.0 linear. NaN with fewer than two usable points
    (values <= 0 are not usable)."""
    sizes = sorted(n for n, v in points.items() if v > 0 and math.isfinite(v))
    ratios = [
        (points[b] / points[a]) ** (1 / math.log10(b / a)) for a, b in itertools.pairwise(sizes)
    ]
    return max(ratios) if ratios else float("nan")


async def gather_in_batches(
    factories: list[Callable[[], Awaitable[Any]]], batch: int = 200
) -> list[Any]:
    """Await ``factories`` ``batch`` at a time (in-flight RPCs bounded), results in order."""
    out: list[Any] = []
    for start in range(0, len(factories), batch):
        out += await asyncio.gather(*(f() for f in factories[start : start + batch]))
    return out
