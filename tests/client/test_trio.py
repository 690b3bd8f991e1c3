"""Under trio (issue 32, item 16): the async client says it needs asyncio and how to get out --
the blocking facade in a worker thread, which this test then uses."""

from __future__ import annotations

import pytest

from etcd_recipes import UsageError, connect

trio = pytest.importorskip("trio")


def test_the_async_client_under_trio_names_the_limit_and_the_way_out(etcd_server):
    async def main() -> None:
        async with connect(etcd_server.endpoint):
            pass

    with pytest.raises(UsageError, match="asyncio only") as info:
        trio.run(main)
    assert "etcd_recipes.sync" in str(info.value) and "to_thread" in str(info.value)


def test_the_blocking_facade_works_from_a_trio_worker_thread(etcd_server, etcd_prefix):
    from etcd_recipes.sync import DistributedMutex
    from etcd_recipes.sync import connect as sync_connect

    key = etcd_prefix + "trio"

    def work() -> bytes:
        with sync_connect(etcd_server.endpoint) as client:
            with DistributedMutex(client, key + "/lock"):
                client.put(key, b"from trio")
            kv = client.get(key)
            assert kv is not None
            assert client.get_prefix(key + "/lock").kvs == []  # released
            return kv.value

    async def main() -> bytes:
        return await trio.to_thread.run_sync(work)

    assert trio.run(main) == b"from trio"
