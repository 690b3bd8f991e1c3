"""Helpers shared by the queue tests."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from etcd_recipes import EtcdClient


async def keys(client: EtcdClient, prefix: str) -> list[str]:
    """Every key under ``prefix`` (sorted), as text."""
    return [kv.key_text for kv in await client.get_prefix(prefix)]


async def server_leases(client: EtcdClient) -> set[int]:
    """The ids of the leases that exist on the server (a raw LeaseLeases call)."""
    from aetcd import rpc as pb

    stub = pb.LeaseStub(client._channel_or_raise())
    resp = await stub.LeaseLeases(pb.LeaseLeasesRequest(), metadata=client._runner.metadata())
    return {int(lease.ID) for lease in resp.leases}


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c script args...`` with its output piped."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> Any:
    """Wait for ``proc`` to exit 0 and return the JSON on its last output line."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])
