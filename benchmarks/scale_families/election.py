"""Election candidates: the graceful hand-over of a ``LeaderLatch`` with N candidates on one
path, all in one process on one client (each its own latch).

Rows (per N: ``HANDOVERS`` hand-overs in each of ``ctx.repeats`` rounds; medians):

* ``graceful hand-over p50``: from the leader's ``aclose()`` to the next leader's leadership
  listener (the closed latch is replaced by a fresh candidate: N stays N);
* ``client CPU per hand-over``: process CPU of the hand-overs (close, win, replacement) / their
  number;
* ``candidate start, per candidate``: wall time to start the N latches (100 at a time) / N;
* floor ``floor: delete -> event -> N-1 creates``: the same RPCs bare, with N-1 successors as
  the Kotlin layout has them: a key is deleted, a watch on it (same client) sees the delete,
  N-1 ``version == 0`` creates go out at once; until the winning one answers;
* ``floor: delete -> event -> 1 create``: the same with one successor (no herd).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from etcd_recipes import Cmp, EtcdClient, EtcdRecipeError, LeaderLatch, Op
from scale_families._api import FamilyResult, Row, ScaleContext, pct

HANDOVERS = 10
BUDGET = 400.0


async def herd_floor(client: EtcdClient, key: str, successors: int) -> float:
    out: list[float] = []
    for _ in range(HANDOVERS):
        put = await client.put(key, b"leader")
        async with client.watch(key, start_revision=put.revision + 1, no_put=True) as watch:
            await asyncio.sleep(0.02)
            started = time.perf_counter()
            delete = asyncio.ensure_future(client.delete(key))
            async for _event in watch:
                creates = [
                    asyncio.ensure_future(client.txn([Cmp.missing(key)], [Op.put(key, b"n")]))
                    for _ in range(successors)
                ]
                for done in asyncio.as_completed(creates):
                    if (await done).succeeded:
                        out.append(time.perf_counter() - started)
                        break
                await asyncio.gather(*creates)
                break
            await delete
        await client.delete(key)
    return pct(out, 0.5)


async def one_round(client: EtcdClient, path: str, n: int) -> dict[str, float]:
    wins: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    latches: list[LeaderLatch] = []
    made = 0

    def candidate(slot: int) -> LeaderLatch:
        nonlocal made
        made += 1
        latch = LeaderLatch(client, path, client_id=f"c{slot}-{made}")
        latch.add_leadership_listener(
            lambda leading: leading and wins.put_nowait((slot, time.perf_counter()))
        )
        return latch

    t0 = time.perf_counter()
    latches = [candidate(i) for i in range(n)]
    for start in range(0, n, 100):
        await asyncio.gather(*(latch.start() for latch in latches[start : start + 100]))
    leader = (await asyncio.wait_for(wins.get(), 60))[0]
    started = time.perf_counter() - t0
    await asyncio.sleep(0.3)
    handovers: list[float] = []
    cpu0 = time.process_time()
    for _ in range(HANDOVERS):
        await asyncio.sleep(0.05)
        t1 = time.perf_counter()
        await latches[leader].aclose()
        nxt, at = await asyncio.wait_for(wins.get(), 60)
        handovers.append(at - t1)
        latches[leader] = candidate(leader)
        await latches[leader].start()
        leader = nxt
    cpu = time.process_time() - cpu0
    for start in range(0, n, 100):
        await asyncio.gather(*(latch.aclose() for latch in latches[start : start + 100]))
    return {
        "handover": statistics.median(handovers) * 1e3,
        "cpu": cpu / HANDOVERS * 1e3,
        "start": started / n * 1e3,
    }


async def run(ctx: ScaleContext, sizes: list[int]) -> FamilyResult:
    got: dict[str, dict[int, float]] = {k: {} for k in ("handover", "cpu", "start", "herd", "one")}
    notes: list[str] = []
    async with ctx.connect() as client:
        await one_round(client, ctx.fresh_prefix("election-warm") + "e", 2)
        for n in sizes:
            t0 = time.perf_counter()
            try:
                runs = [
                    await one_round(client, ctx.fresh_prefix("election") + "e", n)
                    for _ in range(ctx.repeats)
                ]
            except (EtcdRecipeError, asyncio.TimeoutError) as exc:
                notes.append(
                    f"N={n} failed after {time.perf_counter() - t0:.0f} s and was left out: "
                    f"{type(exc).__name__}: {exc}"
                )
                break
            for key in ("handover", "cpu", "start"):
                got[key][n] = statistics.median(r[key] for r in runs)
            floor_key = ctx.fresh_prefix("election-floor") + "LEADER"
            got["herd"][n] = await herd_floor(client, floor_key, max(1, n - 1)) * 1e3
            got["one"][n] = await herd_floor(client, floor_key, 1) * 1e3
            took = time.perf_counter() - t0
            print(f"  election N={n}: {took:.1f} s", flush=True)
            bigger = [s for s in sizes if s > n]
            if bigger and took * bigger[0] / n > BUDGET:
                notes.append(
                    f"stopped at N={n}: it took {took:.0f} s ({ctx.repeats} rounds of "
                    f"{HANDOVERS} hand-overs); N={bigger[0]} would take about "
                    f"{took * bigger[0] / n / 60:.0f} min"
                )
                break
    notes.append(
        "one process, one client: every latch has its own participant key and term lease; on "
        "the leader's delete every waiting candidate tries its create (the Kotlin layout)"
    )
    herd = "floor: delete -> event -> N-1 creates"
    return FamilyResult(
        "election",
        [
            Row("graceful hand-over p50", "ms", got["handover"], floor=herd),
            Row(herd, "ms", got["herd"]),
            Row("floor: delete -> event -> 1 create", "ms", got["one"]),
            Row("client CPU per hand-over", "ms CPU", got["cpu"]),
            Row("candidate start, per candidate", "ms/candidate", got["start"]),
        ],
        notes,
    )
