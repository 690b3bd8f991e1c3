"""Shared test helpers. Fixtures for real etcd servers come from the `etcd_recipes.testing`
pytest plugin (etcd_server, fresh_etcd_server, etcd_cluster, etcd_client, etcd_prefix)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it returns True; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def take(stream, count: int, *, timeout: float = 10.0) -> list:
    """The next ``count`` items of an event stream (failing the test after ``timeout``)."""
    items = []
    for _ in range(count):
        try:
            items.append(await asyncio.wait_for(anext(stream), timeout))
        except asyncio.TimeoutError:
            pytest.fail(f"timed out after {timeout}s; got {items}")
    return items


async def first_item_then_break(stream) -> object:
    """Iterate ``stream`` and break out after the first item (what a consumer loop does)."""
    async for item in stream:
        return item
    raise AssertionError("the stream ended without an item")
