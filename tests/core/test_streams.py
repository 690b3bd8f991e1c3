"""Broadcast / EventStream: bounded, cold, ordered fan-out (pure asyncio, no etcd)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from etcd_recipes import EventStreamOverflowError, InvalidArgumentError
from etcd_recipes._core.streams import Broadcast


async def test_streams_get_every_later_item_in_order() -> None:
    hub: Broadcast[int] = Broadcast("numbers")
    hub.publish(0)  # nobody registered yet: not replayed
    first, second = hub.stream(), hub.stream()
    for i in range(1, 4):
        hub.publish(i)
    assert [await anext(first) for _ in range(3)] == [1, 2, 3]
    assert [await anext(second) for _ in range(3)] == [1, 2, 3]
    assert hub.stream_count == 2


async def test_breaking_out_of_the_loop_unregisters() -> None:
    hub: Broadcast[int] = Broadcast("numbers")

    async def first_item() -> int:
        async for item in hub.stream():
            return item
        raise AssertionError("ended")

    task = asyncio.create_task(first_item())
    await asyncio.sleep(0)
    assert hub.stream_count == 1
    hub.publish(7)
    assert await task == 7
    gc.collect()
    assert hub.stream_count == 0


async def test_overflow_is_reported_after_the_buffered_items_and_never_blocks() -> None:
    hub: Broadcast[int] = Broadcast("numbers")
    slow = hub.stream(maxsize=3)
    fast = hub.stream(maxsize=100)
    for i in range(10):
        hub.publish(i)  # returns at once although `slow` is full
    assert [await anext(slow) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(EventStreamOverflowError) as info:
        await anext(slow)
    assert info.value.maxsize == 3
    assert "3 items behind" in str(info.value)
    assert hub.stream_count == 1  # the overflowed stream left; the fast one stays
    assert [await anext(fast) for _ in range(10)] == list(range(10))


async def test_conflated_stream_starts_with_the_current_state_and_keeps_the_newest() -> None:
    state = ["a"]
    hub: Broadcast[str] = Broadcast("state", current=lambda: state[0])
    states = hub.stream(1, conflate=True)
    assert await anext(states) == "a"
    for s in ("b", "c", "d"):
        state[0] = s
        hub.publish(s)
    assert await anext(states) == "d"
    assert states.buffered == 0


async def test_close_ends_streams_after_their_items_and_stops_listeners() -> None:
    hub: Broadcast[int] = Broadcast("numbers")
    stream = hub.stream()
    seen: list[int] = []
    hub.add_listener(seen.append)
    hub.publish(1)
    await asyncio.sleep(0.01)
    await hub.aclose()
    hub.publish(2)  # ignored
    assert [item async for item in stream] == [1]
    assert seen == [1]
    late = hub.stream()
    assert [item async for item in late] == []
    assert "closed" in repr(hub)


async def test_a_slow_listener_stalls_only_itself_and_keeps_its_order() -> None:
    errors: list[BaseException] = []
    hub: Broadcast[int] = Broadcast("numbers", lambda where, exc: errors.append(exc))
    slow_seen: list[int] = []
    fast_seen: list[int] = []
    gate = asyncio.Event()

    async def slow(item: int) -> None:
        await gate.wait()
        slow_seen.append(item)

    def failing(item: int) -> None:
        raise RuntimeError(f"boom {item}")

    hub.add_listener(slow)
    hub.add_listener(fast_seen.append)
    hub.add_listener(failing)
    for i in range(5):
        hub.publish(i)
    await asyncio.sleep(0.01)
    assert fast_seen == [0, 1, 2, 3, 4] and slow_seen == []
    gate.set()
    await asyncio.sleep(0.01)
    assert slow_seen == [0, 1, 2, 3, 4]
    assert [str(e) for e in errors] == [f"boom {i}" for i in range(5)]  # and it kept going
    hub.remove_listener(slow)
    hub.publish(5)
    await asyncio.sleep(0.01)
    assert slow_seen == [0, 1, 2, 3, 4] and fast_seen[-1] == 5
    await hub.aclose()


async def test_publish_from_another_thread_is_handed_to_the_loop() -> None:
    hub: Broadcast[int] = Broadcast("numbers")
    stream = hub.stream()
    await asyncio.to_thread(hub.publish, 42)
    assert await asyncio.wait_for(anext(stream), 2) == 42


async def test_bad_maxsize_is_a_typed_error() -> None:
    hub: Broadcast[int] = Broadcast("numbers")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            hub.stream(bad)  # type: ignore[arg-type]


async def test_fail_ends_streams_with_the_error_after_their_items() -> None:
    state = ["a"]
    hub: Broadcast[str] = Broadcast("state", current=lambda: state[0])
    seen: list[str] = []
    hub.add_listener(seen.append)
    early = hub.stream()
    state[0] = "b"
    hub.publish("b")
    boom = RuntimeError("the producer gave up")
    hub.fail(boom)
    assert [await anext(early) for _ in range(2)] == ["a", "b"]
    with pytest.raises(RuntimeError, match="gave up"):
        await anext(early)
    assert hub.stream_count == 0
    late = hub.stream()  # after the failure: the current state, then the failure
    assert await anext(late) == "b"
    with pytest.raises(RuntimeError, match="gave up"):
        await anext(late)
    hub.publish("c")  # listeners stay registered
    await asyncio.sleep(0.01)
    assert seen == ["b", "c"]
    await hub.aclose()
    assert [item async for item in hub.stream()] == []  # closed: ended, no error
