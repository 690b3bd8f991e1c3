"""A registrant process for the discovery tests.

Usage: ``python proc_helper.py ENDPOINT SERVICE_PATH NAME PORT [TTL]`` -- registers one
instance of NAME at 127.0.0.1:PORT, prints ``{"id": ..., "key": ...}`` once registered, and
lives until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from etcd_recipes import ServiceInstance, ServiceRegistry, connect


async def main(endpoint: str, path: str, name: str, port: str, ttl: str = "2") -> None:
    async with (
        connect(endpoint) as client,
        ServiceRegistry(client, path, lease_ttl=int(ttl)) as reg,
    ):
        me = ServiceInstance(name, "", address="127.0.0.1", port=int(port))
        await reg.register(me)
        print(json.dumps({"id": me.id, "key": reg.key_of(me)}), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
