"""Lock episode: three processes take turns on one mutex with increasing fencing tokens; then a
holder is paused (SIGSTOP) past its lease, another process takes the lock, and the paused
holder's late, fenced write is rejected by etcd.

Run on its own: ``python -m demo.lock_episode <endpoint>`` (the demo runs it for you).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from etcd_recipes import DistributedMutex, LockLostError, Op, connect

from ._children import reap, spawn

PATH = "/demo/locks/printer"
LAST = "/demo/locks/last-writer"


async def contender(endpoint: str) -> None:
    """A child process: take the lock twice, writing through the fence each time."""
    async with connect(endpoint) as client:
        mutex = DistributedMutex(client, PATH)
        for _ in range(2):
            async with mutex.with_lock() as hold:
                await hold.guarded_txn([Op.put(LAST, str(os.getpid()))])
                print(f"process {os.getpid()} holds the lock, fencing token {hold.fencing_token}")
                sys.stdout.flush()
                await asyncio.sleep(0.1)
        await mutex.aclose()


async def sleeper(endpoint: str) -> None:
    """A child process that will be paused while it holds the lock."""
    async with connect(endpoint) as client:
        mutex = DistributedMutex(client, PATH, lease_ttl=2)
        fence = None
        try:
            async with mutex.with_lock() as hold:
                fence, token = hold.compare(), hold.fencing_token
                print(f"process {os.getpid()} holds the lock with token {token}", flush=True)
                await asyncio.sleep(3)  # SIGSTOP lands here; the body goes on after SIGCONT
        except LockLostError:
            print("it wakes up: the lock was lost, its body is cancelled (LockLostError)")
        # A zombie that ignores the signal and writes anyway is stopped by the fence:
        assert fence is not None
        late = await client.txn([fence], [Op.put(LAST, "the paused process")])
        verdict = "COMMITTED" if late.succeeded else "rejected by etcd"
        print(f"its stale write guarded by token {token}: {verdict}", flush=True)
        await mutex.aclose()


async def episode(endpoint: str, say: Callable[[str], None]) -> None:
    say(f"mutex: 3 processes take turns on {PATH}")
    procs = [await spawn("demo.lock_episode", "--contender", endpoint) for _ in range(3)]

    async def lines(proc: asyncio.subprocess.Process) -> list[tuple[float, str]]:
        assert proc.stdout is not None
        return [(time.monotonic(), raw.decode().rstrip()) async for raw in proc.stdout]

    try:
        outputs = await asyncio.gather(*(lines(p) for p in procs))
    finally:
        await reap(*procs)
    for _, line in sorted(entry for out in outputs for entry in out):
        say("  " + line)

    paused = await spawn("demo.lock_episode", "--sleeper", endpoint)
    try:
        assert paused.stdout is not None
        say("  " + (await paused.stdout.readline()).decode().rstrip())
        os.kill(paused.pid, signal.SIGSTOP)
        say("that holder is paused (SIGSTOP) past its 2 s lease ...")
        async with connect(endpoint) as client:
            mutex = DistributedMutex(client, PATH)
            async with mutex.with_lock() as hold:
                await hold.guarded_txn([Op.put(LAST, "the new holder")])
                say(f"  this process took the lock (token {hold.fencing_token}) and wrote")
                os.kill(paused.pid, signal.SIGCONT)
                say("the paused holder resumes (SIGCONT)")
                async for raw in paused.stdout:
                    say("  " + raw.decode().rstrip())
            await mutex.aclose()
            writer = await client.get(LAST)
            assert writer is not None
            say(f"last writer: {writer.text!r} -- fencing kept the stale write out")
    finally:
        await reap(paused)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the demo narrates; keep library warnings quiet
    if len(sys.argv) == 3 and sys.argv[1] == "--contender":
        asyncio.run(contender(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--sleeper":
        asyncio.run(sleeper(sys.argv[2]))
    elif len(sys.argv) == 2:
        asyncio.run(episode(sys.argv[1], print))
    else:
        sys.exit("usage: python -m demo.lock_episode <endpoint>")


if __name__ == "__main__":
    main()
