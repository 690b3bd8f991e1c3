"""LeaderLatch and LeaderObserver against a real etcd: hand-over, re-contest after loss,
await_leadership released by close, listeners in order, events starting with the current
state, and interop between selectors, latches and observers on one path."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import anyio
import pytest

from etcd_recipes import (
    AlreadyStartedError,
    ConnectionState,
    Elected,
    EventStreamOverflowError,
    LeaderLatch,
    LeaderObserver,
    LeaderSelector,
    LeadershipTerm,
    NotStartedError,
    Vacated,
    leadership_events,
)
from tests.helpers import eventually, take


async def test_latch_holds_until_close_then_hands_over(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    first = LeaderLatch(etcd_client, path, client_id="first")
    second = LeaderLatch(etcd_client, path, client_id="second")
    flags: list[tuple[str, bool]] = []
    first.add_leadership_listener(lambda leading: flags.append(("first", leading)))
    second.add_leadership_listener(lambda leading: flags.append(("second", leading)))
    await first.start()
    assert await first.await_leadership(timeout=5)
    await second.start()
    assert await second.await_leadership(timeout=0.5) is False  # a timeout does not withdraw
    assert first.has_leadership and not second.has_leadership
    names = [(p.client_id, p.is_leader) for p in await first.participants()]
    assert names == [("first", True), ("second", False)]
    token = first.fencing_token
    waiter = asyncio.create_task(second.await_leadership())
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await first.aclose()
    assert not first.has_leadership
    assert await asyncio.wait_for(waiter, 5) is True
    assert second.fencing_token > token
    await eventually(
        lambda: flags == [("first", True), ("first", False), ("second", True)],
        what="listeners in order",
    )
    await second.aclose()
    await eventually(lambda: flags[-1] == ("second", False), what="not_leader on close")
    assert [kv.key for kv in await etcd_client.get_prefix(etcd_prefix)] == []


async def test_await_leadership_is_released_by_aclose(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path) as holder:
        assert await holder.await_leadership(timeout=5)
        latch = LeaderLatch(etcd_client, path)
        await latch.start()
        waiter = asyncio.create_task(latch.await_leadership())
        await asyncio.sleep(0.2)
        await latch.aclose()
        assert await asyncio.wait_for(waiter, 5) is False
        assert holder.has_leadership


async def test_latch_contests_again_after_losing(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path) as latch:
        flags: list[bool] = []
        states: list[ConnectionState] = []
        latch.add_leadership_listener(flags.append)
        latch.add_connection_state_listener(lambda new, old: states.append(new))
        assert await latch.await_leadership(timeout=5)
        term = latch.term
        assert term is not None
        await etcd_client.lease_revoke(term.lease_id)
        await eventually(lambda: flags[:2] == [True, False], what="step-down")
        # Lost, then re-elected (it is the only candidate) with a higher token.
        assert await latch.await_leadership(timeout=5)
        await eventually(lambda: flags == [True, False, True], what="re-elected")
        assert latch.term is not term and latch.fencing_token > term.fencing_token
        assert term.is_lost and term.lost_cause is not None
        assert states[:2] == [ConnectionState.LOST, ConnectionState.RECONNECTED]


@pytest.mark.parametrize("how", ["task-cancel", "anyio-fail-after", "asyncio-timeout"])
async def test_cancelled_await_leadership_withdraws_the_candidacy(etcd_client, etcd_prefix, how):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="holder") as holder:
        assert await holder.await_leadership(timeout=5)
        leases_before = etcd_client._leases.lease_count
        latch = LeaderLatch(etcd_client, path, client_id="waiter")
        await latch.start()
        assert await etcd_client.get(path + "/participants/waiter") is not None
        if how == "task-cancel":
            task = asyncio.create_task(latch.await_leadership())
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how == "anyio-fail-after":
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.3):
                    await latch.await_leadership()
        else:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await latch.await_leadership()
        assert latch.is_closed
        assert await etcd_client.get(path + "/participants/waiter") is None
        assert (await etcd_client.get(path + "/LEADER")).text.startswith("holder:")
        assert etcd_client._leases.lease_count == leases_before  # its lease was revoked


async def test_selectors_latches_and_observers_interoperate(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderObserver(etcd_client, path) as observer:
        seen: list[object] = []
        observer.add_listener(seen.append)
        assert observer.current_leader is None and observer.current == Vacated()
        async with LeaderLatch(etcd_client, path, client_id="latch") as latch:
            assert await latch.await_leadership(timeout=5)
            await eventually(lambda: observer.current_leader == "latch", what="latch seen")
            assert observer.current == Elected("latch", latch.fencing_token)
            ran: list[str] = []

            async def take_leadership(term: LeadershipTerm) -> None:
                assert not latch.has_leadership
                assert observer.current_leader in ("sel", None)  # may lag by one event
                ran.append(term.leader_id)

            selector = LeaderSelector(etcd_client, path, take_leadership, client_id="sel")
            await selector.start()
            await asyncio.sleep(0.3)
            assert ran == []  # excluded while the latch leads
        # The latch closed: the selector ran its term.
        assert await selector.wait_until_finished(timeout=5)
        assert ran == ["sel"]
        await eventually(lambda: observer.current_leader is None, what="vacated")
        await selector.aclose()
        leaders = [e.leader for e in seen if isinstance(e, Elected)]
        assert leaders == ["latch", "sel"]
        assert seen == [seen[0], Vacated(), seen[2], Vacated()]


async def test_observer_events_start_with_the_current_state(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path, client_id="one") as one:
        assert await one.await_leadership(timeout=5)
        async with LeaderObserver(etcd_client, path) as observer:
            got: list[object] = []

            async def consume() -> None:
                async for event in observer.events():
                    got.append(event)

            consumer = asyncio.create_task(consume())
            await eventually(lambda: got == [Elected("one", one.fencing_token)], what="first")
            async with LeaderLatch(etcd_client, path, client_id="two") as two:
                await one.aclose()
                assert await two.await_leadership(timeout=5)
                await eventually(lambda: len(got) == 3, what="hand-over events")
                assert got[1:] == [Vacated(), Elected("two", two.fencing_token)]
        # Closing the observer ends the iteration.
        await asyncio.wait_for(consumer, 5)
    # leadership_events owns its observer.
    async with contextlib.aclosing(leadership_events(etcd_client, path)) as events:
        assert await anext(events) == Vacated()


async def test_lifecycle_misuse(etcd_client, etcd_prefix):
    latch = LeaderLatch(etcd_client, etcd_prefix + "e")
    with pytest.raises(NotStartedError):
        await latch.await_leadership()
    await latch.start()
    with pytest.raises(AlreadyStartedError):
        await latch.start()
    with pytest.raises(ValueError):
        await latch.await_leadership(timeout=-1)
    await latch.aclose()
    observer = LeaderObserver(etcd_client, etcd_prefix + "e")
    with pytest.raises(NotStartedError):
        await anext(observer.events())
    await observer.aclose()


async def test_latch_leadership_events_follow_every_term(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    latch = LeaderLatch(etcd_client, path, client_id="me")
    leading = latch.leadership_events()
    flags: list[bool] = []
    latch.add_leadership_listener(flags.append)
    assert await take(leading, 1) == [False]  # the current state first
    await latch.start()
    assert await take(leading, 1) == [True]
    first = latch.term
    await etcd_client.lease_revoke(first.lease_id)  # lost: steps down, then contests again
    assert await take(leading, 2) == [False, True]
    assert latch.term is not first and latch.is_leader
    late = latch.leadership_events()  # a later stream starts with the current state
    assert await take(late, 1) == [True]
    await latch.aclose()
    assert [item async for item in leading] == [False]  # the step-down, then the end
    assert [item async for item in late] == [False]
    assert flags == [True, False, True, False]  # the listeners got the same changes
    assert await etcd_client.count(path + "/") == 0


async def test_breaking_out_of_leadership_events_unregisters(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderLatch(etcd_client, path) as latch:

        async def until_leading() -> None:
            async for is_leader in latch.leadership_events():
                if is_leader:
                    break

        await asyncio.wait_for(until_leading(), 10)
        gc.collect()
        assert latch._leadership_events.stream_count == 0
        waiting = asyncio.create_task(anext(latch.leadership_events(), None))
        await eventually(lambda: latch._leadership_events.stream_count == 1, what="one")
        waiting.cancel()  # a cancelled consumer: nothing is left registered
        await asyncio.wait({waiting})
        del waiting
        gc.collect()
        assert latch._leadership_events.stream_count == 0


async def test_observer_events_are_bounded_and_unregister(etcd_client, etcd_prefix):
    path = etcd_prefix + "election"
    async with LeaderObserver(etcd_client, path) as observer:
        slow = observer.events(maxsize=2)
        async for event in observer.events():
            assert event == Vacated()
            break
        gc.collect()
        assert observer._events.stream_count == 1  # only `slow` is left
        for i in range(3):  # three changes: `slow` holds the current state and one more
            async with LeaderLatch(etcd_client, path, client_id=f"n{i}") as latch:
                assert await latch.await_leadership(timeout=5)
                await eventually(lambda: observer.current_leader == latch.client_id)
        assert [await anext(slow), await anext(slow)][0] == Vacated()
        with pytest.raises(EventStreamOverflowError):
            await anext(slow)  # reported, never dropped silently
        assert observer._events.stream_count == 0
