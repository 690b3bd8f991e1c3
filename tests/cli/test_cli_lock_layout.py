"""The lock commands act only on keys in the lock layout (``<path>/<lease hex>`` on that lease),
tried against an etcd that holds other recipes' keys and plain keys too (issue 32, items 1-2):
a refused command writes nothing, which the tests prove by reading every key under the test
prefix with its value and mod revision before and after."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import DistributedAtomicLong, DistributedMutex, EtcdClient, LeaderLatch, connect
from etcd_recipes.cli import Exit, app
from etcd_recipes.locks.inspection import mutex_state

runner = CliRunner()


def cli(server, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


async def snapshot(client: EtcdClient, prefix: str) -> tuple[int, list[tuple[bytes, bytes, int]]]:
    """The store revision and every key under ``prefix`` with its value and mod revision."""
    read = await client.get_prefix(prefix)
    return read.revision, [(kv.key, kv.value, kv.mod_revision) for kv in read.kvs]


async def _demo(client: EtcdClient, prefix: str) -> DistributedMutex:
    """The operations page's setup, shrunk: a counter, a plain config key, an election and a
    held lock under one ``demo`` path."""
    demo = f"{prefix}demo"
    await DistributedAtomicLong(client, f"{demo}/counter").add(41)
    await client.put(f"{demo}/config", b"colour=blue")
    lease = await client.lease_grant(30)
    # a key named like a lease, but on another lease: not in the layout
    await client.put(f"{demo}/config/{lease.id + 1:x}", b"x", lease=lease.id)
    await client.put(f"{demo}/plain/{lease.id:x}", b"")  # named like a lease, on none
    mutex = DistributedMutex(client, f"{demo}/report")
    assert await mutex.acquire()
    return mutex


async def test_lock_break_refuses_a_path_holding_other_keys_and_writes_nothing(
    etcd_server, etcd_prefix
) -> None:
    async with connect(etcd_server.endpoint) as client:
        mutex = await _demo(client, etcd_prefix)
        async with LeaderLatch(client, f"{etcd_prefix}demo/election", client_id="n1") as latch:
            assert await latch.await_leadership(timeout=10)
            before = await snapshot(client, etcd_prefix)
            for path in ("demo", "demo/config", "demo/plain", "demo/election"):
                for flags in (("--yes",), ("--dry-run",), ()):
                    code, _, err = await asyncio.to_thread(
                        cli, etcd_server, "lock", "break", f"{etcd_prefix}{path}", *flags
                    )
                    assert code in (Exit.REFUSED, Exit.NOT_FOUND), (path, flags, err)
                    if path != "demo/election":  # the election's keys are its own layout
                        assert "not a lock" in err or "nobody" in err, err
            assert (await snapshot(client, etcd_prefix))[1] == before[1]
            assert mutex.is_held and latch.has_leadership
        await mutex.aclose()


async def test_lock_break_dry_run_says_what_would_go_and_writes_nothing(
    etcd_server, etcd_prefix
) -> None:
    async with connect(etcd_server.endpoint) as client:
        mutex = await _demo(client, etcd_prefix)
        # a second lock of this client shares the session lease: breaking one breaks both
        other = DistributedMutex(client, f"{etcd_prefix}demo/other")
        assert await other.acquire()
        path = f"{etcd_prefix}demo/report"
        before = await snapshot(client, etcd_prefix)
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "-o", "json", "lock", "break", path, "--dry-run"
        )
        assert code == 0, out
        data = json.loads(out)["data"]
        assert data["dry_run"] is True and data["action"].startswith("would revoke")
        assert data["holder"]["key"] == mutex.hold.key.decode()
        assert data["lease_keys"] == sorted([mutex.hold.key.decode(), other.hold.key.decode()])
        assert (await snapshot(client, etcd_prefix))[1] == before[1]
        assert mutex.is_held

        code, out, _ = await asyncio.to_thread(cli, etcd_server, "lock", "break", path, "--yes")
        assert code == 0 and "revoked lease" in out and other.hold.key.decode() in out
        await asyncio.wait_for(_lost(mutex), 10)
        after = await snapshot(client, etcd_prefix)
        # exactly the lease's keys went: the counter, config and plain keys are all still there
        gone = {k for k, _, _ in before[1]} - {k for k, _, _ in after[1]}
        assert gone == {mutex.hold.key, other.hold.key}
        await mutex.aclose()
        await other.aclose()


async def _lost(mutex: DistributedMutex) -> None:
    while not mutex.hold.is_lost:
        await asyncio.sleep(0.05)


async def test_lock_ls_and_show_list_only_lock_paths(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        mutex = await _demo(client, etcd_prefix)
        code, out, err = await asyncio.to_thread(
            cli, etcd_server, "-o", "json", "lock", "ls", etcd_prefix
        )
        assert code == 0, err
        assert json.loads(out)["data"]["locks"] == [
            {
                "path": f"{etcd_prefix}demo/report",
                "contenders": 1,
                "fencing_token": mutex.fencing_token,
            }
        ]
        code, _, err = await asyncio.to_thread(
            cli, etcd_server, "lock", "show", f"{etcd_prefix}demo"
        )
        assert code == Exit.REFUSED and "not a lock" in err and "demo/counter" in err
        state = await mutex_state(client, f"{etcd_prefix}demo")
        assert state.holder is None and not state.is_lock  # the report lock is a level deeper
        assert len(state.foreign) == 5  # counter, config, config/<hex>, plain/<hex>, report/<hex>
        await mutex.aclose()
