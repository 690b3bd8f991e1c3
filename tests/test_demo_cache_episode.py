"""The demo's cache episode on a real etcd: three cache processes survive a restart and a
compaction, report only the net changes, converge with etcd, and leave nothing behind."""

from __future__ import annotations

import re

import pytest

from demo import cache_episode
from etcd_recipes import connect


@pytest.mark.slow
async def test_the_cache_episode_converges_and_reports_net_changes(fresh_etcd_server):
    lines: list[str] = []
    await cache_episode.episode(fresh_etcd_server, lines.append)
    text = "\n".join(lines)
    assert "all 3 caches: LIVE" in text and "nothing re-read" in text
    (resync,) = [line for line in lines if "RESYNC r" in line]
    # Six writes while cut off, four events: feature.x once, mode deleted and re-created.
    changes = resync.split(": ", 2)[2]
    assert changes == "UPDATED feature.x=on, DELETED mode, CREATED mode=green, CREATED region=eu"
    assert re.search(r"verdict: converged -- 3/3 caches equal etcd \(4 keys at r\d+\)", text)
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        assert await client.count(cache_episode.PREFIX) == 0
