"""LeaderSelector against a real etcd: terms, relinquish, reuse, step-down on loss, fencing,
cancellation and close."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from etcd_recipes import (
    ConnectionState,
    DuplicateParticipantError,
    LeaderLatch,
    LeaderSelector,
    LeadershipLostError,
    LeadershipTerm,
    Op,
    Participant,
    RecipeClosedError,
    get_participants,
)
from tests.helpers import eventually, take


async def _keys(client, prefix: str) -> list[str]:
    return [kv.key_text for kv in await client.get_prefix(prefix)]


async def test_terms_run_one_at_a_time_and_always_relinquish(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    log: list[tuple[str, str, int]] = []
    flags: dict[str, list[bool]] = {}
    seen_participants: list[list[Participant]] = []
    all_started = asyncio.Event()

    def make(i: int) -> LeaderSelector:
        cid = f"cand-{i}"

        async def take_leadership(term: LeadershipTerm) -> None:
            assert term.is_current and term.leader_id == cid
            kv = await etcd_client.get(path + "/LEADER")
            assert kv.text == term.value and kv.create_revision == term.fencing_token
            log.append(("take", cid, term.fencing_token))
            await all_started.wait()
            seen_participants.append(await get_participants(etcd_client, path))
            await asyncio.sleep(0.1)

        async def relinquish(term: LeadershipTerm) -> None:
            log.append(("relinquish", cid, term.fencing_token))

        selector = LeaderSelector(
            etcd_client, path, take_leadership, relinquish=relinquish, client_id=cid
        )
        flags[cid] = []
        selector.add_leadership_listener(flags[cid].append)
        return selector

    selectors = [make(i) for i in range(3)]
    for s in selectors:
        assert await s.start() is s
        assert s.is_active
    all_started.set()
    for s in selectors:
        assert await s.wait_until_finished(timeout=10)
    await eventually(lambda: all(f == [True, False] for f in flags.values()), what="listeners")
    # Each term: take then relinquish, never interleaved; tokens strictly increase.
    assert [entry[0] for entry in log] == ["take", "relinquish"] * 3
    tokens = [entry[2] for entry in log[::2]]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert {entry[1] for entry in log} == {"cand-0", "cand-1", "cand-2"}
    # The first leader saw all three candidates, itself marked as the leader.
    first = seen_participants[0]
    assert sorted(p.client_id for p in first) == ["cand-0", "cand-1", "cand-2"]
    assert [p.client_id for p in first if p.is_leader] == [log[0][1]]
    for s in selectors:
        assert not s.is_leader and not s.is_active
        assert s.term is not None and not s.term.is_current and not s.term.is_lost
        assert s.fencing_token is None
        assert not s.has_exceptions
        await s.aclose()
    assert await _keys(etcd_client, etcd_prefix) == []


async def test_selector_is_reusable_across_terms(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    tokens: list[int] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        tokens.append(term.fencing_token)

    async with LeaderSelector(etcd_client, path, take_leadership) as selector:
        assert not selector.is_active  # async with does not run for election
        await selector.start()
        await selector.wait_until_finished(timeout=5)
        assert not selector.is_started  # the candidacy is over: start() may run again
        first = await selector.run()
        assert first is not None and first.fencing_token == tokens[-1]
        await selector.start()
        assert await selector.start() is selector  # a no-op while a candidacy runs
        await selector.wait_until_finished(timeout=5)
        assert len(tokens) == 3 and tokens == sorted(tokens)
        assert selector.term is not None and selector.term.fencing_token == tokens[-1]
    assert await _keys(etcd_client, etcd_prefix) == []


async def test_failing_take_leadership_is_relinquished_and_reported(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    relinquished: list[int] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        raise ValueError("boom")

    async def relinquish(term: LeadershipTerm) -> None:
        relinquished.append(term.fencing_token)

    async with LeaderSelector(
        etcd_client, path, take_leadership, relinquish=relinquish
    ) as selector:
        await selector.start()
        # In the background the failure is recorded, never raised at anyone.
        await selector.wait_until_finished(timeout=5)
        assert any(isinstance(e.exception, ValueError) for e in selector.exceptions)
        # run() hands it to its caller.
        with pytest.raises(ValueError, match="boom"):
            await selector.run()
        assert len(relinquished) == 2
    assert await etcd_client.get(path + "/LEADER") is None


@pytest.mark.parametrize("how", ["revoke-lease", "delete-key"])
async def test_loss_steps_down_at_once_and_fences_the_old_term(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "election"
    data = etcd_prefix + "data"
    entered = asyncio.Event()
    finished_body = False
    relinquished: list[bool] = []
    states: list[ConnectionState] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        nonlocal finished_body
        assert (await etcd_client.txn([term.compare()], [Op.put(data, b"first")])).succeeded
        entered.set()
        await asyncio.sleep(30)
        finished_body = True

    async def relinquish(term: LeadershipTerm) -> None:
        relinquished.append(term.is_current)

    selector = LeaderSelector(etcd_client, path, take_leadership, relinquish=relinquish)
    flags: list[bool] = []
    selector.add_leadership_listener(flags.append)
    selector.add_connection_state_listener(lambda new, old: states.append(new))
    run = asyncio.create_task(selector.run())
    await asyncio.wait_for(entered.wait(), 5)
    term = selector.term
    assert term is not None and selector.is_leader
    if how == "revoke-lease":
        await etcd_client.lease_revoke(term.lease_id)
    else:
        await etcd_client.delete(path + "/LEADER")
    with pytest.raises(LeadershipLostError):
        await asyncio.wait_for(run, 5)
    assert not finished_body and not selector.is_leader
    assert term.is_lost and not term.is_current and relinquished == [False]
    await eventually(lambda: flags == [True, False], what="not-leader notification")
    await eventually(lambda: ConnectionState.LOST in states, what="LOST state")
    assert any(isinstance(e.exception, LeadershipLostError) for e in selector.exceptions)
    # The stale term's fence rejects writes, and guarded_txn refuses outright.
    assert not (await etcd_client.txn([term.compare()], [Op.put(data, b"stale")])).succeeded
    with pytest.raises(LeadershipLostError):
        await selector.guarded_txn([Op.put(data, b"stale")])
    # A new term (of anyone) gets a higher token.
    async with LeaderLatch(etcd_client, path) as latch:
        assert await latch.await_leadership(timeout=5)
        assert latch.fencing_token > term.fencing_token
        assert (await latch.guarded_txn([Op.put(data, b"second")])).succeeded
    assert (await etcd_client.get(data)).value == b"second"
    await selector.aclose()


async def test_cancel_on_loss_false_lets_the_body_finish(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    entered = asyncio.Event()
    saw: list[bool] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        entered.set()
        while term.is_current:
            await asyncio.sleep(0.02)
        saw.append(selector.is_leader)

    selector = LeaderSelector(etcd_client, path, take_leadership, cancel_on_loss=False)
    run = asyncio.create_task(selector.run())
    await asyncio.wait_for(entered.wait(), 5)
    await etcd_client.lease_revoke(selector.term.lease_id)
    term = await asyncio.wait_for(run, 5)  # returned normally: the body was not cancelled
    assert term is not None and term.is_lost and saw == [False]
    await selector.aclose()


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
async def test_cancelled_campaign_withdraws(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="holder") as holder:
        assert await holder.await_leadership(timeout=5)
        leader_before = await etcd_client.get(path + "/LEADER")
        leases_before = etcd_client._leases.lease_count
        watches_before = etcd_client._watch_hub.watcher_count

        async def never(term: LeadershipTerm) -> None:  # pragma: no cover - never elected
            raise AssertionError("elected while another candidate leads")

        selector = LeaderSelector(etcd_client, path, never, client_id="campaigner")
        if how == "task-cancel":
            task = asyncio.create_task(selector.run())
            await eventually(
                lambda: _has_participant(etcd_client, path, "campaigner"), what="candidacy"
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "anyio-fail-after":
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.5):
                    await selector.run()
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await selector.run()
        # Nothing of the campaigner's is left; the holder is untouched.
        assert await etcd_client.get(path + "/participants/campaigner") is None
        assert await etcd_client.get(path + "/LEADER") == leader_before
        assert etcd_client._leases.lease_count == leases_before
        await eventually(
            lambda: etcd_client._watch_hub.watcher_count == watches_before, what="watch cleanup"
        )
        assert not selector.is_active
        await selector.aclose()


async def _has_participant(client, path: str, cid: str) -> bool:
    return await client.get(f"{path}/participants/{cid}") is not None


async def test_cancelled_term_is_relinquished_and_released(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    entered = asyncio.Event()
    relinquished: list[int] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        entered.set()
        await asyncio.sleep(30)

    async def relinquish(term: LeadershipTerm) -> None:
        relinquished.append(term.fencing_token)

    selector = LeaderSelector(etcd_client, path, take_leadership, relinquish=relinquish)
    with pytest.raises(TimeoutError):
        with anyio.fail_after(1):
            await selector.run()
    assert len(relinquished) == 1
    assert await _keys(etcd_client, etcd_prefix) == []
    await selector.aclose()


async def test_aclose_ends_a_campaign_and_a_term(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path) as holder:
        assert await holder.await_leadership(timeout=5)

        async def never(term: LeadershipTerm) -> None:  # pragma: no cover
            raise AssertionError("elected")

        waiting = LeaderSelector(etcd_client, path, never)
        run = asyncio.create_task(waiting.run())
        await asyncio.sleep(0.3)
        await waiting.aclose()
        assert await asyncio.wait_for(run, 5) is None  # closed before winning
        with pytest.raises(RecipeClosedError):
            await waiting.run()
    # Close during a background term: the body is cancelled, relinquish runs, keys go.
    entered = asyncio.Event()
    cancelled: list[bool] = []
    relinquished: list[bool] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def relinquish(term: LeadershipTerm) -> None:
        relinquished.append(True)

    leader = LeaderSelector(etcd_client, path, take_leadership, relinquish=relinquish)
    await leader.start()
    await asyncio.wait_for(entered.wait(), 5)
    await leader.aclose()
    assert cancelled == [True] and relinquished == [True]
    assert not leader.is_leader and not leader.is_active
    assert await _keys(etcd_client, etcd_prefix) == []


async def test_guarded_txn_commits_only_while_leading(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    data = etcd_prefix + "data"
    results: list[bool] = []

    async def take_leadership(term: LeadershipTerm) -> None:
        r = await selector.guarded_txn([Op.put(data, b"v1")])
        results.append(r.succeeded)
        assert selector.fencing_token == term.fencing_token

    selector = LeaderSelector(etcd_client, path, take_leadership)
    with pytest.raises(LeadershipLostError):
        await selector.guarded_txn([Op.put(data, b"never")])  # never led
    term = await selector.run()
    assert results == [True]
    assert (await etcd_client.get(data)).value == b"v1"
    with pytest.raises(LeadershipLostError):
        await selector.guarded_txn([Op.put(data, b"after")])
    assert not (await etcd_client.txn([term.compare()], [Op.put(data, b"after")])).succeeded
    await selector.aclose()


@pytest.mark.slow
async def test_duplicate_client_id_is_refused(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="same", lease_ttl=1):
        other = LeaderLatch(etcd_client, path, client_id="same", lease_ttl=1)
        with pytest.raises(DuplicateParticipantError):
            await other.start()
        assert not other.is_started
        await other.aclose()
    # A leftover key of the same id (a process that just died) is waited for, not refused.
    lease = await etcd_client.lease_grant(1)
    await etcd_client.put(path + "/participants/same", "same", lease=lease.id)
    async with LeaderLatch(etcd_client, path, client_id="same", lease_ttl=1) as latch:
        assert await latch.await_leadership(timeout=5)


async def test_misuse(etcd_client, etcd_prefix):
    async def body(term: LeadershipTerm) -> None:
        await asyncio.sleep(0.2)

    with pytest.raises(ValueError):
        LeaderSelector(etcd_client, etcd_prefix + "e", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LeaderSelector(etcd_client, etcd_prefix + "e", body, lease_ttl=0)
    with pytest.raises(ValueError):
        LeaderSelector(etcd_client, "", body)
    selector = LeaderSelector(etcd_client, etcd_prefix + "e", body)
    with pytest.raises(ValueError):
        await selector.wait_until_finished(timeout=0)
    await selector.start()
    with pytest.raises(RuntimeError):  # AlreadyStartedError: run() during a candidacy
        await selector.run()
    await selector.aclose()
    await selector.aclose()
    with pytest.raises(RecipeClosedError):
        await selector.start()


async def test_selector_leadership_events_span_candidacies(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"

    async def take_leadership(term: LeadershipTerm) -> None:
        await asyncio.sleep(0.05)

    selector = LeaderSelector(etcd_client, path, take_leadership)
    leading = selector.leadership_events()
    flags: list[bool] = []
    selector.add_leadership_listener(flags.append)
    assert await take(leading, 1) == [False]
    for _ in range(2):  # one stream across two candidacies
        assert await selector.run() is not None
        assert await take(leading, 2) == [True, False]
    await selector.aclose()
    assert [item async for item in leading] == []  # closed while not leading: just the end
    assert flags == [True, False, True, False]
    assert await _keys(etcd_client, path + "/") == []
