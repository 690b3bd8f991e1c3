"""``etcd-recipes shared get`` as a real subprocess against a real etcd: the value and its
version as the recipes see them, each ``--as`` form, exit codes 3/4/2, and that it only reads
(etcd's revision does not move)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("typer")

from etcd_recipes import JSON, UTF8, SharedCount, SharedValue, connect
from etcd_recipes.cli import Exit
from tests.cli.schema import assert_valid


def cli(server, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "etcd_recipes.cli", "--endpoints", server.endpoint, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr


async def test_shared_get_shows_the_value_and_its_version(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        async with (
            SharedCount(client, f"{etcd_prefix}n", seed=41) as count,
            SharedValue(client, f"{etcd_prefix}cfg", {"on": True}, codec=JSON) as cfg,
            SharedValue(client, f"{etcd_prefix}mode", "blue", codec=UTF8) as mode,
        ):
            await client.put(f"{etcd_prefix}bin", b"\xff\x00")
            version = (await count.get()).version
            head = (await client.status()).revision

            code, out, _ = cli(etcd_server, "shared", "get", f"{etcd_prefix}n", "--as", "int64")
            assert (code, out) == (0, f"41  (version {version})\n")
            code, out, _ = cli(etcd_server, "-o", "json", "shared", "get", f"{etcd_prefix}cfg",
                               "--as", "json")  # fmt: skip
            assert code == 0
            assert assert_valid(out)["data"] == {
                "path": f"{etcd_prefix}cfg",
                "version": (await cfg.get()).version,
                "encoding": "json",
                "value": {"on": True},
            }
            code, out, _ = cli(etcd_server, "-o", "json", "shared", "get", f"{etcd_prefix}mode")
            assert assert_valid(out)["data"]["value"] == "blue"
            code, out, _ = cli(etcd_server, "-o", "json", "shared", "get", f"{etcd_prefix}bin")
            data = assert_valid(out)["data"]
            assert (data["encoding"], data["value"]) == ("base64", "/wA=")

            code, out, err = cli(etcd_server, "shared", "get", f"{etcd_prefix}none")
            assert code == Exit.NOT_FOUND and out == "" and "no shared value" in err
            code, _, err = cli(etcd_server, "shared", "get", f"{etcd_prefix}mode", "--as", "int64")
            assert code == Exit.REFUSED and "is not int64" in err and "Traceback" not in err
            code, _, err = cli(etcd_server, "shared", "get", "relative")
            assert code == Exit.USAGE
            assert (await client.status()).revision == head  # read only: nothing was written
            assert await client.get(f"{etcd_prefix}none") is None
            assert (await mode.get()).value == "blue"
