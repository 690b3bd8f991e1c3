"""STM against a real etcd: commits, each isolation level's defining behaviour, retries that
run out, cancellation, and attempts that survive a compaction and a server restart."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    STM,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Isolation,
    StmConflictError,
    UsageError,
    connect,
    run_stm,
)

LEVELS = list(Isolation)


async def _value(client, key):
    kv = await client.get(key)
    return None if kv is None else kv.value


async def test_transfer_commits_in_one_transaction(etcd_client, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    await etcd_client.put(a, b"100")
    stm = STM(etcd_client)

    async def transfer(tx):
        x = int(await tx.get(a) or b"0")
        y = int(await tx.get(b) or b"0")
        tx.put(a, str(x - 40))
        tx.put(b, str(y + 40))
        return x - 40

    assert await stm.run(transfer) == 60
    assert stm.attempts == 1
    assert await _value(etcd_client, a) == b"60"
    kv_b = await etcd_client.get(b)
    assert kv_b.value == b"40"
    assert (await etcd_client.get(a)).mod_revision == kv_b.mod_revision == stm.revision
    assert "idle" in repr(stm) and "serializable-snapshot" in repr(stm)


async def test_read_your_writes_delete_and_rev(etcd_client, etcd_prefix):
    k, gone = etcd_prefix + "k", etcd_prefix + "gone"
    created = (await etcd_client.put(gone, b"x")).revision

    async def body(tx):
        assert await tx.rev(gone) == created
        assert await tx.get(k) is None
        tx.put(k, "one")
        tx.put(k, b"two")
        assert await tx.get(k) == b"two"  # the run's last write
        tx.delete(gone)
        assert await tx.get(gone) is None
        return "done"

    assert await run_stm(etcd_client, body) == "done"
    assert await _value(etcd_client, k) == b"two"
    assert await etcd_client.get(gone) is None


async def test_bad_input_and_misuse_write_nothing(etcd_client, etcd_prefix):
    with pytest.raises(InvalidArgumentError):
        STM(etcd_client, isolation="bogus")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        STM(etcd_client, max_retries=-1)
    with pytest.raises(InvalidArgumentTypeError):
        STM(etcd_client, prefetch=etcd_prefix + "one-key")
    with pytest.raises(InvalidArgumentTypeError):
        STM(object())  # type: ignore[arg-type]
    assert STM(etcd_client, isolation="read-committed").isolation is Isolation.READ_COMMITTED  # type: ignore[arg-type]
    stm = STM(etcd_client)
    with pytest.raises(InvalidArgumentTypeError):
        await stm.run("not callable")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        stm.put(etcd_prefix + "outside", b"x")  # outside a run
    with pytest.raises(UsageError):
        await stm.get(etcd_prefix + "outside")

    async def nested(tx):
        tx.put(etcd_prefix + "nested", b"x")
        await tx.run(nested)  # one run at a time

    with pytest.raises(UsageError):
        await stm.run(nested)
    assert (await etcd_client.get_prefix(etcd_prefix)).kvs == []


async def test_apply_error_ends_the_run_with_nothing_written(etcd_client, etcd_prefix):
    stm = STM(etcd_client)

    async def failing(tx):
        tx.put(etcd_prefix + "half", b"written?")
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await stm.run(failing)
    assert stm.attempts == 1
    assert await etcd_client.get(etcd_prefix + "half") is None


@pytest.mark.parametrize("isolation", LEVELS)
async def test_concurrent_increments_lose_updates_only_under_read_committed(
    etcd_client, etcd_prefix, isolation
):
    """Both runs read the counter before either writes (their first attempts meet at a
    barrier): read committed commits both (one update lost); every other level makes the
    second one retry on the new value."""
    key = etcd_prefix + "n"
    await etcd_client.put(key, b"0")
    both_read = asyncio.Event()
    first_attempts = 0

    async def increment(tx):
        nonlocal first_attempts
        n = int(await tx.get(key) or b"0")
        if first_attempts < 2:
            first_attempts += 1
            if first_attempts == 2:
                both_read.set()
            await both_read.wait()
        tx.put(key, str(n + 1))

    stms = [STM(etcd_client, isolation=isolation) for _ in range(2)]
    await asyncio.gather(*(s.run(increment) for s in stms))
    attempts = sorted(s.attempts for s in stms)
    if isolation is Isolation.READ_COMMITTED:
        assert await _value(etcd_client, key) == b"1"  # a lost update
        assert attempts == [1, 1]
    else:
        assert await _value(etcd_client, key) == b"2"
        assert attempts == [1, 2]


@pytest.mark.parametrize("isolation", LEVELS)
async def test_blind_write_conflicts_only_under_serializable_snapshot(
    etcd_client, etcd_prefix, isolation
):
    """The run reads ``a`` and writes ``b`` without reading it; someone writes ``b`` between
    the run's snapshot and its commit. Only the snapshot level checks written keys."""
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    await etcd_client.put(a, b"1")
    stm = STM(etcd_client, isolation=isolation)

    async def blind(tx):
        await tx.get(a)
        if stm.attempts == 1:
            await etcd_client.put(b, b"theirs")
        tx.put(b, b"mine")

    await stm.run(blind)
    assert await _value(etcd_client, b) == b"mine"
    assert stm.attempts == (2 if isolation is Isolation.SERIALIZABLE_SNAPSHOT else 1)


@pytest.mark.parametrize("isolation", LEVELS)
async def test_snapshot_reads_only_at_the_serializable_levels(etcd_client, etcd_prefix, isolation):
    """``b`` changes after the run read ``a``: the serializable levels read ``b`` from the
    run's snapshot (the old value), the others read the latest one."""
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    await etcd_client.put(a, b"1")
    await etcd_client.put(b, b"old")
    stm = STM(etcd_client, isolation=isolation)
    seen: list[bytes | None] = []

    async def body(tx):
        await tx.get(a)
        if stm.attempts == 1:
            await etcd_client.put(b, b"new")
        seen.append(await tx.get(b))

    await stm.run(body)
    snapshot = isolation in (Isolation.SERIALIZABLE_SNAPSHOT, Isolation.SERIALIZABLE)
    assert seen[0] == (b"old" if snapshot else b"new")
    # A stale snapshot read fails the commit's compare, so the serializable levels retry.
    assert seen == ([b"old", b"new"] if snapshot else [b"new"])


@pytest.mark.parametrize("isolation", LEVELS)
async def test_a_key_read_twice_returns_the_same_value(etcd_client, etcd_prefix, isolation):
    """Every level caches its reads; all but read committed then refuse to commit on a value
    that changed under the run."""
    key, out = etcd_prefix + "k", etcd_prefix + "out"
    await etcd_client.put(key, b"v1")
    stm = STM(etcd_client, isolation=isolation)
    pairs: list[tuple[bytes | None, bytes | None]] = []

    async def body(tx):
        first = await tx.get(key)
        if stm.attempts == 1:
            await etcd_client.put(key, b"v2")
        pairs.append((first, await tx.get(key)))
        tx.put(out, first or b"")

    await stm.run(body)
    assert pairs[0] == (b"v1", b"v1")
    if isolation is Isolation.READ_COMMITTED:
        assert stm.attempts == 1 and await _value(etcd_client, out) == b"v1"
    else:
        assert stm.attempts == 2 and await _value(etcd_client, out) == b"v2"


async def test_retries_run_out_with_a_typed_error_and_nothing_written(etcd_client, etcd_prefix):
    hot, result = etcd_prefix + "hot", etcd_prefix + "result"

    async def always_conflicts(tx):
        await tx.get(hot)
        await etcd_client.put(hot, b"changed under the run")
        tx.put(result, b"never")

    stm = STM(etcd_client, max_retries=3)
    with pytest.raises(StmConflictError) as caught:
        await stm.run(always_conflicts)
    assert caught.value.attempts == 4 == stm.attempts
    assert await etcd_client.get(result) is None
    with pytest.raises(StmConflictError):
        await run_stm(etcd_client, always_conflicts, max_retries=0)


async def test_prefetch_reads_keys_before_apply(etcd_client, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    await etcd_client.put(a, b"1")
    await etcd_client.put(b, b"2")
    stm = STM(etcd_client, prefetch=[a, b])
    seen = []

    async def body(tx):
        seen.append(len(tx._reads))  # prefetched before apply ran
        if tx.attempts == 1:
            await etcd_client.put(b, b"3")  # conflicts: the commit's failure branch re-reads
        tx.put(a, (await tx.get(b)) or b"")

    await stm.run(body)
    assert seen == [2, 2] and stm.attempts == 2
    assert await _value(etcd_client, a) == b"3"


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_cancelled_mid_apply_writes_nothing(etcd_client, etcd_prefix, how):
    stm = STM(etcd_client)
    inside = asyncio.Event()

    async def slow(tx):
        await tx.get(etcd_prefix + "a")
        tx.put(etcd_prefix + "a", b"x")
        tx.put(etcd_prefix + "b", b"y")
        inside.set()
        await asyncio.Event().wait()

    if how == "cancel":
        task = asyncio.create_task(stm.run(slow))
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await stm.run(slow)
    assert (await etcd_client.get_prefix(etcd_prefix)).kvs == []
    # The instance is usable again.
    assert await stm.run(lambda tx: asyncio.sleep(0, "ok")) == "ok"


@pytest.mark.parametrize("isolation", [Isolation.SERIALIZABLE_SNAPSHOT, Isolation.SERIALIZABLE])
async def test_snapshot_compacted_mid_apply_restarts_the_attempt(
    etcd_client, etcd_prefix, isolation
):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    await etcd_client.put(a, b"1")
    await etcd_client.put(b, b"old")
    stm = STM(etcd_client, isolation=isolation)

    async def body(tx):
        await tx.get(a)
        if tx.attempts == 1:
            rev = (await etcd_client.put(b, b"new")).revision
            await etcd_client.compact(rev)  # the run's snapshot is gone
        value = await tx.get(b)
        tx.put(etcd_prefix + "copy", value or b"")

    await stm.run(body)
    assert stm.attempts == 2
    assert await _value(etcd_client, etcd_prefix + "copy") == b"new"


@pytest.mark.slow
async def test_run_survives_a_server_restart_mid_apply(fresh_etcd_server, etcd_prefix):
    a, b = etcd_prefix + "a", etcd_prefix + "b"
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        await client.put(a, b"10")
        stm = STM(client)

        async def body(tx):
            x = int(await tx.get(a) or b"0")
            if tx.attempts == 1:
                fresh_etcd_server.kill()
                await asyncio.sleep(0.3)
                fresh_etcd_server.restart()
            y = int(await tx.get(b) or b"0")  # read at the snapshot, after the restart
            tx.put(a, str(x - 1))
            tx.put(b, str(y + 1))

        await asyncio.wait_for(stm.run(body), 30)
        assert stm.attempts == 1
        assert await _value(client, a) == b"9"
        assert await _value(client, b) == b"1"
