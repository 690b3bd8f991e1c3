"""A randomized fault schedule against two watchers, checked against etcd's own history.

The schedule (seeded; the seed is printed on failure, ``ETCD_RECIPES_CHAOS_SEED=N`` replays
it) mixes server restarts by SIGKILL and by SIGTERM, connection cuts and blackholes at a TCP
proxy in front of the watchers, and compactions made while the watchers are cut off (one or
two per outage, sometimes exactly at a watcher's resume revision, sometimes racing the
reconnect). A writer on a direct connection keeps writing meanwhile.

The watchers: a plain :meth:`EtcdClient.watch` with a ``resync`` hook, and a
:class:`~etcd_recipes.PrefixCache`. Each keeps a mirror of the range built only from what it
delivered.

The checker compares that with **etcd's own history**: the full event history of the range,
read from etcd segment by segment before each compaction and after the run (the server is
fresh, so every revision from 2 on is known). It tells two kinds of fault apart:

* **etcd's**: a committed write that etcd no longer has after a restart -- two acknowledged
  writes with one revision, an acknowledged write that the history does not hold, or an
  event a watcher was served that the history later contradicts (etcd 3.5.0-3.5.2 lose
  applied writes when killed in a window of their backend commit, etcd-io/etcd#13766; the
  test server runs with ``--unsafe-no-fsync``, but etcd 3.5.1 still writes its WAL out on
  every sync, so fsync is no cause for a process kill). Revisions touched by such a loss
  are *tainted*; a watcher discrepancy only at tainted revisions is reported as etcd's;
* **ours**: an event delivered twice or out of order, a revision of the history neither
  delivered nor covered by a resync, a delivered event that differs from the history, a
  resync whose state is not etcd's state at its revision, or a final state that is not
  etcd's.

By default a SIGKILL is sent after the writer has been quiet for 0.25 s (longer than etcd's
100 ms backend commit interval), which closes #13766's window: what etcd loses then is no
longer etcd's known bug. ``ETCD_RECIPES_CHAOS_KILL_UNDER_LOAD=1`` kills mid-write instead
(the investigation mode; expect etcd's faults to show up there, classified as such).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field

import pytest

from etcd_recipes import (
    BatchKind,
    CacheEventType,
    CompactedError,
    EtcdRecipeError,
    EventType,
    KeyValue,
    PrefixCache,
    ResilienceConfig,
    RetryPolicy,
    RpcResilience,
    WatchEvent,
    WatchResynced,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import ETCD_QUIET_BEFORE_KILL

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}
PREFIX = "/chaos/"
KEYS = [f"{PREFIX}k{i}" for i in range(6)]
RANGE = range(2, 5)  # the range watch's keys: KEYS[2:5], i.e. [k2, k5)

Op = tuple[str, str, bytes | None]  # (PUT|DELETE, key, value)


# ---------------------------------------------------------------------------- the record


@dataclass
class Write:
    revision: int
    op: Op


@dataclass
class Run:
    """Everything the run observed; the checker's input."""

    seed: int
    history: dict[int, list[Op]] = field(default_factory=dict)  # etcd's, by revision
    head: int = 1
    acked: list[Write] = field(default_factory=list)
    attempted: set[Op] = field(default_factory=set)  # every write tried, acked or not
    compactions: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    watch_items: list[object] = field(default_factory=list)
    hook_snapshots: dict[int, dict[str, bytes]] = field(default_factory=dict)  # by anchor
    # the same stream's other watches: a key range with its own hook, and one with no hook
    range_items: list[object] = field(default_factory=list)
    range_snapshots: dict[int, dict[str, bytes]] = field(default_factory=dict)
    raw_items: list[object] = field(default_factory=list)
    trio: bool = False  # whether the two above ran (the checker's own tests leave them out)
    batches: list[object] = field(default_factory=list)
    final_state: dict[str, bytes] = field(default_factory=dict)
    cache_state: dict[str, bytes] = field(default_factory=dict)


def _op(event: WatchEvent) -> Op:
    key = event.kv.key.decode()
    if event.type is EventType.DELETE:
        return ("DELETE", key, None)
    return ("PUT", key, event.kv.value)


def state_at(history: dict[int, list[Op]], revision: int) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for rev in sorted(r for r in history if r <= revision):
        for kind, key, value in history[rev]:
            if kind == "PUT":
                assert value is not None
                state[key] = value
            else:
                state.pop(key, None)
    return state


# ---------------------------------------------------------------------------- the checker


@dataclass
class Verdict:
    etcd: list[str] = field(default_factory=list)
    ours: list[str] = field(default_factory=list)
    tainted: set[int] = field(default_factory=set)
    resyncs: dict[str, int] = field(default_factory=dict)


def check(run: Run) -> Verdict:
    v = Verdict()
    history = run.history
    # etcd's faults: committed writes it lost across a restart.
    by_rev: dict[int, list[Write]] = {}
    for w in run.acked:
        by_rev.setdefault(w.revision, []).append(w)
    for rev, writes in sorted(by_rev.items()):
        if len(writes) > 1:
            v.tainted.add(rev)
            v.etcd.append(f"two acknowledged writes got revision {rev}: {[w.op for w in writes]}")
        for w in writes:
            if w.op not in history.get(rev, []):
                v.tainted.add(rev)
                v.etcd.append(
                    f"acknowledged write {w.op} at revision {rev} is not in etcd's history "
                    f"(it holds {history.get(rev)})"
                )
    delivered = [(i.revision, _op(i)) for i in run.watch_items if isinstance(i, WatchEvent)]
    for batch in run.batches:
        if batch.kind is BatchKind.LIVE:
            delivered += [(batch.revision, _cache_op(e)) for e in batch]
    for rev, op in delivered:
        if op not in history.get(rev, []) and op in run.attempted:
            v.tainted.add(rev)
            v.etcd.append(
                f"a watcher was served {op} at revision {rev}; etcd's history later "
                f"holds {history.get(rev)} there"
            )
    _check_plain(run, v)
    _check_cache(run, v)
    return v


def _cache_op(event) -> Op:
    if event.type is CacheEventType.DELETED:
        return ("DELETE", event.key, None)
    return ("PUT", event.key, event.value)


def _blame(v: Verdict, revisions: list[int], what: str) -> None:
    if revisions and all(r in v.tainted for r in revisions):
        v.etcd.append(f"(consequence) {what}")
    else:
        v.ours.append(what)


def _in_range(history: dict[int, list[Op]], keys: range | None) -> dict[int, list[Op]]:
    """The history restricted to ``KEYS[keys]`` (all of it for ``None``)."""
    if keys is None:
        return history
    wanted = {KEYS[i] for i in keys}
    out: dict[int, list[Op]] = {}
    for rev, ops in history.items():
        mine = [op for op in ops if op[1] in wanted]
        if mine:
            out[rev] = mine
    return out


def _check_plain(run: Run, v: Verdict) -> None:
    _check_watch(run, v, "watch", run.watch_items, run.hook_snapshots, None)
    if run.trio:
        _check_watch(run, v, "range watch", run.range_items, run.range_snapshots, RANGE)
        _check_watch(run, v, "raw watch", run.raw_items, None, None)


def _check_watch(
    run: Run,
    v: Verdict,
    name: str,
    items: list[object],
    snapshots: dict[int, dict[str, bytes]] | None,
    keys: range | None,
) -> None:
    """One watch's items against etcd's history of its keys: every revision delivered once,
    in order, or covered by a resync whose re-read is etcd's state. A watch without a hook
    (``snapshots`` is None) may end with ``CompactedError`` and is checked up to its end."""
    history = _in_range(run.history, keys)
    final = _only(run.final_state, keys)
    nxt, mirror, resyncs = 2, {}, 0
    ended: object = None
    for item in items:
        if isinstance(item, BaseException):
            ended = item
            break
        if isinstance(item, WatchResynced):
            resyncs += 1
            anchor = item.anchor_revision
            snapshot = None if snapshots is None else snapshots.get(anchor)
            if snapshot is None:
                v.ours.append(f"{name}: WatchResynced anchored at {anchor} by no hook call")
                continue
            truth = _only(state_at(run.history, anchor - 1), keys)
            if snapshot != truth:
                _blame(
                    v,
                    [anchor - 1],
                    f"{name}: the resync read at {anchor - 1} differs from "
                    f"etcd's history there: {_diff(snapshot, truth)}",
                )
            if anchor < nxt:
                v.ours.append(f"{name}: resync anchored at {anchor}, behind delivered {nxt - 1}")
            mirror, nxt = dict(snapshot), anchor
            continue
        if not isinstance(item, WatchEvent):
            continue
        rev, op = item.revision, _op(item)
        if rev < nxt:
            _blame(
                v,
                [rev],
                f"{name}: revision {rev} delivered again or out of order "
                f"(expected {nxt} or later): {op}",
            )
            continue
        missing = [r for r in range(nxt, rev) if r in history]
        if missing:
            _blame(
                v,
                missing,
                f"{name}: revisions {missing[:10]} never delivered nor resynced "
                f"({len(missing)} in all: {[history[r] for r in missing[:5]]})",
            )
        if op not in history.get(rev, []):
            _blame(v, [rev], f"{name}: delivered {op} at {rev}; etcd's history: {history.get(rev)}")
        _apply(mirror, op)
        nxt = rev + 1
    v.resyncs[name] = resyncs
    if ended is not None:
        if snapshots is not None or not isinstance(ended, CompactedError):
            v.ours.append(f"{name}: ended with {ended!r}")
        elif not any(c >= nxt for c in run.compactions):
            v.ours.append(f"{name}: CompactedError though no compaction passed {nxt - 1}")
        return  # a raw watch's end: nothing more to deliver
    missing = [r for r in range(nxt, run.head + 1) if r in history]
    if missing:
        _blame(v, missing, f"{name}: revisions {missing[:10]} never delivered by the end")
    if mirror != final:
        msg = f"{name}: its mirror differs from etcd at the end: {_diff(mirror, final)}"
        (v.etcd if v.tainted else v.ours).append(msg)


def _only(state: dict[str, bytes], keys: range | None) -> dict[str, bytes]:
    if keys is None:
        return state
    wanted = {KEYS[i] for i in keys}
    return {k: val for k, val in state.items() if k in wanted}


def _check_cache(run: Run, v: Verdict) -> None:
    history = run.history
    nxt, mirror, resyncs = None, {}, 0
    for batch in run.batches:
        kind, rev = batch.kind, batch.revision
        if kind is BatchKind.INITIAL:
            mirror = {e.key: e.value for e in batch}
            truth = state_at(history, rev)
            if mirror != truth:
                _blame(v, [rev], f"cache: INITIAL at {rev} differs: {_diff(mirror, truth)}")
            nxt = rev + 1
        elif kind is BatchKind.LIVE:
            assert nxt is not None
            if rev < nxt:
                _blame(v, [rev], f"cache: revision {rev} delivered again (expected >= {nxt})")
                continue
            missing = [r for r in range(nxt, rev) if r in history]
            if missing:
                _blame(v, missing, f"cache: revisions {missing} never delivered nor resynced")
            for event in batch:
                op = _cache_op(event)
                if op not in history.get(rev, []):
                    _blame(
                        v,
                        [rev],
                        f"cache: delivered {op} at {rev}; etcd's history: {history.get(rev)}",
                    )
                _apply(mirror, op)
            nxt = rev + 1
        elif kind is BatchKind.RESYNC:
            for event in batch:
                _apply(mirror, _cache_op(event))
        elif kind is BatchKind.RESYNCED:
            resyncs += 1
            truth = state_at(history, rev)
            if mirror != truth:
                _blame(
                    v,
                    [rev],
                    f"cache: state after RESYNCED at {rev} differs from etcd's "
                    f"history: {_diff(mirror, truth)}",
                )
            nxt = rev + 1
    if nxt is not None:
        missing = [r for r in range(nxt, run.head + 1) if r in history]
        if missing:
            _blame(v, missing, f"cache: revisions {missing[:10]} never delivered by the end")
    for what, state in (("mirror of its batches", mirror), ("content", run.cache_state)):
        if state != run.final_state:
            msg = f"cache: {what} differs from etcd at the end: {_diff(state, run.final_state)}"
            (v.etcd if v.tainted else v.ours).append(msg)
    v.resyncs["cache"] = resyncs


def _apply(state: dict[str, bytes], op: Op) -> None:
    kind, key, value = op
    if kind == "PUT":
        assert value is not None
        state[key] = value
    else:
        state.pop(key, None)


def _diff(got: dict[str, bytes], want: dict[str, bytes]) -> str:
    keys = sorted(set(got) | set(want))
    return ", ".join(
        f"{k}: {got.get(k)!r} != {want.get(k)!r}" for k in keys if got.get(k) != want.get(k)
    )


# ---------------------------------------------------------------------------- the actors


class Writer:
    """Writes random puts and deletes, one RPC per attempt (no retries: each value is
    unique, so a write is either acknowledged with its revision or of unknown outcome)."""

    def __init__(self, client, run: Run, rng: random.Random) -> None:
        self.client, self.run, self.rng = client, run, rng
        self.running = asyncio.Event()
        self.running.set()
        self.idle = asyncio.Event()
        self.n = 0
        self.delete_next = False  # the next write deletes an existing key
        self.task = asyncio.create_task(self._loop())

    async def pause(self) -> None:
        self.running.clear()
        await self.idle.wait()

    def resume(self) -> None:
        self.running.set()

    async def _loop(self) -> None:
        while True:
            self.idle.set()
            await self.running.wait()
            self.idle.clear()
            key = self.rng.choice(KEYS)
            self.n += 1
            try:
                if self.delete_next:
                    present = await self.client.range(PREFIX, prefix=True, keys_only=True)
                    if present.kvs:
                        key = self.rng.choice(present.kvs).key.decode()
                if self.rng.random() < 0.7 and not self.delete_next:
                    value = f"v{self.n}".encode()
                    op: Op = ("PUT", key, value)
                    self.run.attempted.add(op)
                    rev = (await self.client.put(key, value, timeout=1.0)).revision
                    self.run.acked.append(Write(rev, op))
                else:
                    op = ("DELETE", key, None)
                    self.run.attempted.add(op)
                    result = await self.client.delete(key, timeout=1.0)
                    if result.deleted:
                        self.run.acked.append(Write(result.revision, op))
                        self.delete_next = False
            except EtcdRecipeError:
                self.idle.set()
                await asyncio.sleep(0.02)
            self.idle.set()
            await asyncio.sleep(self.rng.uniform(0, 0.01))

    async def stop(self) -> None:
        self.task.cancel()
        with _suppress():
            await self.task


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return exc[0] is not None and issubclass(exc[0], (asyncio.CancelledError, Exception))


async def read_history(client, run: Run) -> int:
    """Append etcd's history from ``run.head + 1`` to the current head; returns the head."""
    while True:
        try:
            head = (await client.range(PREFIX, prefix=True, count_only=True)).revision
            if head <= run.head:
                return run.head
            got: dict[int, list[Op]] = {}
            async with client.watch(PREFIX, prefix=True, start_revision=run.head + 1) as w:
                async with asyncio.timeout(10):
                    async for event in w:
                        got.setdefault(event.revision, []).append(_op(event))
                        if event.revision >= head and w.buffered == 0:
                            break
            run.history.update(got)
            run.head = head
            return head
        except EtcdRecipeError:
            await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- the schedule


def schedule(
    rng: random.Random, kills: int, terms: int, cuts: int, compactions: int, stalls: int = 0
):
    actions = ["kill"] * kills + ["term"] * terms + ["cut"] * cuts + ["compact"] * compactions
    actions += ["stall"] * stalls
    rng.shuffle(actions)
    return actions


async def chaos(
    server, seed: int, *, kills: int, terms: int, cuts: int, compactions: int, stalls: int = 0
):
    rng = random.Random(seed)
    # Half the runs watch with the client's default keep-alive (5 s + 2 s): a stall shorter
    # than that is never noticed by the transport, so the stream lives through it.
    watch_kwargs = FAST if rng.random() < 0.5 else {}
    run_note = f"watch keepalive {'fast' if watch_kwargs else 'default'}"
    under_load = os.environ.get("ETCD_RECIPES_CHAOS_KILL_UNDER_LOAD") == "1"
    run = Run(seed)
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    single = ResilienceConfig(rpc=RpcResilience(RetryPolicy.never(), 1.0))
    try:
        async with (
            connect(**server.client_kwargs(), resilience=single) as direct,
            connect(proxy.url, **watch_kwargs) as watch_client,
            connect(proxy.url, **FAST) as cache_client,
        ):
            run.actions.append(run_note)

            async def hook() -> int:
                snap = await watch_client.range(PREFIX, prefix=True)
                anchor = snap.revision + 1
                run.hook_snapshots[anchor] = {kv.key.decode(): kv.value for kv in snap.kvs}
                return anchor

            watch = watch_client.watch(PREFIX, prefix=True, start_revision=2, resync=hook)
            await watch.start()

            async def consume() -> None:
                async for item in watch.items():
                    run.watch_items.append(item)

            async def range_hook() -> int:
                snap = await watch_client.range(KEYS[RANGE.start], range_end=KEYS[RANGE.stop])
                anchor = snap.revision + 1
                run.range_snapshots[anchor] = {kv.key.decode(): kv.value for kv in snap.kvs}
                return anchor

            # The issue-31 trio on one stream: the prefix with a hook (above), a key range
            # with its own hook, and the prefix with none (it must end with CompactedError).
            range_watch = watch_client.watch(
                KEYS[RANGE.start], range_end=KEYS[RANGE.stop], start_revision=2, resync=range_hook
            )
            raw_watch = watch_client.watch(PREFIX, prefix=True, start_revision=2)
            await range_watch.start()
            await raw_watch.start()
            run.trio = True

            async def consume_other(w, items: list[object]) -> None:
                try:
                    async for item in w.items():
                        items.append(item)
                except EtcdRecipeError as exc:
                    items.append(exc)

            consumer = asyncio.create_task(consume())
            others = [
                asyncio.create_task(consume_other(range_watch, run.range_items)),
                asyncio.create_task(consume_other(raw_watch, run.raw_items)),
            ]
            cache = PrefixCache(cache_client, PREFIX)
            batches = cache.events(maxsize=100_000)
            await cache.start()

            async def consume_cache() -> None:
                async for batch in batches:
                    run.batches.append(batch)

            cache_consumer = asyncio.create_task(consume_cache())
            writer = Writer(direct, run, rng)

            async def ask_progress() -> None:
                # What a cache's wait_for_revision sends: on etcd < 3.5.8 the answer overtakes
                # queued events (etcd-io/etcd#15220), which a watch must not take as progress.
                own = random.Random(seed + 1)  # the schedule's draws stay the seed's
                while True:
                    await asyncio.sleep(own.uniform(0.005, 0.05))
                    watch_client.request_progress()

            others.append(asyncio.create_task(ask_progress()))

            async def kill(graceful: bool) -> None:
                if graceful:
                    pid = server.pid
                    assert pid is not None
                    os.kill(pid, signal.SIGTERM)
                    deadline = time.monotonic() + 10
                    while server.pid is not None and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                else:
                    if not under_load:
                        await writer.pause()
                        await asyncio.sleep(ETCD_QUIET_BEFORE_KILL)
                    await asyncio.to_thread(server.kill)
                    writer.resume()
                await asyncio.sleep(rng.uniform(0, 0.5))
                await asyncio.to_thread(server.restart)

            async def compact_while_cut() -> None:
                proxy.blackhole()
                proxy.cut()
                racing = rng.random() < 0.3
                for _ in range(rng.choice((1, 1, 2))):
                    if rng.random() < 0.4:  # sometimes exactly one more write (a delete)
                        await writer.pause()
                        if rng.random() < 0.8:
                            writer.delete_next = True
                            writer.resume()
                            while writer.delete_next:
                                await asyncio.sleep(0.002)
                            await writer.pause()
                    else:
                        await asyncio.sleep(rng.uniform(0.05, 0.5))
                    await writer.pause()
                    head = await read_history(direct, run)
                    resume = watch.resume_revision
                    choices = [head, head, max(2, head - rng.randint(0, 3))]
                    if 2 <= resume <= head:  # exactly at the watcher's resume point
                        choices += [resume, resume]
                    floor = run.compactions[-1] + 1 if run.compactions else 2
                    if head < floor:
                        writer.resume()
                        continue
                    target = max(rng.choice(choices), floor)
                    if racing:
                        proxy.restore()
                    await direct.compact(target, physical=rng.random() < 0.5)
                    run.compactions.append(target)
                    run.actions.append(f"compact@{target}(resume {resume}, head {head})")
                    writer.resume()
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                proxy.restore()

            async def compact_while_stalled() -> None:
                # The connection stays open: held (stall) or dropped (blackhole) bytes, no
                # cut. The writer goes on meanwhile, so the server's send side backs up,
                # then the history is compacted at the head before the network heals.
                stalled = rng.random() < 0.6
                proxy.stall() if stalled else proxy.blackhole()
                await asyncio.sleep(rng.uniform(0.3, 2.5))
                await writer.pause()
                head = await read_history(direct, run)
                floor = run.compactions[-1] + 1 if run.compactions else 2
                if head >= floor:
                    await direct.compact(head, physical=rng.random() < 0.5)
                    run.compactions.append(head)
                    run.actions.append(
                        f"{'stall' if stalled else 'blackhole'}+compact@{head}"
                        f"(resume {watch.resume_revision})"
                    )
                writer.resume()
                await asyncio.sleep(rng.uniform(0.1, 1.0))
                proxy.restore()

            for action in schedule(rng, kills, terms, cuts, compactions, stalls):
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                run.actions.append(action)
                if action == "kill":
                    await kill(graceful=False)
                elif action == "term":
                    await kill(graceful=True)
                elif action == "cut":
                    if rng.random() < 0.5:
                        proxy.cut()
                    else:
                        proxy.blackhole()
                        proxy.cut()
                        await asyncio.sleep(rng.uniform(0.1, 0.8))
                        proxy.restore()
                elif action == "stall":
                    await compact_while_stalled()
                else:
                    await compact_while_cut()

            await asyncio.sleep(0.3)
            await writer.stop()
            head = await read_history(direct, run)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (
                watch.resume_revision <= head or range_watch.resume_revision <= head
            ):
                await asyncio.sleep(0.05)
            with _suppress():
                await cache.wait_for_revision(head, timeout=max(deadline - time.monotonic(), 1))
            await asyncio.sleep(0.2)  # any late duplicate
            final = await direct.range(PREFIX, prefix=True)
            run.final_state = {kv.key.decode(): kv.value for kv in final.kvs}
            run.cache_state = dict(cache.items())
            await watch.aclose()
            await range_watch.aclose()
            await raw_watch.aclose()
            await cache.aclose()
            for task in (consumer, cache_consumer, *others):
                task.cancel()
                with _suppress():
                    await task
    finally:
        proxy.stop()
    return run


def report(run: Run, v: Verdict) -> str:
    lines = [
        f"seed={run.seed} (replay: ETCD_RECIPES_CHAOS_SEED={run.seed})",
        f"actions: {run.actions}",
        f"head={run.head} acked={len(run.acked)} compactions={run.compactions} resyncs={v.resyncs}",
    ]
    if v.etcd:
        lines.append("ETCD'S FAULT (lost committed writes, etcd-io/etcd#13766 class):")
        lines += [f"  {m}" for m in v.etcd[:15]]
    if v.ours:
        lines.append("OUR FAULT (the watch machinery):")
        lines += [f"  {m}" for m in v.ours[:15]]
    return "\n".join(lines)


def _seed() -> int:
    env = os.environ.get("ETCD_RECIPES_CHAOS_SEED")
    return int(env) if env else random.randrange(2**31)


@pytest.mark.slow
async def test_watchers_match_etcd_history_through_random_faults(fresh_etcd_server):
    seed = _seed()
    started = time.monotonic()
    # kills,terms,cuts,compactions[,stalls]; issue 31's trial was "0,10,5,0,3"
    counts = [int(n) for n in os.environ.get("ETCD_RECIPES_CHAOS_SCHEDULE", "4,2,3,3,2").split(",")]
    kills, terms, cuts, compactions, stalls = [*counts, 0][:5]
    run = await chaos(
        fresh_etcd_server,
        seed,
        kills=kills,
        terms=terms,
        cuts=cuts,
        compactions=compactions,
        stalls=stalls,
    )
    verdict = check(run)
    took = time.monotonic() - started
    text = report(run, verdict) + f"\ntook {took:.1f}s"
    print(text)
    assert not verdict.ours and not verdict.etcd, text
    assert len(run.acked) > 50, text  # the schedule did write something to check
    assert run.compactions, text


# ---------------------------------------------------------------------------- regressions
# Deterministic reproductions of what the schedule above found (both failed before the fix).


async def _watched_then_cut(server, proxy, direct, watcher, resync):
    """A watch on /x/ that has seen two writes, then is cut off (blackholed)."""
    first = await direct.put("/x/k", b"1")
    await direct.put("/x/j", b"1")
    watch = watcher.watch("/x/", prefix=True, start_revision=first.revision, resync=resync)
    await watch.start()
    items: list[object] = []

    async def consume() -> None:
        try:
            async for item in watch.items():
                items.append(item)
        except Exception as exc:  # recorded for the test to inspect
            items.append(exc)

    task = asyncio.create_task(consume())
    deadline = time.monotonic() + 10
    while sum(isinstance(i, WatchEvent) for i in items) < 2:
        assert time.monotonic() < deadline, items
        await asyncio.sleep(0.01)
    proxy.blackhole()
    proxy.cut()
    while watch._server_active:
        assert time.monotonic() < deadline, items
        await asyncio.sleep(0.01)
    return watch, items, task


@pytest.mark.slow
@pytest.mark.parametrize("with_hook", [True, False], ids=["resync-hook", "raw"])
async def test_resume_exactly_at_the_compact_revision_does_not_skip_a_delete(
    fresh_etcd_server, with_hook
):
    """Cut off after revision N-1, a DELETE at N, compaction at N: resuming at N, etcd 3.5.1
    serves the watch but has dropped the DELETE (etcd-io/etcd#18089). The watch must resync
    (or, without a hook, raise CompactedError), never go on without the deletion."""
    server = fresh_etcd_server
    anchors: list[int] = []

    async def hook() -> int:
        anchors.append((await direct.range("/x/", prefix=True)).revision + 1)
        return anchors[-1]

    with TcpProxy.for_endpoint(server.endpoint) as proxy:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as watcher,
        ):
            watch, items, task = await _watched_then_cut(
                server, proxy, direct, watcher, hook if with_hook else None
            )
            assert watch.resume_revision == 4
            deleted = await direct.delete("/x/k")
            assert deleted.revision == 4 and deleted.deleted == 1
            await direct.compact(deleted.revision, physical=True)  # the tombstone is gone
            proxy.restore()
            deadline = time.monotonic() + 10
            while not task.done() and not any(isinstance(i, WatchResynced) for i in items):
                assert time.monotonic() < deadline, f"neither a resync nor an end: {items}"
                await asyncio.sleep(0.02)
            after = await direct.put("/x/j", b"2")
            while with_hook and not any(
                isinstance(i, WatchEvent) and i.revision == after.revision for i in items
            ):
                assert time.monotonic() < deadline, f"no event after the resync: {items}"
                await asyncio.sleep(0.02)
            events = [(i.revision, i.type) for i in items if isinstance(i, WatchEvent)]
            if with_hook:
                resynced = [i for i in items if isinstance(i, WatchResynced)]
                assert len(resynced) == 1, items  # the deletion is covered by the re-read
                assert resynced[0].compact_revision == deleted.revision
                assert events == [(2, EventType.PUT), (3, EventType.PUT), (5, EventType.PUT)]
            else:
                assert isinstance(items[-1], CompactedError), items
                assert events == [(2, EventType.PUT), (3, EventType.PUT)]
            await watch.aclose()
            task.cancel()
            with _suppress():
                await task


@pytest.mark.slow
async def test_a_compaction_pending_across_a_stream_failure_resyncs_once(fresh_etcd_server):
    """The consumer is still in the resync hook when the stream fails and comes back. The
    stream must not re-create the compacted watch at its old revision meanwhile (it met the
    compaction again: a second resync, and the first one's events arrived after it, older
    than its anchor)."""
    server = fresh_etcd_server
    gate = asyncio.Event()
    calls: list[int] = []

    async def hook() -> int:
        calls.append(len(calls) + 1)
        await gate.wait()
        revision = (await direct.range("/x/", prefix=True)).revision
        return revision + 1

    with TcpProxy.for_endpoint(server.endpoint) as proxy:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as watcher,
        ):
            watch, items, task = await _watched_then_cut(server, proxy, direct, watcher, hook)
            for i in range(3):
                head = (await direct.put("/x/k", str(i))).revision
            await direct.compact(head)
            proxy.restore()
            deadline = time.monotonic() + 10
            while not calls:
                assert time.monotonic() < deadline, items
                await asyncio.sleep(0.01)
            opened = watcher._watch_hub.streams_opened
            proxy.cut()  # the stream fails while the hook runs
            while watcher._watch_hub.streams_opened == opened:
                assert time.monotonic() < deadline, items
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # long enough for a re-create to meet the compaction
            gate.set()
            while not any(isinstance(i, WatchResynced) for i in items):
                assert time.monotonic() < deadline, items
                await asyncio.sleep(0.01)
            written = [(await direct.put("/x/k", f"a{i}")).revision for i in range(3)]
            while not any(isinstance(i, WatchEvent) and i.revision == written[-1] for i in items):
                assert time.monotonic() < deadline, items
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # anything late
            resynced = [i for i in items if isinstance(i, WatchResynced)]
            assert len(calls) == 1 and len(resynced) == 1, items
            after = [
                i.revision for i in items[items.index(resynced[0]) :] if isinstance(i, WatchEvent)
            ]
            assert after == written, items  # in order, once, none older than the anchor
            assert resynced[0].anchor_revision <= written[0]
            await watch.aclose()
            task.cancel()
            with _suppress():
                await task


async def test_an_idle_watch_is_synced_again_after_a_reconnect(
    ordered_progress, etcd_proxy, etcd_client, etcd_prefix
):
    """Re-creating one revision early must not cost an idle watch its "caught up" status:
    with nothing written since its resume point it is re-created at that point itself, so a
    progress request still advances it (what a cache's ``wait_for_revision`` relies on)."""
    key = etcd_prefix + "idle"
    rev = (await etcd_client.put(key, b"0")).revision
    async with (
        connect(etcd_proxy.url, **FAST) as watcher,
        watcher.watch(key, start_revision=rev + 1) as watch,
    ):
        assert watch.is_synced
        opened = watcher._watch_hub.streams_opened
        etcd_proxy.cut()
        deadline = time.monotonic() + 10
        while watcher._watch_hub.streams_opened == opened or not watch._server_active:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        while not watch.is_synced:
            assert time.monotonic() < deadline, "the re-created idle watch never synced"
            await asyncio.sleep(0.01)
        head = (await etcd_client.put(etcd_prefix + "other", b"x")).revision
        while watch.resume_revision <= head:
            assert time.monotonic() < deadline, watch.resume_revision
            watcher.request_progress()
            await asyncio.sleep(0.05)
        await etcd_client.put(key, b"1")
        event = await asyncio.wait_for(watch.__anext__(), 5)
        assert event.kv.value == b"1"  # and the re-created watch delivers


# ---------------------------------------------------------------------------- the checker itself


def _event(rev: int, key: str, value: bytes | None) -> WatchEvent:
    kind = EventType.PUT if value is not None else EventType.DELETE
    return WatchEvent(kind, KeyValue(key.encode(), value or b"", 0, rev, 1, 0))


def _run(history: dict[int, list[Op]], items: list[object], acked: list[Write]) -> Run:
    run = Run(seed=0, history=history, head=max(history), acked=acked, watch_items=items)
    run.attempted = {w.op for w in acked}
    run.final_state = state_at(history, run.head)
    return run


def test_checker_blames_a_missed_event_on_the_watch():
    history = {2: [("PUT", "/a", b"1")], 3: [("DELETE", "/a", None)], 4: [("PUT", "/b", b"2")]}
    acked = [Write(r, ops[0]) for r, ops in history.items()]
    items = [_event(2, "/a", b"1"), _event(4, "/b", b"2")]  # the DELETE at 3 never came
    verdict = check(_run(history, items, acked))
    assert not verdict.etcd and not verdict.tainted
    assert any("[3] never delivered" in m for m in verdict.ours), verdict
    assert any("mirror differs" in m for m in verdict.ours), verdict


def test_checker_blames_a_lost_committed_write_on_etcd():
    # The watcher was served v1 at revision 3 (acknowledged to the writer too); after a
    # SIGKILL etcd's history holds another write at 3: etcd forgot a committed write and
    # reused its revision. The watch resumed at 4, so it never saw the new revision 3.
    history = {2: [("PUT", "/a", b"0")], 3: [("PUT", "/b", b"v2")], 4: [("PUT", "/a", b"v3")]}
    lost = Write(3, ("PUT", "/a", b"v1"))
    acked = [Write(2, history[2][0]), lost, Write(3, history[3][0]), Write(4, history[4][0])]
    items = [_event(2, "/a", b"0"), _event(3, "/a", b"v1"), _event(4, "/a", b"v3")]
    verdict = check(_run(history, items, acked))
    assert verdict.tainted == {3}
    assert not verdict.ours, verdict
    assert any("two acknowledged writes got revision 3" in m for m in verdict.etcd), verdict


def test_checker_blames_a_duplicate_and_a_stale_resync_on_the_watch():
    history = {2: [("PUT", "/a", b"1")], 3: [("PUT", "/a", b"2")], 4: [("PUT", "/b", b"3")]}
    acked = [Write(r, ops[0]) for r, ops in history.items()]
    run = _run(history, [], acked)
    run.hook_snapshots[4] = {"/a": b"2"}  # read at 3
    run.watch_items = [
        _event(2, "/a", b"1"),
        WatchResynced(b"/", 3, 4),
        _event(3, "/a", b"2"),  # older than the anchor, after the resync
        _event(4, "/b", b"3"),
    ]
    verdict = check(run)
    assert not verdict.etcd
    assert any("revision 3 delivered again" in m for m in verdict.ours), verdict
