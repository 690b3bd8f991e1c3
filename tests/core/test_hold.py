"""The shared exclusive-hold machinery: fencing compare, loss by lease and by key deletion,
scoped bodies cancelled on loss."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import LockLostError, Op
from etcd_recipes._recipe.hold import Hold
from tests.helpers import eventually


async def _hold(client, key: str) -> Hold:
    lease = await client.lease(2).grant()
    put = await client.put(key, b"", lease=lease.id)
    hold = Hold(client, key, lease, put.revision, LockLostError, f"test {key}")
    hold.start_monitor()
    return hold


@pytest.mark.parametrize("how", ["revoke-lease", "delete-key"])
async def test_loss_cancels_the_scoped_body(etcd_client, etcd_prefix, how):
    key = etcd_prefix + "lock/1"
    hold = await _hold(etcd_client, key)
    causes: list[object] = []
    hold.add_listener(causes.append)
    assert (await hold.guarded_txn([Op.put(etcd_prefix + "data", b"1")])).succeeded
    reached_end = False
    with pytest.raises(LockLostError):
        async with hold.scope():
            if how == "revoke-lease":
                await etcd_client.lease_revoke(hold.lease.id)
            else:
                await etcd_client.delete(key)
            await asyncio.sleep(10)
            reached_end = True
    assert not reached_end and hold.is_lost
    await eventually(lambda: len(causes) == 1, what="one loss notification")
    # The fencing compare now rejects writes.
    assert not (await hold.guarded_txn([Op.put(etcd_prefix + "data", b"2")])).succeeded
    assert (await etcd_client.get(etcd_prefix + "data")).value == b"1"
    assert await hold.release() is False


async def test_release_deletes_only_its_own_key(etcd_client, etcd_prefix):
    key = etcd_prefix + "lock/1"
    hold = await _hold(etcd_client, key)
    async with hold.scope():
        pass
    assert await hold.release() is True
    assert await etcd_client.get(key) is None
    assert await hold.release() is False
    assert hold.lease.id and (await etcd_client.lease_time_to_live(hold.lease.id)).ttl == -1
