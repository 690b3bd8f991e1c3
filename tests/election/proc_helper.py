"""Child processes for the multi-process election tests.

Usage: ``python proc_helper.py MODE ENDPOINT PATH [ARGS...]``. Every mode prints JSON lines on
stdout (``{"ready": ...}`` first where a parent waits for it) and never writes to stderr on
success.

* ``terms ENDPOINT PATH PROC N SECONDS`` -- N LeaderSelectors (client ids ``p<PROC>-c<i>``)
  contend for SECONDS; every term is printed as ``{"id", "token", "start", "end"}`` with
  ``time.monotonic()`` stamps (system-wide on Linux), taken where the selector believes it
  leads: on entry of ``take_leadership`` and just before it returns.
* ``latch ENDPOINT PATH CLIENT_ID TTL`` -- one LeaderLatch; prints ``{"ready": id}``, then
  ``{"leader": id, "token", "t"}`` whenever it wins; runs until killed.
* ``sync-latch ENDPOINT PATH`` / ``sync-selector ENDPOINT PATH`` -- the blocking facade, parked
  in ``await_leadership()`` / ``run()`` while the parent leads; on SIGINT prints (from the
  ``KeyboardInterrupt`` handler) what etcd holds for this candidate, then ``exited``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import threading
import time
from typing import Any

from etcd_recipes import LeaderLatch, LeaderSelector, LeadershipLostError, LeadershipTerm, connect
from etcd_recipes.sync import LeaderLatch as SyncLeaderLatch
from etcd_recipes.sync import LeaderSelector as SyncLeaderSelector
from etcd_recipes.sync import connect as sync_connect


def emit(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


async def terms(endpoint: str, path: str, proc: str, n: str, seconds: str) -> None:
    async with connect(endpoint) as client:

        async def candidate(i: int) -> None:
            cid = f"p{proc}-c{i}"
            selector: LeaderSelector

            async def take_leadership(term: LeadershipTerm) -> None:
                start = time.monotonic()
                assert selector.is_leader and term.is_current
                try:
                    await asyncio.sleep(random.uniform(0.01, 0.04))
                finally:
                    end = time.monotonic()
                    emit(id=cid, token=term.fencing_token, start=start, end=end)

            selector = LeaderSelector(client, path, take_leadership, client_id=cid)
            deadline = time.monotonic() + float(seconds)
            async with selector:
                while time.monotonic() < deadline:
                    with contextlib.suppress(LeadershipLostError):
                        await selector.run()

        await asyncio.gather(*(candidate(i) for i in range(int(n))))


async def latch(endpoint: str, path: str, cid: str, ttl: str) -> None:
    async with connect(endpoint) as client:
        async with LeaderLatch(client, path, client_id=cid, lease_ttl=int(ttl)) as lt:
            lt.add_leadership_listener(
                lambda leading: (
                    leading and emit(leader=cid, token=lt.fencing_token, t=time.monotonic())
                )
            )
            emit(ready=cid)
            await asyncio.Event().wait()


def sync_candidate(mode: str, endpoint: str, path: str) -> int:
    cid = mode
    with sync_connect(endpoint) as client:

        def evidence() -> None:
            participant = client.get(path + "/participants/" + cid)
            leader = client.get(path + "/LEADER")
            emit(
                participant=participant is not None,
                leader=None if leader is None else leader.text,
                mine=leader is not None and leader.text.startswith(cid + ":"),
                threads=len(threading.enumerate()),
            )

        try:
            if mode == "sync-latch":
                with SyncLeaderLatch(client, path, client_id=cid) as lt:
                    emit(ready=cid)
                    lt.await_leadership()
            else:

                def take_leadership(term: LeadershipTerm) -> None:
                    emit(unexpected="elected")

                selector = SyncLeaderSelector(client, path, take_leadership, client_id=cid)
                emit(ready=cid)
                selector.run()
        except KeyboardInterrupt:
            evidence()
            print("exited", flush=True)
            return 130
    return 0


def main() -> int:
    mode, *args = sys.argv[1:]
    if mode.startswith("sync-"):
        return sync_candidate(mode, *args)
    runner = {"terms": terms, "latch": latch}[mode]
    asyncio.run(runner(*args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
