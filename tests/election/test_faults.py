"""Election under faults: a paused server (the leader steps down by itself, its body is
cancelled, its stale fence is rejected), a server restart and a compaction while the observer
is disconnected (it reports the true leader, never a stale one), and terms that came and went
while the observer was cut off (each is reported, or a gap is said)."""

from __future__ import annotations

import asyncio
import time

import pytest

from etcd_recipes import (
    ConnectionState,
    Elected,
    LeaderLatch,
    LeaderObserver,
    LeaderSelector,
    LeadershipGap,
    LeadershipLostError,
    LeadershipTerm,
    Op,
    Vacated,
    connect,
)
from tests.helpers import eventually

TTL = 2


@pytest.mark.slow
async def test_paused_server_makes_the_leader_step_down(fresh_etcd_server, etcd_prefix):
    path, data = etcd_prefix + "election", etcd_prefix + "data"
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as client_a, connect(**kwargs) as client_b:
        entered = asyncio.Event()
        cancelled_at: list[float] = []

        async def take_leadership(term: LeadershipTerm) -> None:
            assert (await client_a.txn([term.compare()], [Op.put(data, "a")])).succeeded
            entered.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled_at.append(time.monotonic())
                raise

        a = LeaderSelector(client_a, path, take_leadership, lease_ttl=TTL, client_id="a")
        states: list[ConnectionState] = []
        a.add_connection_state_listener(lambda new, old: states.append(new))
        run_a = asyncio.create_task(a.run())
        await asyncio.wait_for(entered.wait(), 5)
        term_a = a.term
        assert term_a is not None
        b = LeaderLatch(client_b, path, lease_ttl=TTL, client_id="b")
        await b.start()

        fresh_etcd_server.pause()
        paused_at = time.monotonic()
        try:
            # Renewals get no answer: past the TTL, a steps down on its own -- while the server
            # is still frozen and cannot tell anyone anything.
            # run() returns once its cleanup against the frozen server gave up too (the release's
            # delete is bounded to 5 s); the step-down itself is timed by cancelled_at below.
            with pytest.raises(LeadershipLostError):
                await asyncio.wait_for(run_a, TTL + 8)
            assert not a.is_leader and not term_a.is_current
            assert cancelled_at and cancelled_at[0] - paused_at <= TTL + 1.5
        finally:
            fresh_etcd_server.resume()
        assert ConnectionState.LOST in states
        # The server expires a's lease, b is elected with a higher token.
        assert await b.await_leadership(timeout=15)
        assert b.fencing_token > term_a.fencing_token
        # The old leader's fenced write is rejected; the new leader's commits.
        stale = await client_a.txn([term_a.compare()], [Op.put(data, "stale")])
        assert not stale.succeeded
        assert (await b.guarded_txn([Op.put(data, "b")])).succeeded
        assert (await client_b.get(data)).value == b"b"
        await b.aclose()
        await a.aclose()


@pytest.mark.slow
async def test_observer_reports_the_true_leader_after_a_restart(fresh_etcd_server, etcd_prefix):
    path = etcd_prefix + "election"
    kwargs = fresh_etcd_server.client_kwargs()
    async with connect(**kwargs) as obs_client, connect(**kwargs) as b_client:
        observer = LeaderObserver(obs_client, path)
        await observer.start()
        events: list[object] = []

        async def consume() -> None:
            async for event in observer.events():
                events.append(event)

        consumer = asyncio.create_task(consume())
        a_client = await connect(**kwargs).open()
        a = LeaderLatch(a_client, path, lease_ttl=TTL, client_id="a")
        await a.start()
        assert await a.await_leadership(timeout=5)
        b = LeaderLatch(b_client, path, lease_ttl=TTL, client_id="b")
        await b.start()
        await eventually(lambda: observer.current_leader == "a", what="a observed")

        fresh_etcd_server.kill()
        await a_client.aclose()  # a's process "dies" while the server is down
        fresh_etcd_server.restart()
        # a's term lease can only expire now (the server restarts its TTL): b takes over.
        assert await b.await_leadership(timeout=20)
        await eventually(lambda: observer.current_leader == "b", timeout=15, what="b observed")
        kv = await obs_client.get(path + "/LEADER")
        assert kv.text.startswith("b:")
        assert observer.current == Elected("b", kv.create_revision)
        elected = [e.leader for e in events if isinstance(e, Elected)]
        assert elected == ["a", "b"]  # never "a" again after b was reported
        assert events[-1] == Elected("b", kv.create_revision)
        assert observer.connection_state in (ConnectionState.RECONNECTED, ConnectionState.CONNECTED)
        await b.aclose()
        await a.aclose()
        await observer.aclose()
        await asyncio.wait_for(consumer, 5)


@pytest.mark.slow
async def test_observer_resyncs_after_compaction_while_disconnected(
    etcd_client, etcd_proxy, etcd_prefix
):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="a") as a:
        assert await a.await_leadership(timeout=5)
        async with connect(etcd_proxy.url, keepalive_time=1, keepalive_timeout=0.5) as far:
            async with LeaderObserver(far, path) as observer:
                seen: list[object] = []
                states: list[ConnectionState] = []
                observer.add_listener(seen.append)
                observer.add_connection_state_listener(lambda new, old: states.append(new))
                assert observer.current_leader == "a"
                etcd_proxy.blackhole()
                async with LeaderLatch(etcd_client, path, client_id="b") as b:
                    await a.aclose()
                    assert await b.await_leadership(timeout=5)
                    for i in range(3):
                        await etcd_client.put(etcd_prefix + f"noise/{i}", b"x")
                    rev = (await etcd_client.put(etcd_prefix + "noise/last", b"x")).revision
                    await etcd_client.compact(rev)
                    await asyncio.sleep(2.5)  # keepalive notices the dead peer
                    assert observer.current_leader == "a"  # last known; state says SUSPENDED
                    etcd_proxy.restore()
                    await eventually(
                        lambda: observer.current_leader == "b", timeout=15, what="resynced"
                    )
                    # The hand-over was compacted away: said so, then the truth.
                    assert len(seen) == 2 and isinstance(seen[0], LeadershipGap)
                    assert seen[0].revision >= rev > seen[0].after_revision
                    assert seen[1] == Elected("b", b.fencing_token)
                    assert ConnectionState.SUSPENDED in states
                    assert ConnectionState.RECONNECTED in states


@pytest.mark.slow
async def test_observer_reports_every_term_it_missed_while_blackholed(
    etcd_client, etcd_proxy, etcd_prefix
):
    """Issue 16 item 23: several leadership changes while the observer's connection is
    blackholed. The watch replays them after the recovery; every term (and its fencing token)
    is reported, in order, and no gap is claimed because none happened."""
    path = etcd_prefix + "election"
    async with connect(etcd_proxy.url, keepalive_time=1, keepalive_timeout=0.5) as far:
        async with LeaderObserver(far, path) as observer:
            seen: list[object] = []
            states: list[ConnectionState] = []
            observer.add_listener(seen.append)
            observer.add_connection_state_listener(lambda new, old: states.append(new))
            etcd_proxy.blackhole()
            tokens = []
            for name in ("a", "b", "c"):
                async with LeaderLatch(etcd_client, path, client_id=name) as latch:
                    assert await latch.await_leadership(timeout=5)
                    tokens.append(latch.fencing_token)
            async with LeaderLatch(etcd_client, path, client_id="d") as last:
                assert await last.await_leadership(timeout=5)
                tokens.append(last.fencing_token)
                await asyncio.sleep(2.5)  # keepalive notices the dead peer
                assert seen == []  # nothing seen while cut off
                etcd_proxy.restore()
                await eventually(
                    lambda: observer.current_leader == "d", timeout=15, what="recovered"
                )
                assert ConnectionState.SUSPENDED in states
                assert observer.connection_state is ConnectionState.RECONNECTED
            await eventually(lambda: observer.current_leader is None, what="vacated")
            expected = []
            for name, token in zip("abcd", tokens):
                expected += [Elected(name, token), Vacated()]
            assert seen == expected
