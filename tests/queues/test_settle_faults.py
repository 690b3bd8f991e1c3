"""A guarded settle (``ack``, ``requeue``, ``dead_letter``) rides out a server restart within
the queue's ``visibility_timeout``, and an attempt whose outcome the outage hid is found out:
"we settled it" (the marker is gone while the lease it lived on is alive) answers ``True``, a
claim that was really lost answers ``False``."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import DistributedWorkQueue, EtcdConnectionError, WorkQueueConfig, connect
from tests.queues.helpers import keys

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}
CONFIG = WorkQueueConfig(visibility_timeout=15, sweep_interval=30)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ack", "requeue", "dead_letter"])
async def test_a_settle_rides_out_a_server_restart(fresh_etcd_server, etcd_prefix, how):
    path = etcd_prefix + "wq"
    async with connect(**fresh_etcd_server.client_kwargs(), **FAST) as client:
        queue = DistributedWorkQueue(client, path, CONFIG)
        item_id = await queue.enqueue(b"job")
        item = await queue.receive()
        fresh_etcd_server.kill()
        settle = {
            "ack": item.ack,
            "requeue": item.requeue,
            "dead_letter": lambda: item.dead_letter("boom"),
        }[how]
        task = asyncio.create_task(settle())
        await asyncio.sleep(1.0)
        assert not task.done()  # still retrying, not raised
        fresh_etcd_server.restart()
        assert await asyncio.wait_for(task, 20) is True
        remaining = await keys(client, path + "/")
        expected = {
            "ack": [],
            "requeue": [f"{path}/attempts/{item_id}", f"{path}/items/{item_id}"],
            "dead_letter": [
                f"{path}/attempts/{item_id}",
                f"{path}/dlq/{item_id}",
                f"{path}/reasons/{item_id}",
            ],
        }[how]
        assert remaining == expected
        await queue.aclose()


def _hide_outcome(client, *, commit: bool):
    """Make the next write transaction's outcome unknown: run it (``commit``) or not, then
    raise a transport error as a connection lost mid-call would."""
    real = client.txn
    armed = [True]

    async def txn(compare, success=(), failure=(), **kw):
        if armed[0] and success:
            armed[0] = False
            if commit:
                await real(compare, success, failure, **kw)
            raise EtcdConnectionError("connection lost before the answer (injected)")
        return await real(compare, success, failure, **kw)

    client.txn = txn
    return armed


async def test_a_committed_settle_whose_answer_was_lost_returns_true(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        await queue.enqueue(b"job")
        item = await queue.receive()
        armed = _hide_outcome(etcd_client, commit=True)
        try:
            assert await item.ack() is True  # the retry's compare fails: it was ours
        finally:
            del etcd_client.txn
        assert not armed[0]
        assert await keys(etcd_client, path + "/") == []


async def test_a_lost_claim_behind_an_unknown_outcome_returns_false(etcd_client, etcd_prefix):
    path = etcd_prefix + "wq"
    async with DistributedWorkQueue(etcd_client, path, CONFIG) as queue:
        item_id = await queue.enqueue(b"job")
        item = await queue.receive()
        await etcd_client.lease_revoke(queue.lease_id)  # the claim is lost meanwhile
        armed = _hide_outcome(etcd_client, commit=False)
        try:
            assert await item.ack() is False
        finally:
            del etcd_client.txn
        assert not armed[0]
        # The orphan is still there for a sweep to return; the ack deleted nothing.
        assert f"{path}/claimed/{item_id}" in await keys(etcd_client, path + "/")
