"""``proclaim(value)`` on a LeaderLatch / LeaderSelector term (Go's ``Election.Proclaim``):
observers see the new value in the same term (same leader, same fencing token, no new term);
a deposed leader cannot proclaim (typed error, nothing written); a value left by an earlier
term is never reported as the current one's; a proclamation made while an observer was cut
off and the history compacted is still reported, without a gap."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from etcd_recipes import (
    Elected,
    LeaderLatch,
    LeaderObserver,
    LeaderSelector,
    LeadershipGap,
    LeadershipLostError,
    LeadershipTerm,
    connect,
)
from etcd_recipes.election.inspection import resign_leader
from tests.helpers import eventually


async def test_observers_see_the_value_in_the_same_term(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="node-1") as latch:
        assert await latch.await_leadership(timeout=10)
        token = latch.fencing_token
        async with LeaderObserver(etcd_client, path) as observer:
            heard: list[object] = []
            observer.add_listener(heard.append)
            events = observer.events()
            assert await anext(events) == Elected("node-1", token)  # nothing proclaimed yet
            leader_key = await etcd_client.get(path + "/LEADER")
            first = await latch.proclaim("10.0.0.7:8080")
            assert await anext(events) == Elected("node-1", token, b"10.0.0.7:8080")
            second = await latch.proclaim(b"draining")
            assert second > first
            assert await anext(events) == Elected("node-1", token, b"draining")
            await eventually(lambda: len(heard) == 2, what="the listener")
            assert all(isinstance(e, Elected) and e.fencing_token == token for e in heard)
            assert latch.fencing_token == token and latch.is_leader  # no new term
            assert await etcd_client.get(path + "/LEADER") == leader_key  # LEADER untouched
            kv = await etcd_client.get(path + "/LEADER/value")
            assert kv.value == b"draining" and kv.lease == latch.lease_id  # on the term lease
        async with LeaderObserver(etcd_client, path) as late:  # a new observer reads it
            assert late.current == Elected("node-1", token, b"draining")
    # The term ended: its value went with its lease.
    assert await etcd_client.get(path + "/LEADER/value") is None


async def test_a_selector_proclaims_from_its_term(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderObserver(etcd_client, path) as observer:
        events = observer.events()
        await anext(events)  # Vacated

        async def take_leadership(term: LeadershipTerm) -> None:
            await selector.proclaim("ready")
            while observer.current != Elected(term.leader_id, term.fencing_token, b"ready"):
                await asyncio.sleep(0.02)

        async with LeaderSelector(etcd_client, path, take_leadership) as selector:
            term = await selector.run()
        assert term is not None
        seen = [await anext(events) for _ in range(3)]
        assert seen[:2] == [
            Elected(selector.client_id, term.fencing_token),
            Elected(selector.client_id, term.fencing_token, b"ready"),
        ]


async def _hold_until_lost(term: LeadershipTerm) -> None:
    while term.is_current:
        await asyncio.sleep(0.02)


async def _leading(selector: LeaderSelector) -> bool:
    for _ in range(500):
        if selector.is_leader:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_deposed_or_non_leader_cannot_proclaim(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    value_key = path + "/LEADER/value"
    waiting = LeaderLatch(etcd_client, path, client_id="never")
    with pytest.raises(LeadershipLostError):
        await waiting.proclaim("x")  # never led
    async with LeaderLatch(etcd_client, path, client_id="a") as a:
        assert await a.await_leadership(timeout=10)
        await a.proclaim("mine")
        term = a.term
        await etcd_client.delete(path + "/LEADER")  # deposed out of band; a may not know yet
        with pytest.raises(LeadershipLostError):
            await a.proclaim("still mine?")  # the guard (or the loss seen) refuses it
        left = await etcd_client.get(value_key)  # the old term's value, or gone with its lease
        assert left is None or left.value == b"mine"  # never the refused one
        await eventually(lambda: term.is_lost, what="a's term to be lost")
        # (the latch contests again by itself and may already lead a new term)
    async with LeaderSelector(etcd_client, path, _hold_until_lost, client_id="b") as b:
        await b.start()  # the candidacy runs in the background
        assert await _leading(b)
        resigned = await resign_leader(etcd_client, path)  # the operator ends b's term
        assert resigned is not None and resigned.client_id == "b"
        with pytest.raises(LeadershipLostError):  # a selector does not contest again
            await b.proclaim("after resign")
    await waiting.aclose()
    assert await etcd_client.get(value_key) is None


async def test_a_value_of_an_earlier_term_is_not_the_current_terms(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    await etcd_client.put(path + "/LEADER/value", b"stale")  # left behind, on no lease
    async with LeaderLatch(etcd_client, path, client_id="b") as b:
        assert await b.await_leadership(timeout=10)
        async with LeaderObserver(etcd_client, path) as observer:
            assert observer.current == Elected("b", b.fencing_token)  # not b"stale"
            events = observer.events()
            await anext(events)
            await b.proclaim("fresh")
            assert await anext(events) == Elected("b", b.fencing_token, b"fresh")


@pytest.mark.slow
async def test_a_proclamation_made_while_the_observer_was_cut_off_is_seen_without_a_gap(
    etcd_client, etcd_proxy, etcd_prefix
):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="a") as a:
        assert await a.await_leadership(timeout=10)
        async with (
            connect(etcd_proxy.url, keepalive_time=1, keepalive_timeout=0.5) as far,
            LeaderObserver(far, path) as observer,
        ):
            seen: list[object] = []
            observer.add_listener(seen.append)
            etcd_proxy.blackhole()
            await a.proclaim("v1")
            written = await a.proclaim("v2")
            await etcd_client.compact(written)
            await asyncio.sleep(2.5)  # keepalive notices the dead peer
            etcd_proxy.restore()
            want = Elected("a", a.fencing_token, b"v2")
            await eventually(lambda: observer.current == want, timeout=15, what="the value")
            await eventually(lambda: seen != [], what="the listener")
            assert not any(isinstance(e, LeadershipGap) for e in seen)  # the same term
            assert seen[-1] == want


def test_the_blocking_facade_proclaims_from_a_thread(etcd_server: Any, etcd_prefix: str):
    from etcd_recipes.sync import LeaderLatch as SyncLatch
    from etcd_recipes.sync import LeaderObserver as SyncObserver
    from etcd_recipes.sync import connect as sync_connect

    path = etcd_prefix + "election"
    with sync_connect(**etcd_server.client_kwargs()) as client:
        with SyncLatch(client, path, client_id="t") as latch:
            assert latch.await_leadership(timeout=10)
            obs = SyncObserver(client, path).start()
            events = obs.events()
            assert next(events) == Elected("t", latch.fencing_token)
            done: list[int] = []
            thread = threading.Thread(target=lambda: done.append(latch.proclaim("from a thread")))
            thread.start()
            thread.join(20)
            assert done and next(events) == Elected("t", latch.fencing_token, b"from a thread")
            obs.close()
