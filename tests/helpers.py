"""Shared test helpers. Fixtures for real etcd servers come from the `etcd_recipes.testing`
pytest plugin (etcd_server, fresh_etcd_server, etcd_cluster, etcd_client, etcd_prefix)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

# etcd 3.5.0-3.5.2 can re-apply (or lose) writes committed in the last backend batch when
# SIGKILLed within its 100 ms commit interval (etcd-io/etcd#13766, fixed in 3.5.3; the test
# server is 3.5.1): after the restart its history no longer matches what clients were served,
# revisions shifted by one. A test that kills etcd and then compares a client's view with etcd's
# history waits this long after its last write first, so a mismatch is ours, not that bug's.
ETCD_QUIET_BEFORE_KILL = 0.25


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
