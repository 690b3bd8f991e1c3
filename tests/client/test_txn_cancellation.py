"""etcd 3.5.0-3.5.2 crash ("unexpected error during txn") when a read-only transaction's
context is cancelled server-side. The client must never cancel a transaction on the server:
callers may cancel as they like, and the server stays up."""

from __future__ import annotations

import random

import anyio
import pytest

from etcd_recipes import Cmp, EtcdTimeoutError, Op, connect


@pytest.mark.slow
async def test_cancelled_read_only_transactions_do_not_kill_the_server(fresh_etcd_server):
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        for i in range(200):
            await client.put(f"/x/{i}", b"v" * 200)
        rng = random.Random(7)
        cancelled = 0
        for _ in range(1000):
            with anyio.move_on_after(rng.uniform(0.0001, 0.004)) as scope:
                await client.txn([Cmp.exists("/x/1")], [Op.get("/x/", prefix=True)])
            cancelled += scope.cancelled_caught
        assert cancelled > 0  # the cancellations really happened mid-call
        await anyio.sleep(0.5)
        assert fresh_etcd_server.is_running
        assert (await client.txn([], [Op.get("/x/1")])).succeeded


async def test_transaction_timeouts(fresh_etcd_server):
    """A read-only transaction's timeout is enforced client-side (the server never sees a
    deadline); a writing one uses the gRPC deadline. Both raise EtcdTimeoutError."""
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        fresh_etcd_server.pause()
        try:
            with pytest.raises(EtcdTimeoutError, match="may still commit"):
                await client.txn([], [Op.get("/t")], timeout=0.3)
            with pytest.raises(EtcdTimeoutError):
                await client.txn([], [Op.put("/t", b"1")], timeout=0.3)
        finally:
            fresh_etcd_server.resume()
        assert (await client.txn([], [Op.get("/t")], timeout=5)).succeeded
