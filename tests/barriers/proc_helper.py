"""Child processes for the multi-process barrier tests.

Usage: ``python proc_helper.py barrier ENDPOINT PATH PROC K N`` -- K members of a
DistributedBarrierWithCount of N (client ids ``p<PROC>-m<i>``); prints JSON lines
``{"arrived": id, "t"}`` and ``{"released": id, "ok", "t"}`` (``time.monotonic()`` stamps,
system-wide on Linux) and never writes to stderr on success.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from etcd_recipes import DistributedBarrierWithCount, connect


def emit(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


async def barrier(endpoint: str, path: str, proc: str, k: str, n: str) -> None:
    async with connect(endpoint) as client:

        async def member(i: int) -> None:
            cid = f"p{proc}-m{i}"
            async with DistributedBarrierWithCount(client, path, int(n), client_id=cid) as b:
                emit(arrived=cid, t=time.monotonic())
                ok = await b.wait_on_barrier(timeout=30)
                emit(released=cid, ok=ok, t=time.monotonic())

        await asyncio.gather(*(member(i) for i in range(int(k))))


def main() -> int:
    mode, *args = sys.argv[1:]
    runner = {"barrier": barrier}[mode]
    asyncio.run(runner(*args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
