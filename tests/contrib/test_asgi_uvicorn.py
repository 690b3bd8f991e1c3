"""etcd_recipes.contrib.asgi under ``uvicorn --workers 4``: real worker processes on loopback,
a real etcd. Exactly one worker runs the leader-only job at a time (proven by fenced writes
whose terms never overlap in etcd's order), a SIGKILLed leader is replaced within TTL + 2 s,
a SIGTERMed one hands over at once, and a per-tick schedule runs each tick exactly once."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etcd_recipes import EtcdClient, connect, get_participants
from tests.contrib.snippets import snippet
from tests.helpers import eventually

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("uvicorn")]

APP = snippet("integrations.md", "app.py")


def _start(tmp_path: Path, endpoint: str, prefix: str) -> subprocess.Popen[bytes]:
    (tmp_path / "app.py").write_text(APP)
    env = dict(os.environ, ETCD_ENDPOINTS=endpoint, APP_PREFIX=prefix, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app:app",
            "--workers",
            "4",
            "--port",
            "0",  # any free port: the test talks to etcd, not HTTP (no race for a chosen one)
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "uvicorn.log", "wb"),
        start_new_session=True,
    )


def _alive(proc: subprocess.Popen[bytes], tmp_path: Path) -> bool:
    """True while uvicorn runs; a failed start fails the test at once, with its log."""
    if proc.poll() is not None:
        log = (tmp_path / "uvicorn.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"uvicorn exited with {proc.returncode}:\n{log}")
    return True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


async def _terms(client: EtcdClient, prefix: str):
    return (await client.get_prefix(f"{prefix}log/")).kvs


def _assert_no_overlap(terms) -> None:
    for older, newer in itertools.pairwise(terms):
        assert older.mod_revision < newer.create_revision, (older, newer)


async def test_four_uvicorn_workers(etcd_server, etcd_prefix, tmp_path):
    proc = _start(tmp_path, etcd_server.endpoint, etcd_prefix)
    try:
        async with connect(etcd_server.endpoint) as client:

            async def four_candidates() -> bool:
                return len(await get_participants(client, f"{etcd_prefix}el")) == 4

            await eventually(
                lambda: _alive(proc, tmp_path) and four_candidates(),
                timeout=60,
                what="4 workers campaigning",
            )
            await _each_tick_once(client, etcd_prefix, tmp_path)
            await eventually(lambda: _terms(client, etcd_prefix), what="a leader writing")
            leader = int((await _terms(client, etcd_prefix))[-1].value)

            # SIGKILL: nobody steps down; the term ends when its lease expires (TTL 2 s).
            os.kill(leader, signal.SIGKILL)
            killed_at = time.monotonic()

            async def new_leader_writing() -> bool:
                terms = await _terms(client, etcd_prefix)
                return int(terms[-1].value) != leader

            await eventually(new_leader_writing, timeout=10, what="a new leader")
            takeover = time.monotonic() - killed_at
            assert takeover < 2 + 2, f"takeover after SIGKILL took {takeover:.2f}s"

            # SIGTERM: a graceful shutdown steps down at once. Measure etcd's view: the
            # LEADER key's deletion and the next leader's creation, as a watcher sees them.
            second = int((await _terms(client, etcd_prefix))[-1].value)
            seen: list[tuple[str, float]] = []
            watch = client.watch(f"{etcd_prefix}el/LEADER")

            async def record() -> None:
                async for event in watch:
                    seen.append((event.type.name, time.monotonic()))

            recorder = asyncio.create_task(record())
            await asyncio.sleep(0.2)  # the watch is registered
            os.kill(second, signal.SIGTERM)
            await eventually(
                lambda: any(t == "DELETE" for t, _ in seen) and seen[-1][0] == "PUT",
                timeout=10,
                what="the LEADER key deleted and recreated",
            )
            recorder.cancel()
            deleted = next(at for t, at in seen if t == "DELETE")
            created = next(at for t, at in seen if t == "PUT" and at >= deleted)
            handover = created - deleted
            print(
                f"handover after SIGTERM: {handover * 1000:.1f} ms; after SIGKILL {takeover:.2f} s"
            )
            assert handover < 0.25, f"graceful handover took {handover * 1000:.0f} ms"
            await eventually(
                lambda: _third_writing(client, etcd_prefix, {leader, second}),
                what="the third leader writing",
            )
            _assert_no_overlap(await _terms(client, etcd_prefix))
    finally:
        _stop(proc)


async def _third_writing(client: EtcdClient, prefix: str, old: set[int]) -> bool:
    terms = await _terms(client, prefix)
    return int(terms[-1].value) not in old


def _explained(slot: int, log: str) -> bool:
    """Whether the workers' log says why ``slot`` did not run: every worker was late past it
    (``skipped slots a..b (late)``) or its claim failed -- what the schedule does not
    guarantee (see etcd_recipes.contrib.asgi)."""
    for a, b in re.findall(r"skipped slots (\d+)\.\.(\d+) \(late\)", log):
        if int(a) <= slot <= int(b):
            return True
    return f"could not claim slot {slot}" in log


async def _each_tick_once(client: EtcdClient, prefix: str, tmp_path: Path) -> None:
    """100 ticks of the 0.1 s schedule: each slot run by at most one worker, and every slot
    run unless the workers' log says they were all late past it (a loaded CI box: the
    contract does not promise those)."""
    first_slot = int(time.time() / 0.1) + 2
    await asyncio.sleep(0.1 * 104)
    runs = (await client.get_prefix(f"{prefix}runs/")).kvs
    by_slot: dict[int, list[str]] = {}
    for kv in runs:
        slot, pid = kv.key.decode().split("/")[-2:]
        by_slot.setdefault(int(slot), []).append(pid)
    window = range(first_slot, first_slot + 100)
    twice = {s: p for s, p in by_slot.items() if len(p) > 1}
    missing = [s for s in window if s not in by_slot]
    assert not twice, f"slots run more than once: {twice}"
    log = (tmp_path / "uvicorn.log").read_text(errors="replace")
    unexplained = [s for s in missing if not _explained(s, log)]
    assert not unexplained, f"slots never run, and no worker said why: {unexplained}\n{log[-3000:]}"
    assert len(missing) <= 10, f"too many slots skipped as late: {missing}"
    assert len({p for s in window for p in by_slot.get(s, [])}) > 1, "one worker ran every tick"
