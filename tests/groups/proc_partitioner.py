"""A partitioner process for the groups tests.

Usage: ``python proc_partitioner.py ENDPOINT PATH MEMBER_ID ITEMS WRITES`` -- runs a
SetPartitioner of the comma-separated ITEMS as MEMBER_ID; while it owns an item it writes
``<WRITES>/<item>`` = ``<member>:<fencing token>:<n>`` every 20 ms, each write guarded by the
item's fencing token. Prints ``{"started": MEMBER_ID}`` once started, and lives until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from etcd_recipes import Cmp, EtcdRecipeError, ItemAssigned, Op, SetPartitioner, connect


async def main(endpoint: str, path: str, member: str, items: str, writes: str) -> None:
    async with connect(endpoint, keepalive_time=1, keepalive_timeout=0.5) as client:
        partitioner = SetPartitioner(client, path, items.split(","), member_id=member)
        events = partitioner.events()
        writers: dict[str, asyncio.Task[None]] = {}

        async def write(item: str, token: int) -> None:
            guard = Cmp.create_revision(partitioner.owner_key(item)) == token
            n = 0
            while True:
                n += 1
                try:
                    await client.txn([guard], [Op.put(f"{writes}/{item}", f"{member}:{token}:{n}")])
                except EtcdRecipeError:
                    pass
                await asyncio.sleep(0.02)

        async with partitioner:
            print(json.dumps({"started": member}), flush=True)
            async for event in events:
                if isinstance(event, ItemAssigned):
                    writers[event.item] = asyncio.create_task(
                        write(event.item, event.fencing_token)
                    )
                else:
                    task = writers.pop(event.item, None)
                    if task is not None:
                        task.cancel()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
