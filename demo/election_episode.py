"""Election episode: three candidate processes run a LeaderLatch on one path; an observer in
the demo process prints who leads; the leader's process is SIGKILLed and a successor takes
over within the lease TTL, with a larger fencing token.

Run on its own: ``python -m demo.election_episode <endpoint>`` (the demo runs it for you).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

from etcd_recipes import Elected, LeaderLatch, LeaderObserver, connect

from ._children import reap, spawn

PATH = "/demo/elections/scheduler"
TTL = 2


async def candidate(endpoint: str, name: str) -> None:
    """A child process: campaign until terminated (or killed)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with (
        connect(endpoint) as client,
        LeaderLatch(client, PATH, client_id=name, lease_ttl=TTL),
    ):
        print("ready", flush=True)
        await stop.wait()


async def episode(endpoint: str, say: Callable[[str], None]) -> None:
    names = ["candidate-a", "candidate-b", "candidate-c"]
    procs = {
        name: await spawn("demo.election_episode", "--candidate", endpoint, name) for name in names
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            await proc.stdout.readline()  # "ready"
        say(f"election: {len(procs)} candidate processes campaign on {PATH}")
        async with connect(endpoint) as client, LeaderObserver(client, PATH) as observer:
            leaders: list[Elected] = []
            async for event in observer.events():
                if isinstance(event, Elected):
                    say(f"observer: {event.leader} leads (fencing token {event.fencing_token})")
                    leaders.append(event)
                    if len(leaders) == 1:
                        victim = procs[event.leader]
                        victim.send_signal(signal.SIGKILL)
                        say(f"SIGKILL {event.leader} (pid {victim.pid}); lease lapses in {TTL} s")
                    else:
                        say("a new leader took over; the old token can no longer fence writes")
                        break
                else:
                    say("observer: nobody leads")
    finally:
        await reap(*procs.values())


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the demo narrates; keep library warnings quiet
    if len(sys.argv) == 4 and sys.argv[1] == "--candidate":
        asyncio.run(candidate(sys.argv[2], sys.argv[3]))
    elif len(sys.argv) == 2:
        asyncio.run(episode(sys.argv[1], print))
    else:
        sys.exit("usage: python -m demo.election_episode <endpoint>")


if __name__ == "__main__":
    main()
