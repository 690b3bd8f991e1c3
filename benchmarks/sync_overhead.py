"""The blocking facade's overhead per call: sync ``get()`` vs async ``get()`` in one run.

Run by hand (not part of the test suite)::

    .venv/bin/python benchmarks/sync_overhead.py [--calls 3000] [--rounds 5] [--endpoint HOST:PORT]

Alternates async and sync rounds against the same server and reports the median per-call
time of each and their difference (target: under 50 us per call at the median).

The facade's ``get()`` (like ``put``, ``delete``, ``range``, ``get_prefix`` and ``count``) is
sent from the calling thread through grpc's blocking stub: **no thread hand-off**
(``etcd_recipes/_core/blocking.py``). Every other facade call runs its coroutine on the
client's loop thread, with **two hand-offs**: the calling thread schedules it
(``call_soon_threadsafe``: one write to the loop's wake-up pipe), and the loop thread releases
the caller's pre-acquired lock when the coroutine has ended. The ``hop get`` row times that
way for the same ``get()`` (``Runtime.call`` of the async method: what ``get()`` cost before,
and what a ``txn()`` or ``lease_grant()`` pays on top of its RPC); the ``floor`` row times the
pair of hand-offs alone (a bare loop thread, no task, no cancel scope); the ``bare stub`` row
the same ``Range`` through grpc's blocking stub with none of the client's work (arguments,
retries, error mapping, metrics, result conversion).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import threading
import time

import grpc
from aetcd import rpc

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


def hop_round(client: object, calls: int) -> float:
    """Seconds per ``get()`` run as a coroutine on the facade's loop thread (two hand-offs)."""
    rt, aget = client._rt, client._a.get  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    for _ in range(calls):
        rt.call(aget, "/bench/k")
    return (time.perf_counter() - t0) / calls


def blocking_stub_round(endpoint: str, calls: int) -> float:
    """Seconds per ``Range`` through grpc's *blocking* stub on a plain channel, called from
    this thread: no event loop and no hand-off at all (what a facade built on grpc's sync
    stubs instead of a loop thread would pay for a plain unary call, before any of the
    client's own work: retries, deadlines, error mapping, metrics)."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = rpc.KVStub(channel)
        request = rpc.RangeRequest(key=b"/bench/k")
        stub.Range(request)
        t0 = time.perf_counter()
        for _ in range(calls):
            stub.Range(request)
        return (time.perf_counter() - t0) / calls


def bare_handoffs(loop: asyncio.AbstractEventLoop, calls: int) -> float:
    """Seconds per pair of hand-offs: schedule a callback on ``loop``, wait for it to release
    a pre-acquired lock (what a facade call does, without the coroutine)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        done = threading.Lock()
        done.acquire()
        loop.call_soon_threadsafe(done.release)
        done.acquire()
    return (time.perf_counter() - t0) / calls


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
        bare_loop = asyncio.new_event_loop()
        stack.callback(bare_loop.close)
        bare_thread = threading.Thread(target=bare_loop.run_forever, daemon=True)
        bare_thread.start()
        stack.callback(bare_thread.join)
        stack.callback(bare_loop.call_soon_threadsafe, bare_loop.stop)
        asyncs, syncs, hops, bares, stubs = [], [], [], [], []
        for _ in range(args.rounds):
            asyncs.append(asyncio.run(async_round(endpoint, args.calls)))
            syncs.append(sync_round(sync_client, args.calls))
            hops.append(hop_round(sync_client, args.calls))
            bares.append(bare_handoffs(bare_loop, args.calls))
            stubs.append(blocking_stub_round(endpoint, args.calls))
        a, s = (statistics.median(x[0] for x in r) for r in (asyncs, syncs))
        ac, sc = (statistics.median(x[1] for x in r) for r in (asyncs, syncs))
        print(f"medians of {args.rounds} rounds x {args.calls} calls; wall time and process CPU")
        print(f"async get : {a * 1e6:7.1f} us/call wall, {ac * 1e6:6.1f} us CPU")
        print(f"sync get  : {s * 1e6:7.1f} us/call wall, {sc * 1e6:6.1f} us CPU")
        bare = statistics.median(bares)
        verdict = "OK" if (s - a) < 50e-6 else "OVER TARGET"
        print(
            f"overhead  : {(s - a) * 1e6:7.1f} us/call wall (target < 50 us) -> {verdict}; "
            f"{(sc - ac) * 1e6:.1f} us CPU"
        )
        hop = statistics.median(hops)
        print(
            f"hop get   : {hop * 1e6:7.1f} us/call for get() run on the loop thread "
            f"({(hop - a) * 1e6:+.1f} us against async get; two hand-offs)"
        )
        print(f"floor     : {bare * 1e6:7.1f} us for the two hand-offs alone")
        stub = statistics.median(stubs)
        print(
            f"bare stub : {stub * 1e6:7.1f} us/call for a blocking-stub Range with none of the "
            f"client's work ({(s - stub) * 1e6:+.1f} us is what the facade's get() adds to it)"
        )


if __name__ == "__main__":
    main()
