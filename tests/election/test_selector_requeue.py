"""LeaderSelector as the reference's listener sees it (issue 16 item 10): the hook gets the
selector and the term, ``auto_requeue`` campaigns again after each term, and the blocking
facade hands a blocking hook the blocking selector."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import LeaderSelector, LeadershipLostError, LeadershipTerm
from etcd_recipes import sync as blocking
from tests.helpers import eventually


async def test_take_leadership_and_relinquish_get_the_selector_and_the_term(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "election"
    seen: list[tuple[str, object, int]] = []

    async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
        assert selector.is_leader and selector.term is term
        seen.append(("take", selector, term.fencing_token))

    async def relinquish(selector: LeaderSelector, term: LeadershipTerm) -> None:
        seen.append(("relinquish", selector, term.fencing_token))

    async with LeaderSelector(
        etcd_client, path, take_leadership, relinquish=relinquish, client_id="two-args"
    ) as selector:
        term = await selector.run()
    assert term is not None
    assert seen == [
        ("take", selector, term.fencing_token),
        ("relinquish", selector, term.fencing_token),
    ]

    # The earlier one-parameter form still gets the term alone.
    terms: list[LeadershipTerm] = []

    async def old_style(term: LeadershipTerm) -> None:
        terms.append(term)

    async with LeaderSelector(etcd_client, path, old_style, client_id="one-arg") as selector:
        assert await selector.run() is terms[0]


async def test_auto_requeue_campaigns_again_after_each_term(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    log: list[tuple[str, int]] = []

    def make(cid: str) -> LeaderSelector:
        async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
            log.append((cid, term.fencing_token))
            await asyncio.sleep(0.05)
            if len(log) == 3:
                raise RuntimeError("a failing term is recorded, and requeued")

        return LeaderSelector(etcd_client, path, take_leadership, client_id=cid, auto_requeue=True)

    a, b = make("a"), make("b")
    await a.start()
    await b.start()
    await eventually(lambda: len(log) >= 6, timeout=20, what="six terms")
    assert a.is_active and b.is_active  # one candidacy each, still running
    names = [cid for cid, _ in log[:6]]
    assert names.count("a") >= 2 and names.count("b") >= 2  # the leadership rotates
    tokens = [token for _, token in log]
    assert tokens == sorted(set(tokens))
    failures = [e.exception for e in a.exceptions + b.exceptions]
    assert any(isinstance(e, RuntimeError) for e in failures)
    await a.aclose()
    await b.aclose()
    assert not a.is_active and not b.is_active
    assert [kv.key_text for kv in await etcd_client.get_prefix(path)] == []


async def test_auto_requeued_run_survives_a_lost_term_and_returns_on_close(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "election"
    tokens: list[int] = []

    async def take_leadership(selector: LeaderSelector, term: LeadershipTerm) -> None:
        tokens.append(term.fencing_token)
        if len(tokens) == 1:
            await etcd_client.lease_revoke(term.lease_id)  # lost: recorded, campaign again
        await asyncio.sleep(30)

    selector = LeaderSelector(etcd_client, path, take_leadership, auto_requeue=True)
    run = asyncio.create_task(selector.run())
    await eventually(lambda: len(tokens) == 2, timeout=15, what="a second term")
    assert any(isinstance(e.exception, LeadershipLostError) for e in selector.exceptions)
    assert not run.done()
    await selector.aclose()
    term = await asyncio.wait_for(run, 10)
    assert term is not None and term.fencing_token == tokens[1] and not term.is_current
    assert [kv.key_text for kv in await etcd_client.get_prefix(path)] == []


def test_blocking_hook_gets_the_blocking_selector(etcd_server, etcd_prefix):
    path = etcd_prefix + "election"
    got: list[object] = []
    with blocking.connect(etcd_server.url) as client:

        def take_leadership(selector: blocking.LeaderSelector, term: LeadershipTerm) -> None:
            got.append(selector)
            assert selector.is_leader and term.is_current  # a blocking call from the hook

        with blocking.LeaderSelector(client, path, take_leadership) as selector:
            term = selector.run()
        assert got == [selector] and isinstance(got[0], blocking.LeaderSelector)
        assert term is not None and not term.is_current


@pytest.mark.parametrize("bad", ["yes", 1, None])
async def test_auto_requeue_must_be_a_bool(etcd_client, etcd_prefix, bad):
    async def take_leadership(term: LeadershipTerm) -> None:
        pass

    from etcd_recipes import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        LeaderSelector(etcd_client, etcd_prefix + "e", take_leadership, auto_requeue=bad)
