"""A cancellation that lands while a lease grant is in flight leaves no lease behind (issue 16
item 18): the lease machinery waits for the grant's answer and revokes it, for every recipe
that starts a candidacy, an arrival or a presence. Checked the hard way: 40 randomized trials
per recipe against a private etcd, then etcd's own lease list must be empty, and a cancelled
candidacy must never become leader afterwards."""

from __future__ import annotations

import asyncio
import random

import anyio
import pytest

from etcd_recipes import (
    DistributedBarrierWithCount,
    LeaderLatch,
    LeaderSelector,
    LeadershipTerm,
    connect,
)
from etcd_recipes import sync as blocking
from tests.queues.helpers import server_leases

TRIALS = 40


def _delays(seed: int) -> list[float]:
    rng = random.Random(seed)
    # Mostly inside the first milliseconds (the grant's round trip), some a little later.
    return [rng.choice((rng.uniform(0, 0.004), rng.uniform(0, 0.03))) for _ in range(TRIALS)]


async def _no_leases_left(client) -> set[int]:
    # A revoke answered after the caller's cancellation is part of the cleanup; give the server
    # a moment for a grant answered at the very end of the bounded wait.
    for _ in range(20):
        left = await server_leases(client)
        if not left:
            return left
        await asyncio.sleep(0.05)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["selector-run", "latch-start", "latch-await", "counted"])
async def test_cancelling_at_the_start_leaves_no_lease(fresh_etcd_server, recipe):
    path = "/grant-cancel/" + recipe
    led: list[str] = []
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        # A holder, so that a candidate never wins before it is cancelled; its leases are
        # the only ones allowed to remain.
        holder = LeaderLatch(client, path, client_id="holder", lease_ttl=30)
        await holder.start()
        assert await holder.await_leadership(timeout=10)
        allowed = await server_leases(client)
        for i, delay in enumerate(_delays(hash(recipe) & 0xFFFF)):
            cid = f"c{i}"

            async def take_leadership(term: LeadershipTerm, cid: str = cid) -> None:
                led.append(cid)

            selector = LeaderSelector(client, path, take_leadership, client_id=cid, lease_ttl=30)
            latch = LeaderLatch(client, path, client_id=cid, lease_ttl=30)
            counted = DistributedBarrierWithCount(
                client, path + "/gate", member_count=2, lease_ttl=30
            )
            try:
                with anyio.move_on_after(delay):
                    if recipe == "selector-run":
                        await selector.run()
                    elif recipe == "latch-start":
                        await latch.start()
                        await latch.aclose()  # started before the deadline: withdraw
                    elif recipe == "latch-await":
                        await latch.start()
                        await latch.await_leadership()
                    else:
                        await counted.wait_on_barrier()
            finally:
                # Closing cannot revoke a lease nobody recorded: what leaked stays (TTL 30 s).
                await latch.aclose()
                await selector.aclose()
                await counted.aclose()
            left = await _no_leases_left(client) - allowed
            assert not left, f"trial {i} (cancelled after {delay * 1000:.2f} ms) left {left}"
        # Hand leadership over: a cancelled candidacy must never win it later.
        await holder.aclose()
        await asyncio.sleep(0.5)
        assert led == []
        assert await client.get(path + "/LEADER") is None
        assert [kv.key_text for kv in await client.get_prefix(path + "/participants/")] == []
        assert await server_leases(client) == set()


@pytest.mark.slow
def test_blocking_cancelled_await_leadership_never_leads_later(fresh_etcd_server):
    """The sync facade's deadline (``fail_after``) cancelling ``start()`` or
    ``await_leadership()`` in their first milliseconds: no lease stays, and once the holder
    steps down none of the cancelled latches becomes leader."""
    path = "/grant-cancel/blocking"
    rng = random.Random(16)
    with blocking.connect(**fresh_etcd_server.client_kwargs()) as client:
        holder = blocking.LeaderLatch(client, path, client_id="holder", lease_ttl=30)
        holder.start()
        assert holder.await_leadership(timeout=10)

        def leases() -> set[int]:
            return client._rt.call(server_leases, client._a)

        allowed = leases()
        latches = []
        for i in range(TRIALS):
            latch = blocking.LeaderLatch(client, path, client_id=f"c{i}", lease_ttl=30)
            latches.append(latch)
            try:
                with blocking.fail_after(rng.uniform(0.0005, 0.02)):
                    latch.start()
                    latch.await_leadership(timeout=5)
            except TimeoutError:
                pass
            if not latch.is_started:  # cancelled: it must hold nothing
                left = leases() - allowed
                assert not left, f"trial {i} left {left}"
            else:  # a live candidate (cancelled await_leadership closed it, else it runs)
                assert latch.is_closed or latch.is_started
        holder.close()
        leaders = []
        for latch in latches:
            if latch.is_started and latch.await_leadership(timeout=0.05):
                leaders.append(latch.client_id)
        for latch in latches:
            latch.close()
        # Started latches that were not cancelled are candidates by contract and may lead;
        # a cancelled one (not started, or closed by the cancellation) never does.
        cancelled = [latch.client_id for latch in latches if not latch.is_started]
        assert not set(leaders) & set(cancelled)
        assert leases() == set()
