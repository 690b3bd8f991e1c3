"""``etcd-recipes lock run`` whose connection to etcd is paused past the lock's TTL: the lock is
lost, so its command is terminated (SIGTERM, then SIGKILL after ``--grace``), the command exits
with the error code, and another holder gets the lock -- unlike ``etcdctl lock``, whose command
runs on unlocked. A real etcd behind a fault proxy that stops forwarding bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("typer")

from etcd_recipes import DistributedMutex, connect
from etcd_recipes.cli import Exit
from etcd_recipes.testing import TcpProxy

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sh")


async def test_a_paused_connection_past_the_ttl_kills_the_command(
    etcd_server, etcd_prefix, tmp_path
) -> None:
    path = f"{etcd_prefix}paused"
    marker = tmp_path / "child.pid"
    script = f"echo $$ > {marker}; while true; do sleep 0.1; done"  # ignores nothing: TERM ends it
    proxy = TcpProxy.for_endpoint(etcd_server.endpoint).start()
    try:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "etcd_recipes.cli", "--endpoints", proxy.endpoint),
                *("lock", "run", path, "--ttl", "2", "--grace", "1", "--", "sh", "-c", script),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text().strip():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        child = int(marker.read_text())
        async with connect(**etcd_server.client_kwargs()) as client:
            mutex = DistributedMutex(client, path)
            assert not await mutex.acquire(timeout=0.5)  # lock run holds it
            proxy.blackhole()  # the holder's connection hangs: no renewal reaches etcd
            # Lost within the TTL (2 s) plus a keep-alive interval; generous for a loaded CI.
            code = proc.wait(30)
            err = proc.stderr.read() if proc.stderr else ""
            assert code == Exit.ERROR, err
            assert "lock lost" in err, err
            with pytest.raises(ProcessLookupError):
                os.kill(child, 0)  # the command is gone, not running on unlocked
            assert await mutex.acquire(timeout=10)  # and the lock is free for another holder
            await mutex.release()
            await mutex.aclose()
    finally:
        proxy.stop()
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
