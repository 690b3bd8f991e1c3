"""Cooperative revocation against a real etcd: a request reaches the holder's listener and
releases nothing; the holder decides; the request is the holder key's value, so the lock's
layout (fencing token, lease, place in line) and the lock commands are unchanged; requests are
heard after a compaction and a server restart; the ``lock revoke`` command and the blocking
facade."""

from __future__ import annotations

import asyncio
import threading

import pytest

from etcd_recipes import DistributedMutex, InvalidArgumentError, connect, request_revoke
from etcd_recipes.locks.inspection import mutex_state
from etcd_recipes.locks.revocation import REVOKE_VALUE

from .helpers import keys, queued


async def test_request_reaches_the_holder_and_releases_nothing(etcd_client, etcd_prefix, rivals):
    path = etcd_prefix + "lk"
    (other,) = await rivals(1)
    mutex = DistributedMutex(etcd_client, path)
    heard = []
    asked = asyncio.Event()
    mutex.add_revocation_listener(lambda holder: (heard.append(holder), asked.set()))
    waiter = DistributedMutex(other, path)
    assert await mutex.acquire()
    before = await etcd_client.get(mutex.hold.key)
    assert not mutex.revocation_requested
    waiting = asyncio.create_task(waiter.acquire(timeout=20))
    await queued(etcd_client, path + "/", 2)
    asked_holder = await request_revoke(etcd_client, path)
    assert asked_holder is not None and asked_holder.key == mutex.hold.key
    await asyncio.wait_for(asked.wait(), 5)
    assert [h.key for h in heard] == [mutex.hold.key]
    assert heard[0].create_revision == mutex.fencing_token and heard[0].value == REVOKE_VALUE
    assert mutex.revocation_requested
    after = await etcd_client.get(mutex.hold.key)
    assert after.value == REVOKE_VALUE
    assert (after.create_revision, after.lease) == (before.create_revision, before.lease)
    await asyncio.sleep(0.3)
    assert mutex.is_held and not waiting.done()  # the request itself released nothing
    state = await mutex_state(etcd_client, path)  # what lock show / ls / break read
    assert state.holder.key == mutex.hold.key and state.is_lock and len(state.waiters) == 1
    assert await mutex.release()  # the holder decides: now
    assert await asyncio.wait_for(waiting, 10)
    assert not waiter.revocation_requested
    await waiter.release()
    assert len(heard) == 1
    await mutex.aclose()
    await waiter.aclose()
    assert await keys(etcd_client, path + "/") == []


async def test_nobody_to_ask_and_a_path_that_is_not_a_lock(etcd_client, etcd_prefix):
    path = etcd_prefix + "lk"
    assert await request_revoke(etcd_client, path) is None
    await etcd_client.put(path + "/config", b"plain")
    with pytest.raises(InvalidArgumentError):
        await request_revoke(etcd_client, path)
    assert (await etcd_client.get(path + "/config")).value == b"plain"


async def test_holder_without_listener_ignores_requests(etcd_client, etcd_prefix):
    path = etcd_prefix + "lk"
    mutex = DistributedMutex(etcd_client, path)
    async with mutex.with_lock(timeout=5) as hold:
        assert await request_revoke(etcd_client, path) is not None
        await asyncio.sleep(0.3)
        assert mutex.is_held and not mutex.revocation_requested
        assert (await hold.guarded_txn([])).succeeded  # the fencing compare still holds
    assert await keys(etcd_client, path + "/") == []
    await mutex.aclose()


@pytest.mark.slow
async def test_request_heard_after_compaction_and_restart(fresh_etcd_server, etcd_prefix):
    path = etcd_prefix + "lk"
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        mutex = DistributedMutex(client, path, lease_ttl=10)
        asked = asyncio.Event()
        mutex.add_revocation_listener(lambda holder: asked.set())
        assert await mutex.acquire()
        fresh_etcd_server.kill()
        await asyncio.sleep(0.3)
        fresh_etcd_server.restart()
        for i in range(5):
            rev = (await client.put(f"{etcd_prefix}noise/{i}", b"x")).revision
        await client.compact(rev)
        async with connect(**fresh_etcd_server.client_kwargs()) as operator:
            assert await request_revoke(operator, path) is not None
        await asyncio.wait_for(asked.wait(), 15)
        assert mutex.revocation_requested and await mutex.release()
        await mutex.aclose()


def test_lock_revoke_command(etcd_server, etcd_prefix):
    pytest.importorskip("typer")
    from typer.testing import CliRunner

    from etcd_recipes.cli import Exit, app
    from etcd_recipes.sync import DistributedMutex as SyncMutex
    from etcd_recipes.sync import connect as sync_connect
    from tests.cli.schema import assert_valid

    runner = CliRunner()
    path = etcd_prefix + "lk"

    def cli(*args: str):
        return runner.invoke(app, ["--endpoints", etcd_server.endpoint, *args])

    assert cli("lock", "revoke", path, "--yes").exit_code == int(Exit.NOT_FOUND)
    with sync_connect(**etcd_server.client_kwargs()) as client:
        mutex = SyncMutex(client, path)
        asked = threading.Event()
        mutex.add_revocation_listener(lambda holder: asked.set())  # on the listener thread
        with mutex:
            refused = cli("lock", "revoke", path)
            assert refused.exit_code == int(Exit.REFUSED)
            assert client.get(mutex.hold.key).value == b""  # nothing written without --yes
            dry = cli("-o", "json", "lock", "revoke", path, "--dry-run")
            assert dry.exit_code == 0 and assert_valid(dry.stdout)["data"]["dry_run"] is True
            done = cli("-o", "json", "lock", "revoke", path, "--yes")
            assert done.exit_code == 0, done.output
            doc = assert_valid(done.stdout)["data"]
            assert doc["holder"]["key"] == mutex.hold.key.decode()
            assert doc["holder"]["value"] == "__REVOKE__"
            assert asked.wait(5) and mutex.revocation_requested
            shown = cli("-o", "json", "lock", "show", path)  # still the holder, in the layout
            assert shown.exit_code == 0
            assert assert_valid(shown.stdout)["data"]["holder"]["key"] == doc["holder"]["key"]
        assert client.get_prefix(path + "/").kvs == []
        mutex.close()
