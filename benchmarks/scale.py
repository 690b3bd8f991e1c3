"""Growth curves: what one operation of each family costs as the work grows, N = 10^2..10^5.

Run by hand (not part of the test suite; needs the ``bench`` extra: matplotlib, psutil)::

    .venv/bin/python benchmarks/scale.py [--family NAME ...] [--sizes 100,1000,10000,100000]
                                         [--repeats 3] [--endpoint HOST:PORT]
                                         [--out benchmarks/results]

Starts its own etcd (``etcd_recipes.testing.EtcdServer``: data on tmpfs when ``/dev/shm``
exists, ``--unsafe-no-fsync``) unless ``--endpoint`` is given. For every family (all modules of
``benchmarks/scale_families/`` not starting with ``_``, or those named by ``--family``) it
writes ``<out>/scale-<family>.json`` and ``<out>/scale-<family>.png`` (log-x, one panel per
unit, one line per row; a row's floor -- etcd's own cost of the same reads, measured beside
it -- dashed in the same colour) and prints a table with each row's **growth per 10x of N**
(the largest ``(v2 / v1) ** (1 / log10(n2 / n1))`` between neighbouring sizes: 1.0 is flat,
10.0 linear). A row growing more than 1.5x per 10x is marked ``follows floor`` when its ratio
to its floor grows at most 1.5x per 10x, ``etcd's own (a floor)`` when it is a floor itself
(a row some other row names as its floor, or whose name starts with ``floor``), else
``FINDING``.

The family interface (``benchmarks/scale_families/_api.py``)::

    # benchmarks/scale_families/<name>.py
    from scale_families._api import FamilyResult, Row, ScaleContext, growth, median_time

    async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
        points: dict[int, float] = {}
        floor: dict[int, float] = {}
        for n in sizes:
            prefix = ctx.fresh_prefix("thing")      # unique keys; ctx.cleanup() drops them
            ...                                     # build the work of size n
            points[n] = await median_time(one_op, 50) * 1e3
            floor[n] = await median_time(same_raw_read, 50) * 1e3
        return FamilyResult("name", [
            Row("thing op", "ms/op", points, floor="floor: raw read"),
            Row("floor: raw read", "ms/op", floor),
        ], notes=["why 10^5 was skipped, what the floor is ..."])

``ScaleContext`` holds ``endpoint``, ``server_pid`` (None with ``--endpoint``), ``repeats``,
``fresh_prefix(label)``, ``connect()``, ``measure(heap=False)`` (a context manager yielding
``Usage(wall, cpu, rss, heap)``: client CPU is ``time.process_time``), ``etcd_cpu()``,
``cleanup()`` and ``child_command(module, *args)`` / ``child_env()`` to run a family module as
a child process (``python -m scale_families.<module>``). Helpers: ``median_time(coro_fn, n)``,
``growth(points)``, ``pct(values, q)``, ``gather_in_batches(factories, batch)``. The JSON holds
the command, the date, the commit, ``os.getloadavg()`` before and after each family, every
row with its points and growth, and the notes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib
import json
import math
import os
import pkgutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # imported (the smoke test), not run: scale_families importable
    sys.path.append(str(HERE))

from scale_families._api import FamilyResult, Row, ScaleContext, growth  # noqa: E402

from etcd_recipes.testing import EtcdServer  # noqa: E402

LIMIT = 1.5


def family_names() -> list[str]:
    import scale_families

    return sorted(
        m.name for m in pkgutil.iter_modules(scale_families.__path__) if not m.name.startswith("_")
    )


def verdict(row: Row, rows: dict[str, Row]) -> tuple[float, float | None, str]:
    """(growth, growth of row / floor or None, verdict)."""
    g = growth(row.points)
    floor = rows.get(row.floor) if row.floor else None
    relative = None
    if floor is not None:
        shared = {
            n: v / floor.points[n]
            for n, v in row.points.items()
            if floor.points.get(n, 0) > 0 and v > 0
        }
        relative = growth(shared)
    if math.isnan(g):
        return g, relative, "-"
    if g <= LIMIT:
        return g, relative, "flat"
    if row.name.startswith("floor") or any(o.floor == row.name for o in rows.values()):
        return g, relative, "etcd's own (a floor)"
    if relative is not None and relative <= LIMIT:
        return g, relative, "follows floor"
    return g, relative, "FINDING"


def table(result: FamilyResult) -> str:
    rows = {r.name: r for r in result.rows}
    sizes = sorted({n for r in result.rows for n in r.points})
    width = max(len(r.name) for r in result.rows) if result.rows else 10
    head = f"{'row':{width}s} {'unit':14s} " + " ".join(f"{n:>10,d}" for n in sizes)
    lines = [head + f" {'growth/10x':>10s} {'vs floor':>8s}  verdict", "-" * (len(head) + 38)]
    for r in result.rows:
        g, rel, word = verdict(r, rows)
        cells = " ".join(f"{r.points[n]:10.3g}" if n in r.points else f"{'-':>10s}" for n in sizes)
        rel_s = f"{rel:8.2f}" if rel is not None and not math.isnan(rel) else f"{'':8s}"
        lines.append(f"{r.name:{width}s} {r.unit:14s} {cells} {g:10.2f} {rel_s}  {word}")
    return "\n".join(lines)


def plot(result: FamilyResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = list(dict.fromkeys(r.unit for r in result.rows))
    floors = {r.floor for r in result.rows if r.floor}
    floors |= {r.name for r in result.rows if r.name.startswith("floor")}
    fig, axes = plt.subplots(
        len(units), 1, figsize=(9, 3.6 * len(units)), squeeze=False, constrained_layout=True
    )
    colours = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("Dark2").colors)
    # a colour per group (what precedes ":" in the name: "mutex 1p"), its floor included;
    # a row without one shares its floor's colour
    colour_of: dict[str, Any] = {}

    def group(row: Row) -> str:
        name = row.name.removeprefix("floor ").removeprefix("floor: ")
        if ":" in name:
            return name.split(":")[0]
        return row.floor or row.name

    for r in result.rows:
        key = group(r)
        if key not in colour_of:
            colour_of[key] = colours[len(colour_of) % len(colours)]
    markers = "osD^v<>"
    for ax, unit in zip(axes[:, 0], units):
        for i, r in enumerate(r for r in result.rows if r.unit == unit):
            sizes = sorted(r.points)
            ax.plot(
                sizes,
                [r.points[n] for n in sizes],
                linestyle="--" if r.name in floors else "-",
                marker=markers[i % len(markers)] if ":" in r.name else "o",
                color=colour_of[group(r)],
                label=f"{r.name} ({growth(r.points):.2f}x/10x)",
            )
        ax.set_xscale("log")
        values = [v for r in result.rows if r.unit == unit for v in r.points.values()]
        positive = [v for v in values if v > 0]
        if positive and min(values) > 0 and max(positive) / min(positive) > 30:
            ax.set_yscale("log")
        elif min(values, default=0) >= 0:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("N")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{result.family}: cost per operation vs N (dashed: etcd floor)")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def markdown(data: dict[str, Any]) -> str:
    """A family's JSON as the README's table: a row per curve, its points and growth."""
    sizes = [str(n) for n in data["sizes"]]
    lines = [
        "| row | unit | "
        + " | ".join(f"{int(n):,}" for n in sizes)
        + " | growth/10x | vs floor | verdict |",
        "|---|---|" + "---|" * len(sizes) + "---|---|---|",
    ]
    for row in data["rows"]:
        cells = [f"{row['points'][n]:.3g}" if n in row["points"] else "-" for n in sizes]
        g, rel = row["growth_per_10x"], row["growth_vs_floor"]
        verdict = f"**{row['verdict']}**" if row["verdict"] == "FINDING" else row["verdict"]
        lines.append(
            f"| {row['name']} | {row['unit']} | {' | '.join(cells)} | "
            f"{'-' if g is None else f'{g:.2f}'} | {'' if rel is None else f'{rel:.2f}'} | "
            f"{verdict} |"
        )
    return "\n".join(lines)


def from_json(data: dict[str, Any]) -> FamilyResult:
    rows = [
        Row(
            r["name"], r["unit"], {int(n): v for n, v in r["points"].items()}, r["floor"], r["note"]
        )
        for r in data["rows"]
    ]
    return FamilyResult(data["family"], rows, list(data["notes"]))


def git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def to_json(result: FamilyResult, extra: dict[str, Any]) -> dict[str, Any]:
    rows = {r.name: r for r in result.rows}
    out_rows = []
    for r in result.rows:
        g, rel, word = verdict(r, rows)
        out_rows.append(
            {
                "name": r.name,
                "unit": r.unit,
                "points": {str(n): r.points[n] for n in sorted(r.points)},
                "floor": r.floor,
                "note": r.note,
                "growth_per_10x": None if math.isnan(g) else g,
                "growth_vs_floor": None if rel is None or math.isnan(rel) else rel,
                "verdict": word,
            }
        )
    return {"family": result.family, **extra, "rows": out_rows, "notes": result.notes}


async def run_family(name: str, ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    module = importlib.import_module(f"scale_families.{name}")
    try:
        result: FamilyResult = await module.run(ctx, sizes)
    finally:
        await ctx.cleanup()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", action="append", help="run only these (repeatable)")
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (medians)")
    parser.add_argument("--endpoint")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the tables of the JSON in --out and redraw its PNGs; run nothing",
    )
    args = parser.parse_args()
    known = family_names()
    names = args.family or known
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown family {unknown}; known: {', '.join(known)}")
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    out = Path(args.out)
    if args.markdown:
        for name in names:
            path = out / f"scale-{name}.json"
            if path.exists():
                data = json.loads(path.read_text())
                plot(from_json(data), out / f"scale-{name}.png")
                print(
                    f"### {name}\n\n`{data['command']}`, {data['date']} at {data['commit']}, "
                    f"load {data['loadavg_before'][0]:.1f} -> {data['loadavg_after'][0]:.1f}"
                    f"\n\n{markdown(data)}\n"
                )
                for note in data["notes"]:
                    print(f"* {note}")
                print()
        return
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["benchmarks/scale.py", *sys.argv[1:]])
    with contextlib.ExitStack() as stack:
        if args.endpoint:
            endpoint, pid = args.endpoint, None
        else:
            server = stack.enter_context(EtcdServer())
            endpoint, pid = server.endpoint, server.pid
        ctx = ScaleContext(endpoint, pid, args.repeats)
        for name in names:
            print(f"== {name}: sizes {sizes}, {args.repeats} runs per size", flush=True)
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            result = asyncio.run(run_family(name, ctx, sizes))
            extra = {
                "command": command,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "commit": git_commit(),
                "sizes": sizes,
                "repeats": args.repeats,
                "etcd": "own (tmpfs, --unsafe-no-fsync)" if pid else endpoint,
                "cpus": os.cpu_count(),
                "loadavg_before": list(load_before),
                "loadavg_after": list(os.getloadavg()),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            data = to_json(result, extra)
            (out / f"scale-{name}.json").write_text(json.dumps(data, indent=2) + "\n")
            plot(result, out / f"scale-{name}.png")
            print(table(result))
            for note in result.notes:
                print(f"  note: {note}")
            print(
                f"  ({extra['seconds']} s, load {load_before[0]:.1f} -> "
                f"{extra['loadavg_after'][0]:.1f}; wrote {out}/scale-{name}.json, .png)\n",
                flush=True,
            )


if __name__ == "__main__":
    main()
