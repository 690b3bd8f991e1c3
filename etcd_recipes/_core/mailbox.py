"""Two light asyncio primitives for parked watches (a watch costs a few hundred bytes). Not
public."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["Mailbox", "Signal"]

T = TypeVar("T")


class Signal:
    """A one-shot asyncio event without the per-instance deque of ``asyncio.Event``."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        if self._set:
            return
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._waiter)


class Mailbox(Generic[T]):
    """An unbounded single-consumer queue: a deque plus at most one parked getter.

    Much lighter than ``asyncio.Queue`` (which keeps three deques per instance); a parked
    watch costs a few hundred bytes here instead of over a kilobyte.
    """

    __slots__ = ("_getter", "_items")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._getter: asyncio.Future[None] | None = None

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> T:
        while not self._items:
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        return self._items.popleft()
