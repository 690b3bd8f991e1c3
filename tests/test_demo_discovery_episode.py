"""The demo's discovery episode on a real etcd: three registered servers, one SIGKILLed
mid-load; at most the error threshold of requests fail and none go to it afterwards."""

from __future__ import annotations

import pytest

from demo import discovery_episode
from etcd_recipes import connect
from tests.helpers import eventually


@pytest.mark.slow
async def test_traffic_moves_off_a_sigkilled_server(etcd_server):
    lines: list[str] = []
    result = await discovery_episode.episode(etcd_server.endpoint, lines.append)
    assert result["moved"], "\n".join(lines)
    assert result["failed"] <= discovery_episode.THRESHOLD and result["picks_after_down"] == 0
    assert result["gone"] and result["after"]["echo-b"] == 0
    assert any("verdict: traffic moved off" in line for line in lines)
    async with connect(**etcd_server.client_kwargs()) as client:

        async def gone() -> bool:  # the servers were terminated: their leases expire
            return await client.count(discovery_episode.PATH + "/") == 0

        await eventually(gone, timeout=10, what="the registrations to expire")
