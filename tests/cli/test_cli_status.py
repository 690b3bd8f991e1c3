"""``etcd-recipes status`` against real servers: roles (leader, follower, learner), the compact
revision, the database against the quota (the 80 % warning), a real NOSPACE alarm, and a member
that cannot be reached."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import connect
from etcd_recipes.cli import app
from etcd_recipes.errors import EtcdServerError
from etcd_recipes.testing import EtcdCluster, EtcdServer
from etcd_recipes.testing._process import free_ports
from etcd_recipes.testing.server import _MemberSpec

from .schema import assert_valid

runner = CliRunner()


def status(endpoints: str, *args: str) -> tuple[int, dict, str]:
    """``status -o json`` (validated against its schema) and the table form's stdout."""
    result = runner.invoke(app, ["--endpoints", endpoints, "-o", "json", "status", *args])
    assert result.exit_code == 0, result.output
    data = assert_valid(result.stdout)["data"]
    table = runner.invoke(app, ["--endpoints", endpoints, "status", *args])
    assert table.exit_code == 0, table.output
    return result.exit_code, data, table.stdout


async def test_compact_revision_and_quota_warning_from_80_percent() -> None:
    with EtcdServer() as server:
        async with connect(server.endpoint) as client:
            for i in range(10):
                await client.put(f"/k{i}", "v")
            await client.compact(7)
            _, data, table = await asyncio.to_thread(status, server.endpoint)
            assert data["compact_revision"] == 7 and data["revision"] == 11
            assert "revision 11, compacted at 7" in table
            assert data["warnings"] == [] and "warning" not in table
            db = data["db_size"]
            assert data["quota_bytes"] == 2 * 1024**3
            # Just under 80 %: quiet; at 80 %: one warning, in both forms.
            _, data, table = await asyncio.to_thread(
                status, server.endpoint, "--quota-bytes", str(int(db / 0.79))
            )
            assert data["warnings"] == [] and data["quota_percent"] < 80
            _, data, table = await asyncio.to_thread(
                status, server.endpoint, "--quota-bytes", str(int(db / 0.8))
            )
            assert data["quota_percent"] >= 80
            [warning] = data["warnings"]
            assert "quota" in warning and f"warning: {warning}" in table


async def test_a_nospace_alarm_is_listed_and_warned_about() -> None:
    quota = 256 * 1024
    with EtcdServer(name="full", extra_args=["--quota-backend-bytes", str(quota)]) as server:
        async with connect(server.endpoint) as client:
            with pytest.raises(EtcdServerError, match="database space exceeded"):
                for i in range(10_000):
                    await client.put(f"/fill/{i}", b"x" * 16_384)
            member = f"{server.member_id:x}"
        _, data, table = await asyncio.to_thread(
            status, server.endpoint, "--quota-bytes", str(quota)
        )
        assert data["alarms"] == [{"member": member, "alarm": "NOSPACE"}]
        assert "alarm NOSPACE on member full" in data["warnings"]
        assert any("quota" in w for w in data["warnings"])  # and the database is over 80 %
        assert "alarms: NOSPACE" in table and "warning: alarm NOSPACE on member full" in table


def test_three_members_one_leader_and_a_stopped_member_shows_an_error() -> None:
    with EtcdCluster(3) as cluster:
        endpoints = ",".join(cluster.endpoints)
        _, data, table = status(endpoints)
        leader = cluster.leader()
        assert sorted(m["role"] for m in data["members"]) == ["follower", "follower", "leader"]
        [led] = [m for m in data["members"] if m["role"] == "leader"]
        assert led["name"] == leader.name and data["leader"] == led["id"]
        assert all(m["revision"] == data["revision"] for m in data["members"])
        assert len(data["endpoints"]) == 3 and table.count("follower") == 2
        stopped = cluster.followers()[0]
        stopped.stop()
        _, data, table = status(",".join(m.endpoint for m in cluster.members if m.is_running))
        [down] = [m for m in data["members"] if m["name"] == stopped.name]
        assert "unreachable" in down["error"] and "db_size" not in down
        assert sum("db_size" in m for m in data["members"]) == 2
        assert "unreachable" in table


def test_a_learner_has_the_learner_role() -> None:
    with EtcdServer(name="n1") as voter:
        client_port, peer_port = free_ports(2)
        peer = f"http://127.0.0.1:{peer_port}"
        voter.etcdctl("member", "add", "n2", "--learner", f"--peer-urls={peer}", check=True)
        learner = EtcdServer(
            name="n2",
            extra_args=["--initial-cluster-state", "existing"],
            _member=_MemberSpec(
                initial_cluster=f"n1={voter.peer_url},n2={peer}",
                token=voter._token,
                client_port=client_port,
                peer_port=peer_port,
            ),
        )
        with learner:
            _, data, table = status(voter.endpoint)
            roles = {m["name"]: m["role"] for m in data["members"]}
            assert roles == {"n1": "leader", "n2": "learner"}
            assert "learner" in table
            json.dumps(data)  # plain JSON types only
