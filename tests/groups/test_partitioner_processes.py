"""Five real partitioner processes, SIGKILLs and joins: a watcher replays every owner-key
event and every fenced write, and checks at every revision that no item has two owners and
that every committed write came from the item's owner of that moment, with its token; and
eventually every item has exactly one owner among the live members."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from etcd_recipes import EventType
from etcd_recipes.groups._assign import owner_of
from tests.helpers import eventually

HELPER = Path(__file__).with_name("proc_partitioner.py")
ITEMS = [f"shard-{i:02d}" for i in range(20)]


class Replay:
    """The owner of each item at the watcher's revision, and what broke the rules."""

    def __init__(self, path: str, writes: str) -> None:
        self.owners_prefix = f"{path}/owners/"
        self.writes_prefix = f"{writes}/"
        self.owners: dict[str, tuple[str, int]] = {}  # item -> (member, create revision)
        self.violations: list[str] = []
        self.writes = 0
        self.writers: dict[str, set[str]] = {}  # item -> members whose fenced writes landed
        self.revision = 0

    def apply(self, event) -> None:
        self.revision = event.revision
        key = event.kv.key_text
        if key.startswith(self.owners_prefix):
            item = key[len(self.owners_prefix) :]
            if event.type is EventType.DELETE:
                self.owners.pop(item, None)
                return
            member, created = event.kv.value.decode(), event.kv.create_revision
            held = self.owners.get(item)
            if held is not None and held != (member, created):
                self.violations.append(f"@{event.revision} {item}: {member} over {held}")
            if held is None and event.kv.version != 1:
                self.violations.append(f"@{event.revision} {item}: modified, not created")
            self.owners[item] = (member, created)
        elif key.startswith(self.writes_prefix):
            item = key[len(self.writes_prefix) :]
            member, token, _ = event.kv.value.decode().split(":")
            if self.owners.get(item) != (member, int(token)):
                self.violations.append(
                    f"@{event.revision} {item}: written by {member}:{token}, "
                    f"owner {self.owners.get(item)}"
                )
            self.writes += 1
            self.writers.setdefault(item, set()).add(member)


@pytest.mark.slow
async def test_five_processes_with_sigkills_and_joins(etcd_client, etcd_server, etcd_prefix):
    path, writes = etcd_prefix + "p", etcd_prefix + "w"
    replay = Replay(path, writes)
    start = (await etcd_client.status()).revision + 1
    procs: dict[str, subprocess.Popen[str]] = {}

    async def watcher() -> None:
        async with etcd_client.watch(etcd_prefix, prefix=True, start_revision=start) as watch:
            async for event in watch:
                replay.apply(event)

    def spawn(member: str) -> None:
        procs[member] = subprocess.Popen(
            [
                sys.executable,
                str(HELPER),
                etcd_server.endpoint,
                path,
                member,
                ",".join(ITEMS),
                writes,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])},
        )

    async def started(member: str) -> None:
        out = procs[member].stdout
        assert out is not None
        line = await asyncio.wait_for(asyncio.to_thread(out.readline), 60)
        assert json.loads(line) == {"started": member}

    def kill(member: str) -> None:
        os.kill(procs.pop(member).pid, signal.SIGKILL)

    async def converged() -> bool:
        live = sorted(procs)
        start_at = len(replay.owners_prefix)
        on_server = {
            kv.key_text[start_at:]: kv.value.decode()
            for kv in await etcd_client.get_prefix(replay.owners_prefix)
        }
        return on_server == {item: owner_of(item, live) for item in ITEMS}

    watching = asyncio.create_task(watcher())
    killed: list[subprocess.Popen[str]] = []
    try:
        for i in range(5):
            spawn(f"m{i}")
        for i in range(5):
            await started(f"m{i}")
        await eventually(converged, timeout=30, what="five members converged")
        for member in ("m1", "m3"):
            killed.append(procs[member])
            kill(member)
        await eventually(converged, timeout=30, what="converged after two SIGKILLs")
        for member in ("m5", "m6"):
            spawn(member)
            await started(member)
        await eventually(converged, timeout=30, what="converged after two joins")
        killed.append(procs["m0"])
        kill("m0")
        spawn("m7")
        await started("m7")
        await eventually(converged, timeout=30, what="converged after a kill and a join")
        await asyncio.sleep(0.5)  # fenced writes of the final owners
        head = (await etcd_client.put(f"{etcd_prefix}sentinel", b"end")).revision
        await eventually(lambda: replay.revision >= head, what="the watcher caught up")
        assert replay.violations == []
        assert replay.writes > 100
        handed_over = [item for item, members in replay.writers.items() if len(members) > 1]
        assert handed_over  # items changed hands, and their writes stayed fenced
        assert {m for ms in replay.writers.values() for m in ms} >= set(procs)
    finally:
        watching.cancel()
        for proc in [*procs.values(), *killed]:
            proc.kill()
            proc.wait()
