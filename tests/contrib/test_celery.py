"""etcd_recipes.contrib.celery with real Celery processes: 3 workers and 2 beats over kombu's
redis transport, served by a fakeredis TCP server the test starts (no Redis install), and a
real etcd. The singleton lock holder and the beat
leader are SIGKILLed mid-run: runs never overlap (fenced writes whose terms never overlap in
etcd's order), duplicates are retried rather than dropped, and the beat schedule's largest gap
stays near interval + TTL."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etcd_recipes import EtcdClient, connect
from etcd_recipes.testing._process import free_ports
from tests.contrib.snippets import snippet
from tests.helpers import eventually

pytest.importorskip("celery")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("celery")]

INTERVAL = 1.0
TTL = 2

TASKS = snippet("integrations.md", "tasks.py")


def _spawn(tmp_path: Path, env: dict[str, str], *args: str, log: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / log, "wb"),
        start_new_session=True,
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    for proc in procs:
        proc.wait(10)


async def _kvs(client: EtcdClient, prefix: str):
    return (await client.get_prefix(prefix)).kvs


FAKE_REDIS = """
import sys
from fakeredis import TcpFakeServer
TcpFakeServer(("127.0.0.1", int(sys.argv[1])), server_type="redis").serve_forever()
"""


async def test_singleton_and_beat_failover(etcd_server, etcd_prefix, tmp_path):
    pytest.importorskip("fakeredis")
    (port,) = free_ports(1)
    broker = f"redis://127.0.0.1:{port}/0"
    (tmp_path / "tasks.py").write_text(TASKS)
    env = dict(os.environ, ETCD_ENDPOINTS=etcd_server.endpoint, APP_PREFIX=etcd_prefix)
    env.update(APP_BROKER=broker, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    worker_args = ["worker", "--pool=solo", "--without-heartbeat", "--without-gossip"]
    worker_args += ["--without-mingle", "--loglevel=WARNING"]
    redis_server = subprocess.Popen([sys.executable, "-c", FAKE_REDIS, str(port)])
    procs = [redis_server] + [
        _spawn(tmp_path, env, *worker_args, f"-n=w{i}@%h", log=f"worker{i}.log") for i in range(3)
    ]
    for i in range(2):
        procs.append(
            _spawn(
                tmp_path,
                env,
                "beat",
                "--scheduler=etcd_recipes.contrib.celery:LeaderScheduler",
                f"--schedule={tmp_path}/beat{i}.db",
                "--loglevel=INFO",
                log=f"beat{i}.log",
            )
        )
    try:
        async with connect(etcd_server.endpoint) as client:
            await eventually(
                lambda: _count_at_least(client, f"{etcd_prefix}probe/", 3),
                timeout=60,
                what="the beat's probes running",
            )
            # Duplicates are retried, not dropped: three copies sent at once all run, in turn.
            from celery import Celery

            sender = Celery("tasks", broker=broker)
            for tag in ("dup-a", "dup-b", "dup-c"):
                sender.send_task("tasks.work", kwargs={"tag": tag})
            await eventually(
                lambda: _count_at_least(client, f"{etcd_prefix}done/", 3),
                timeout=30,
                what="three duplicates run",
            )

            # SIGKILL the singleton's holder while it runs (its lease frees the lock in TTL).
            await eventually(
                lambda: _writing_now(client, f"{etcd_prefix}work/"), what="a run in progress"
            )
            holder = int((await _kvs(client, f"{etcd_prefix}work/"))[-1].value.split(b":")[0])
            os.kill(holder, signal.SIGKILL)
            # SIGKILL the beat leader.
            leader = await client.get(f"{etcd_prefix}beat/leader/LEADER")
            assert leader is not None
            beat_pid = int(leader.value.decode().split(":")[0].rsplit("-", 1)[1])
            os.kill(beat_pid, signal.SIGKILL)
            killed_at = time.time()

            async def runs_after_kill() -> bool:
                probes = await _kvs(client, f"{etcd_prefix}probe/")
                return (
                    sum(float(kv.key.decode().rsplit("/", 1)[1]) > killed_at + 1 for kv in probes)
                    >= 3
                )

            await eventually(runs_after_kill, timeout=30, what="the new beat leader's probes")
            probes = sorted(
                float(kv.key.decode().rsplit("/", 1)[1])
                for kv in await _kvs(client, f"{etcd_prefix}probe/")
            )
            gaps = [b - a for a, b in itertools.pairwise(probes)]
            print(f"largest probe gap {max(gaps):.2f}s (interval {INTERVAL}s, TTL {TTL}s)")
            # The longest gap a correct failover leaves: the last probe came up to INTERVAL
            # before the kill; the lease lives up to TTL after its last renewal plus etcd's
            # expiry slack (up to 0.5 s); the standby beat sees its win at its next tick (every
            # 1 s); then the task is queued and run (allow 0.5 s on a loaded box).
            assert max(gaps) < INTERVAL + TTL + 0.5 + 1.0 + 0.5, gaps
            terms = await _kvs(client, f"{etcd_prefix}work/")
            assert len(terms) >= 5
            for older, newer in itertools.pairwise(terms):
                assert older.mod_revision < newer.create_revision, (older, newer)
    finally:
        _stop(procs)


async def _count_at_least(client: EtcdClient, prefix: str, n: int) -> bool:
    return await client.count(prefix) >= n


async def _writing_now(client: EtcdClient, prefix: str) -> bool:
    terms = await _kvs(client, prefix)
    if not terms:
        return False
    before = terms[-1].mod_revision
    await asyncio.sleep(0.15)
    terms = await _kvs(client, prefix)
    return terms[-1].mod_revision != before
