"""The blocking facade's overhead per call: sync ``get()`` vs async ``get()`` in one run.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/sync_overhead.py [--calls 3000] [--rounds 5] [--endpoint HOST:PORT]

Alternates async and sync rounds against the same server and reports the median per-call
time of each and their difference (target: under 100 us per call).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

from etcd_recipes import connect as aconnect
from etcd_recipes.sync import connect as sconnect
from etcd_recipes.testing import EtcdServer


async def async_round(endpoint: str, calls: int) -> tuple[float, float]:
    async with aconnect(endpoint) as client:
        await client.put("/bench/k", b"v")
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await client.get("/bench/k")
        return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls


def sync_round(client: object, calls: int) -> tuple[float, float]:
    get = client.get  # type: ignore[attr-defined]
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        get("/bench/k")
    return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--endpoint")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        endpoint = args.endpoint or stack.enter_context(EtcdServer()).endpoint
        sync_client = stack.enter_context(sconnect(endpoint))
        sync_client.put("/bench/k", b"v")
        asyncs, syncs = [], []
        for _ in range(args.rounds):
            asyncs.append(asyncio.run(async_round(endpoint, args.calls)))
            syncs.append(sync_round(sync_client, args.calls))
        a, s = (statistics.median(x[0] for x in r) for r in (asyncs, syncs))
        ac, sc = (statistics.median(x[1] for x in r) for r in (asyncs, syncs))
        print(f"medians of {args.rounds} rounds x {args.calls} calls; wall time and process CPU")
        print(f"async get : {a * 1e6:7.1f} us/call wall, {ac * 1e6:6.1f} us CPU")
        print(f"sync get  : {s * 1e6:7.1f} us/call wall, {sc * 1e6:6.1f} us CPU")
        verdict = "OK" if (s - a) < 100e-6 else "OVER TARGET"
        print(
            f"overhead  : {(s - a) * 1e6:7.1f} us/call wall (target < 100 us) -> {verdict}; "
            f"{(sc - ac) * 1e6:.1f} us CPU"
        )


if __name__ == "__main__":
    main()
