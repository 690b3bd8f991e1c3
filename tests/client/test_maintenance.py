"""The maintenance reads: alarms (a real NOSPACE alarm on a server with a tiny quota) and the
compact revision (found by bisection) against real etcd servers."""

from __future__ import annotations

import pytest

from etcd_recipes import Alarm, connect
from etcd_recipes.errors import CompactedError, EtcdServerError
from etcd_recipes.testing import EtcdServer

QUOTA = 256 * 1024  # bytes; etcd's bbolt file starts a little below this


async def test_a_fresh_server_has_no_alarms_and_nothing_compacted() -> None:
    with EtcdServer() as server:
        async with connect(server.endpoint) as client:
            assert await client.alarms() == []
            assert await client.compact_revision() == 0
            st = await client.status()
            assert 0 < st.db_size_in_use <= st.db_size and not st.is_learner


@pytest.mark.parametrize("at", [2, 3, 17, 64])
async def test_compact_revision_is_where_history_was_cut(at: int) -> None:
    with EtcdServer() as server:
        async with connect(server.endpoint) as client:
            for i in range(70):
                await client.put(f"/k{i % 5}", str(i))
            await client.compact(at)
            found = await client.compact_revision()
            assert found == at
            await client.get("/k0", revision=at)  # answered at the cut ...
            with pytest.raises(CompactedError):
                await client.get("/k0", revision=at - 1)  # ... and not below it
            await client.compact(at + 1)
            assert await client.compact_revision() == at + 1  # a later cut moves it up


async def test_compacting_at_revision_one_reads_as_nothing_compacted() -> None:
    with EtcdServer() as server:
        async with connect(server.endpoint) as client:
            await client.put("/a", "1")
            await client.compact(1)
            assert await client.compact_revision() == 0


async def test_a_full_database_raises_a_nospace_alarm() -> None:
    with EtcdServer(extra_args=["--quota-backend-bytes", str(QUOTA)]) as server:
        async with connect(server.endpoint) as client:
            with pytest.raises(EtcdServerError, match="database space exceeded"):
                for i in range(10_000):
                    await client.put(f"/fill/{i}", b"x" * 16_384)
            alarms = await client.alarms()
            st = await client.status()
            assert alarms == [Alarm(member_id=st.member_id, alarm="NOSPACE")]
            assert st.db_size >= QUOTA
