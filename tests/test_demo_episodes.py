"""The demo's lock, election and work-queue episodes on a real etcd (``make demo`` runs them too;
before this file nothing in the suite did, and a layout change broke ``make demo`` unseen)."""

from __future__ import annotations

import re

import pytest

from demo import election_episode, lock_episode, work_queue_episode
from etcd_recipes import connect
from tests.helpers import eventually


@pytest.mark.slow
async def test_the_lock_episode_fences_the_paused_holder_out(etcd_server):
    lines: list[str] = []
    await lock_episode.episode(etcd_server.endpoint, lines.append)
    text = "\n".join(lines)
    tokens = [int(t) for t in re.findall(r"holds the lock, fencing token (\d+)", text)]
    assert len(tokens) == 6 and tokens == sorted(tokens) and len(set(tokens)) == 6, text
    assert "it wakes up: the lock was lost" in text, text
    assert "rejected by etcd" in text and "COMMITTED" not in text, text
    assert "last writer: 'the new holder'" in text, text
    async with connect(**etcd_server.client_kwargs()) as client:
        # Only the fenced write's key stays; every holder's lock key went with its release/lease.
        keys = [kv.key_text for kv in await client.get_prefix("/demo/locks/")]
        assert keys == [lock_episode.LAST], keys


@pytest.mark.slow
async def test_the_election_episode_elects_a_new_leader_after_a_sigkill(etcd_server):
    lines: list[str] = []
    await election_episode.episode(etcd_server.endpoint, lines.append)
    text = "\n".join(lines)
    leaders = re.findall(r"observer: (candidate-\w) leads \(fencing token (\d+)\)", text)
    assert len(leaders) == 2, text
    (first, first_token), (second, second_token) = leaders
    assert first != second and int(second_token) > int(first_token), text
    assert f"SIGKILL {first}" in text, text
    async with connect(**etcd_server.client_kwargs()) as client:

        async def empty() -> bool:  # the candidates were reaped: their leases expire or are revoked
            return await client.count(election_episode.PATH + "/") == 0

        await eventually(empty, timeout=10, what="the candidates' keys to go")


@pytest.mark.slow
async def test_the_work_queue_episode_loses_nothing_and_dead_letters_the_poison(etcd_server):
    lines: list[str] = []
    # The episode asserts its own invariants (each photo acknowledged once, nothing lost, the
    # poison item dead-lettered, only dead-letter keys left before it purges them).
    await work_queue_episode.episode(etcd_server.endpoint, lines.append)
    text = "\n".join(lines)
    assert re.search(r"chaos: SIGKILL worker-[a-z]+ in the middle of photo-\d\d\.jpg", text), text
    assert "lost: nothing" in text and "<- redelivered" in text, text
    assert f"dead letters: [('{work_queue_episode.POISON}', 2)]" in text, text
    async with connect(**etcd_server.client_kwargs()) as client:
        assert await client.count(work_queue_episode.PATH + "/") == 0
