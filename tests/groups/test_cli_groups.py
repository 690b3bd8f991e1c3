"""``etcd-recipes group ls`` and ``group partitions`` against real partitioners: what they
show matches etcd, their JSON validates against the published schemas, a pending hand-over and
a dead owner are marked, and an empty path exits 3. Read only: the keys are unchanged."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import GroupMember, SetPartitioner
from etcd_recipes.cli import app
from tests.cli.schema import assert_valid
from tests.helpers import eventually

runner = CliRunner()
ITEMS = ["a", "b", "c", "d", "e", "f"]


async def cli(server, *args: str) -> tuple[int, str, str]:
    result = await asyncio.to_thread(runner.invoke, app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


async def keys(client, path):
    return [(kv.key_text, kv.mod_revision) for kv in await client.get_prefix(path + "/")]


async def test_ls_and_partitions_show_what_etcd_holds(etcd_client, etcd_server, etcd_prefix):
    path = etcd_prefix + "g"
    parts = [
        SetPartitioner(etcd_client, path, ITEMS, member_id=m, payload=f"10.0.0.{i}")
        for i, m in enumerate(("w1", "w2"), 1)
    ]
    for p in parts:
        await p.start()

    async def stable() -> bool:
        return all(p.state.value == "stable" and len(p.member.member_ids()) == 2 for p in parts)

    await eventually(stable, what="stable")
    await asyncio.sleep(0.3)
    before = await keys(etcd_client, path)
    code, out, _ = await cli(etcd_server, "-o", "json", "group", "ls", path)
    assert code == 0, out
    data = assert_valid(out)["data"]
    assert [(m["id"], m["payload"], m["items"]) for m in data["members"]] == [
        ("w1", "10.0.0.1", len(parts[0].assigned())),
        ("w2", "10.0.0.2", len(parts[1].assigned())),
    ]
    assert data["members"][0]["lease"] == f"{parts[0].member.lease_id:x}"
    code, out, _ = await cli(etcd_server, "-o", "json", "group", "partitions", path)
    assert code == 0, out
    data = assert_valid(out)["data"]
    tokens = {**parts[0].assigned(), **parts[1].assigned()}
    assert {o["item"]: o["fencing_token"] for o in data["owners"]} == tokens
    assert all(o["owner"] == o["expected_owner"] and o["owner_is_member"] for o in data["owners"])
    code, out, _ = await cli(etcd_server, "group", "partitions", path)
    assert code == 0 and "0 hand-over(s) pending" in out and "fencing token" in out
    code, out, _ = await cli(etcd_server, "group", "ls", path)
    assert code == 0 and "2 member(s)" in out and "10.0.0.2" in out
    assert await keys(etcd_client, path) == before  # read only
    for p in parts:
        await p.aclose()


async def test_a_pending_hand_over_and_a_dead_owner_are_marked(
    etcd_client, etcd_server, etcd_prefix
):
    path = etcd_prefix + "g"
    async with etcd_client.lease(30) as ghost:
        await etcd_client.put(f"{path}/owners/a", b"ghost", lease=ghost.id)  # a dead owner
        async with GroupMember(etcd_client, path, member_id="w1"):
            code, out, _ = await cli(etcd_server, "-o", "json", "group", "partitions", path)
            assert code == 0
            owner = assert_valid(out)["data"]["owners"][0]
            assert (owner["owner"], owner["owner_is_member"], owner["expected_owner"]) == (
                "ghost",
                False,
                "w1",
            )
            code, out, _ = await cli(etcd_server, "group", "partitions", path)
            assert code == 0 and "owner gone" in out and "1 hand-over(s) pending" in out


async def test_nothing_there_exits_3_and_a_relative_path_2(etcd_server, etcd_prefix):
    code, _, err = await cli(etcd_server, "group", "ls", etcd_prefix + "nothing")
    assert code == 3 and "no group at" in err
    code, _, err = await cli(etcd_server, "group", "partitions", "relative/path")
    assert code == 2
