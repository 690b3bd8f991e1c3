"""``semaphore release`` (issue 32 item 13): an operator's force release of one holder's
permits, tried against an etcd that also holds other data -- a held mutex, a counter, plain
keys next to the semaphore's and a key on the holder's own lease. A refusal, a dry run and an
unknown holder write nothing (every key under the test prefix is read before and after, with
its mod revision); a release deletes only that holder's key, so the waiter gets the permit and
the holder's instance sees it lost, and every other key and the holder's lease stay."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("typer")

from etcd_recipes import (
    DistributedAtomicLong,
    DistributedMutex,
    DistributedSemaphore,
    EtcdClient,
    connect,
)
from etcd_recipes.cli import Exit

from .proc import one_line_error, run_cli
from .schema import assert_valid


async def snapshot(client: EtcdClient, prefix: str) -> dict[bytes, tuple[bytes, int]]:
    read = await client.get_prefix(prefix)
    return {kv.key: (kv.value, kv.mod_revision) for kv in read.kvs}


async def cli(endpoint: str, *args: str):
    return await asyncio.to_thread(run_cli, "--endpoints", endpoint, *args)


async def test_release_frees_only_the_holders_key(etcd_server, etcd_prefix) -> None:
    path, ep = f"{etcd_prefix}uploads", etcd_server.endpoint
    async with connect(ep) as a, connect(ep) as b:
        first = DistributedSemaphore(a, path, 1, client_id="up-1")
        second = DistributedSemaphore(b, path, 1, client_id="up-2")
        assert await first.acquire()
        lost = first.permit_lost_events()
        waiting = asyncio.create_task(second.acquire(timeout=60))
        while len(await second.contenders()) < 2:
            await asyncio.sleep(0.05)
        [held] = await first.holders()
        # Other data, some of it named like the semaphore's keys, one on the holder's lease.
        await a.put(f"{path}/config", b"mode=blue")
        await a.put(f"{path}x/holders/up-1:abc", b"up-1")
        await a.put(f"{etcd_prefix}on-lease", b"x", lease=held.lease_id)
        await DistributedAtomicLong(a, f"{etcd_prefix}n").add(3)
        mutex = DistributedMutex(a, f"{etcd_prefix}lk")
        assert await mutex.acquire()
        before = await snapshot(a, etcd_prefix)

        for args, code, word in (
            (["--holder", "up-1"], Exit.REFUSED, "refusing without --yes"),
            (["--holder", "up-2", "--yes"], Exit.NOT_FOUND, "waiting, not holding"),
            (["--holder", "nobody", "--yes"], Exit.NOT_FOUND, "holds no permit"),
        ):
            proc = await cli(ep, "semaphore", "release", path, *args)
            assert word in one_line_error(proc, code)
        proc = await cli(ep, "semaphore", "release", f"{etcd_prefix}lk", "--holder", "x", "--yes")
        assert "no semaphore" in one_line_error(proc, Exit.NOT_FOUND)  # a mutex's path
        proc = await cli(ep, "semaphore", "release", path, "--holder", "up-1", "--dry-run")
        assert proc.returncode == 0 and proc.stdout.startswith("would release 1 permit(s)")
        assert await snapshot(a, etcd_prefix) == before  # nothing written so far
        assert not waiting.done()

        proc = await cli(
            ep, "-o", "json", "semaphore", "release", path, "--holder", "up-1", "--yes"
        )
        data = assert_valid(proc.stdout)["data"]
        assert [p["key"] for p in data["permits"]] == [held.key.decode()]
        assert data["permits"][0]["fencing_token"] == held.create_revision
        assert await asyncio.wait_for(waiting, 30)  # the waiter got the permit
        await asyncio.wait_for(anext(lost), 30)  # the holder saw it lost
        assert first.held_permits == 0 and second.held_permits == 1

        after = await snapshot(a, etcd_prefix)
        holders = f"{path}/holders/".encode()
        gone = set(before) - set(after)
        assert gone == {held.key}
        for key, value in before.items():  # every other key as it was, but the line's
            if key != held.key and not key.startswith(holders):
                assert after[key] == value, key
        assert (await a.lease_time_to_live(held.lease_id)).ttl > 0  # the lease was not revoked
        await mutex.aclose()
        await first.aclose()
        await second.aclose()


async def test_a_path_that_is_not_a_semaphore_is_refused(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}sem"
    async with connect(etcd_server.endpoint) as client:
        sem = DistributedSemaphore(client, path, 2)
        async with sem.with_permit():
            pass
        await sem.aclose()
        permits = [kv.key for kv in (await client.get_prefix(path)).kvs]
        [permits_key] = [k for k in permits if b"/holders/" not in k]
        await client.put(permits_key, b"not a count")
        before = await snapshot(client, etcd_prefix)
        proc = await cli(etcd_server.endpoint, "semaphore", "release", path, "--holder", "x",
                         "--yes")  # fmt: skip
        assert "not a semaphore" in one_line_error(proc, Exit.REFUSED)
        assert await snapshot(client, etcd_prefix) == before
