"""Per-call cost of the sync facade's Runtime vs anyio's BlockingPortal (no etcd involved).

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/sync_portal.py [--calls 3000] [--rounds 5]

Alternates rounds of no-op calls through ``etcd_recipes.sync._runtime.runtime.Runtime`` and
through a ``BlockingPortal`` from ``anyio.from_thread.start_blocking_portal()``, for a coroutine
and for a plain function, and prints the medians (the numbers quoted in
``sync/_runtime/runtime.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from anyio.from_thread import start_blocking_portal

from etcd_recipes.sync._runtime.runtime import Runtime


async def noop_coroutine() -> None:
    return None


def noop_function() -> None:
    return None


def per_call(call: Callable[[Any], Any], fn: Any, calls: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call(fn)
    return (time.perf_counter() - t0) / calls * 1e6, (time.process_time() - c0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rt = Runtime()
    try:
        with start_blocking_portal() as portal:
            cases = (
                ("coroutine", noop_coroutine, rt.call),
                ("plain fn", noop_function, rt.call_sync),
            )
            for label, fn, rt_call in cases:
                ours, theirs = [], []
                for _ in range(args.rounds):
                    ours.append(per_call(rt_call, fn, args.calls))
                    theirs.append(per_call(portal.call, fn, args.calls))
                ow, oc = (statistics.median(x[i] for x in ours) for i in (0, 1))
                tw, tc = (statistics.median(x[i] for x in theirs) for i in (0, 1))
                print(
                    f"{label:9}: Runtime {ow:6.1f} us wall {oc:6.1f} us CPU | "
                    f"BlockingPortal {tw:6.1f} us wall {tc:6.1f} us CPU"
                )
    finally:
        rt.stop()


if __name__ == "__main__":
    main()
