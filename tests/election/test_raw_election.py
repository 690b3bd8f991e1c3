"""The pass-throughs to etcd's election service, against the real ``etcdctl elect`` on the
same election name: hand-over both ways, observe, proclaim, resign, stale keys, and
cancelled or timed-out campaigns that leave no key behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import anyio
import pytest

from etcd_recipes import (
    EtcdTimeoutError,
    InvalidArgumentError,
    NotLeaderError,
    election_campaign,
    election_leader,
    election_observe,
    election_proclaim,
    election_resign,
)
from etcd_recipes.testing import find_etcdctl_binary

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to etcdctl")


def etcdctl_elect(server, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    return subprocess.Popen(
        [find_etcdctl_binary(), f"--endpoints={server.url}", "elect", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def read_leader(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """``etcdctl elect`` prints the leader key, then its value."""
    assert proc.stdout is not None
    key = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)
    value = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 10)
    return key.strip(), value.strip()


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # etcdctl elect resigns on Ctrl-C
    proc.communicate(timeout=10)


async def test_raw_election_against_etcdctl(etcd_client, etcd_server, etcd_prefix):
    name = etcd_prefix + "raw"
    ctl = etcdctl_elect(etcd_server, name, "from-etcdctl")
    try:
        ctl_key, ctl_value = await read_leader(ctl)
        assert ctl_key.startswith(name + "/") and ctl_value == "from-etcdctl"
        kv = await election_leader(etcd_client, name)
        assert kv is not None and kv.key.decode() == ctl_key and kv.value == b"from-etcdctl"
        async with etcd_client.lease(10) as lease:
            campaign = asyncio.create_task(
                election_campaign(etcd_client, name, "from-python", lease=lease.id)
            )
            observe = election_observe(etcd_client, name)
            assert (await asyncio.wait_for(anext(observe), 5)).value == b"from-etcdctl"
            await asyncio.sleep(0.3)
            assert not campaign.done()  # etcdctl leads: the campaign blocks server-side
            stop(ctl)
            leader = await asyncio.wait_for(campaign, 10)
            assert leader.key == f"{name}/{lease.id:x}".encode()
            assert leader.lease == lease.id and leader.name == name.encode()
            assert (await asyncio.wait_for(anext(observe), 5)).value == b"from-python"
            await election_proclaim(etcd_client, leader, "python-v2")
            assert (await asyncio.wait_for(anext(observe), 5)).value == b"python-v2"
            await observe.aclose()
            kv = await election_leader(etcd_client, name)
            assert kv is not None and kv.value == b"python-v2"
            assert kv.create_revision == leader.revision
            # etcdctl sees our leadership ...
            listen = etcdctl_elect(etcd_server, "-l", name)
            try:
                assert (await read_leader(listen))[1] == "python-v2"
            finally:
                listen.kill()
                listen.communicate(timeout=10)
            # ... and takes over when we resign.
            ctl = etcdctl_elect(etcd_server, name, "etcdctl-2")
            await asyncio.sleep(0.3)
            assert ctl.poll() is None
            await election_resign(etcd_client, leader)
            ctl_key, ctl_value = await read_leader(ctl)
            assert ctl_value == "etcdctl-2" and ctl_key != leader.key.decode()
            with pytest.raises(NotLeaderError):
                await election_proclaim(etcd_client, leader, "stale")
            await election_resign(etcd_client, leader)  # resigning an ended term: a no-op
            assert (await election_leader(etcd_client, name)).value == b"etcdctl-2"
    finally:
        stop(ctl)
    assert await election_leader(etcd_client, name) is None


async def test_cancelled_or_timed_out_raw_campaign_leaves_no_key(etcd_client, etcd_prefix):
    name = etcd_prefix + "raw"
    async with etcd_client.lease(10) as first, etcd_client.lease(10) as second:
        leader = await election_campaign(etcd_client, name, "first", lease=first.id)
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.5):
                await election_campaign(etcd_client, name, "second", lease=second.id)
        keys = [kv.key for kv in await etcd_client.get_prefix(name + "/")]
        assert keys == [leader.key]
        with pytest.raises(EtcdTimeoutError):
            await election_campaign(etcd_client, name, "second", lease=second.id, timeout=0.5)
        keys = [kv.key for kv in await etcd_client.get_prefix(name + "/")]
        assert keys == [leader.key]
        await election_resign(etcd_client, leader)
    assert await election_leader(etcd_client, name) is None
    with pytest.raises(InvalidArgumentError):
        await election_campaign(etcd_client, name, "x", lease=0)
