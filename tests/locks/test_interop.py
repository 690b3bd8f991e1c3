"""Interoperability: the mutex and the real ``etcdctl lock`` (Go's ``concurrency.Mutex``)
exclude each other in both orders; so do the mutex and etcd's lock service (``server_lock``)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import pytest

from etcd_recipes import (
    DistributedMutex,
    InvalidArgumentError,
    LockTimeoutError,
    server_lock,
    server_unlock,
)
from etcd_recipes._proto import v3lock
from etcd_recipes.testing import find_etcdctl_binary

from .helpers import keys, queued


def _etcdctl_lock(etcd_server, path: str, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [find_etcdctl_binary(), "--endpoints", etcd_server.url, "lock", "--", path, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _readline(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return await asyncio.to_thread(proc.stdout.readline)


async def test_etcdctl_waits_while_the_mutex_holds(etcd_server, etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    await mutex.acquire()
    proc = _etcdctl_lock(etcd_server, path, "sh", "-c", "echo got-it")
    try:
        await queued(etcd_client, path + "/", 2)  # etcdctl queued behind us, same layout
        await asyncio.sleep(0.5)
        assert proc.poll() is None  # still waiting
        released = time.monotonic()
        await mutex.release()
        assert await _readline(proc) == "got-it\n"
        assert time.monotonic() - released < 2
        await asyncio.to_thread(proc.wait, 10)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    await mutex.aclose()


async def test_mutex_waits_while_etcdctl_holds(etcd_server, etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    proc = _etcdctl_lock(etcd_server, path, "sh", "-c", "echo locked; sleep 1.5; echo done")
    try:
        assert await _readline(proc) == "locked\n"
        assert not await mutex.acquire(timeout=0.5)
        assert await mutex.acquire(timeout=10)
        assert await _readline(proc) == "done\n"  # etcdctl finished before we got it
        await asyncio.to_thread(proc.wait, 10)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert await mutex.release()
    await mutex.aclose()


async def test_server_lock_and_mutex_exclude_each_other(etcd_client, etcd_prefix):
    path = etcd_prefix + "m"
    mutex = DistributedMutex(etcd_client, path)
    async with etcd_client.lease(10) as lease:
        await mutex.acquire()
        with pytest.raises(LockTimeoutError):
            await server_lock(etcd_client, path, lease.id, timeout=0.5)
        assert len(await keys(etcd_client, path + "/")) == 1  # its waiter key was removed
        await mutex.release()
        key = await server_lock(etcd_client, path, lease.id, timeout=5)
        assert key == f"{path}/{lease.id:x}".encode()
        assert not await mutex.acquire(timeout=0.5)
        waiting = asyncio.create_task(mutex.acquire())
        await asyncio.sleep(0.2)
        await server_unlock(etcd_client, key)
        assert await asyncio.wait_for(waiting, 5)
        await server_unlock(etcd_client, key)  # idempotent
    await mutex.aclose()


async def test_server_lock_with_namespace(etcd_server, etcd_prefix):
    from etcd_recipes import connect

    async with connect(**etcd_server.client_kwargs(), namespace=etcd_prefix) as client:
        async with client.lease(5) as lease:
            key = await server_lock(client, "job", lease.id, timeout=5)
            assert key == f"job/{lease.id:x}".encode()
            assert await client.get(key) is not None
            await server_unlock(client, key)
            assert await client.get(key) is None


async def test_server_lock_rejects_lease_zero(etcd_client, etcd_prefix):
    for bad in (0, -5, True):
        with pytest.raises(InvalidArgumentError, match="60 s"):
            await server_lock(etcd_client, etcd_prefix + "m", bad)
    assert await keys(etcd_client, etcd_prefix) == []


def test_runtime_descriptors_match_the_vendored_proto():
    text = (Path(v3lock.__file__).parent / "v3lock.proto").read_text()
    proto: dict[str, list[tuple[str, int]]] = {}
    for name, body in re.findall(r"message (\w+) \{(.*?)\n\}", text, re.S):
        proto[name] = [(f, int(n)) for f, n in re.findall(r"\b(\w+) = (\d+);", body)]
    built = {m: [(f, n) for f, n, _, _ in fields] for m, fields in v3lock.FIELDS.items()}
    assert proto == built
    assert re.search(r"package v3lockpb;", text) and v3lock.PACKAGE == "v3lockpb"
    rpcs = set(re.findall(r"rpc (\w+)\((\w+)\) returns \((\w+)\)", text))
    assert rpcs == {
        ("Lock", "LockRequest", "LockResponse"),
        ("Unlock", "UnlockRequest", "UnlockResponse"),
    }
