"""``semaphore show`` and ``election resign`` against real etcd and real recipes."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import DistributedSemaphore, LeaderLatch, connect
from etcd_recipes.cli import Exit, app
from tests.cli.schema import assert_valid


def cli(server, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


async def test_semaphore_show_lists_holders_and_waiters(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}sem"
    code, _, err = await asyncio.to_thread(cli, etcd_server, "semaphore", "show", path)
    assert code == Exit.NOT_FOUND and "Traceback" not in err
    async with connect(etcd_server.endpoint) as client:
        a = DistributedSemaphore(client, path, 1, client_id="a")
        b = DistributedSemaphore(client, path, 1, client_id="b")
        assert await a.acquire()
        waiting = asyncio.create_task(b.acquire(timeout=30))
        while await client.count(f"{path}/holders/") < 2:
            await asyncio.sleep(0.05)
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "-o", "json", "semaphore", "show", path
        )
        data = assert_valid(out)["data"]
        assert data["permits"] == 1
        assert [h["client_id"] for h in data["holders"]] == ["a"]
        assert [w["client_id"] for w in data["waiters"]] == ["b"]
        assert data["holders"][0]["ttl_left"] > 0
        await a.release()
        assert await waiting
        await a.aclose()
        await b.aclose()


async def test_election_resign_needs_yes_and_the_leader_loses(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}el"
    code, _, _ = await asyncio.to_thread(cli, etcd_server, "election", "resign", path, "--yes")
    assert code == Exit.NOT_FOUND
    async with connect(etcd_server.endpoint) as client:
        lost = asyncio.Event()
        async with LeaderLatch(client, path, client_id="node-1") as latch:
            latch.add_leadership_listener(lambda leading: None if leading else lost.set())
            assert await latch.await_leadership(timeout=10)
            token = latch.fencing_token
            code, _, err = await asyncio.to_thread(cli, etcd_server, "election", "resign", path)
            assert code == Exit.REFUSED and "--yes" in err and latch.is_leader
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "election", "resign", path, "--yes"
            )
            assert code == 0
            data = assert_valid(out)["data"]
            assert (data["leader"], data["fencing_token"]) == ("node-1", token)
            await asyncio.wait_for(lost.wait(), 10)


async def test_discovery_ls_show_and_cache_dump(etcd_server, etcd_prefix) -> None:
    import subprocess
    import sys

    from etcd_recipes import ServiceDiscovery, ServiceInstance

    base = f"{etcd_prefix}services"
    async with connect(etcd_server.endpoint) as client:
        async with ServiceDiscovery(client, base) as discovery:
            me = ServiceInstance("orders", "eu", address="10.0.0.7", port=8080)
            await discovery.register(me)
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "discovery", "ls", base
            )
            assert assert_valid(out)["data"]["services"] == [
                {"base": base, "name": "orders", "instances": 1}
            ]
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "discovery", "show", base, "orders"
            )
            [row] = assert_valid(out)["data"]["instances"]
            assert (row["id"], row["address"], row["port"], row["payload"]) == (
                me.id,
                "10.0.0.7",
                8080,
                "eu",
            )
            code, _, _ = await asyncio.to_thread(cli, etcd_server, "discovery", "show", base, "x")
            assert code == Exit.NOT_FOUND
        await client.put(f"{etcd_prefix}cfg/a", b"1")
        await client.put(f"{etcd_prefix}cfg/b", b"\xff")
        proc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "etcd_recipes.cli",
                "--endpoints",
                etcd_server.endpoint,
                "-o",
                "json",
                "cache",
                "dump",
                f"{etcd_prefix}cfg/",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        entries = assert_valid(proc.stdout)["data"]["entries"]
        assert [(e["key"][-1], e["value"], e["encoding"]) for e in entries] == [
            ("a", "1", "utf-8"),
            ("b", "/w==", "base64"),
        ]


async def test_discovery_ls_without_base_finds_every_base_by_the_recipe_layout(
    etcd_server, etcd_prefix
) -> None:
    from etcd_recipes import DistributedMutex, ServiceDiscovery, ServiceInstance

    async with connect(etcd_server.endpoint) as client:
        # A lock whose path happens to fit the layout: <base>/names/<name>/<lease id>.
        decoy = DistributedMutex(client, f"{etcd_prefix}decoy/names/orders")
        assert await decoy.acquire()
        async with (
            ServiceDiscovery(client, f"{etcd_prefix}a") as a,
            ServiceDiscovery(client, f"{etcd_prefix}b/names/deep") as b,  # "names" in a base
        ):
            for instance in (
                ServiceInstance("orders", "", address="10.0.0.7", port=1),
                ServiceInstance("orders", "", address="10.0.0.8", port=1),
                ServiceInstance("billing", "", address="10.0.0.9", port=1),
            ):
                await a.register(instance)
            await b.register(ServiceInstance("orders", "", address="10.0.1.1", port=1))
            code, out, err = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "discovery", "ls"
            )
            assert code == 0, err
            data = assert_valid(out)["data"]
            assert data["base"] == "/"
            mine = [s for s in data["services"] if s["base"].startswith(etcd_prefix)]
            assert mine == [
                {"base": f"{etcd_prefix}a", "name": "billing", "instances": 1},
                {"base": f"{etcd_prefix}a", "name": "orders", "instances": 2},
                {"base": f"{etcd_prefix}b/names/deep", "name": "orders", "instances": 1},
            ]  # and not the decoy lock: its record is no ServiceInstance
            assert data["skipped"] >= 1
            wide = await asyncio.to_thread(  # wide enough that rich crops no column
                CliRunner().invoke,
                app,
                ["--endpoints", etcd_server.endpoint, "discovery", "ls"],
                env={"COLUMNS": "400"},
            )
            assert wide.exit_code == 0
            assert wide.stdout.splitlines()[1].split() == ["base", "service", "instances"]
            rows = [ln.split() for ln in wide.stdout.splitlines() if ln.startswith(etcd_prefix)]
            assert rows == [
                [f"{etcd_prefix}a", "billing", "1"],
                [f"{etcd_prefix}a", "orders", "2"],
                [f"{etcd_prefix}b/names/deep", "orders", "1"],
            ]
        await decoy.aclose()
