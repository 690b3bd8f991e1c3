"""Fixtures of the lock tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio

from etcd_recipes import EtcdClient, connect


@pytest_asyncio.fixture
async def rivals(etcd_server: Any) -> AsyncIterator[Callable[[int], Awaitable[list[EtcdClient]]]]:
    """``await rivals(n)``: ``n`` more clients of the test's server, closed after the test.

    Mutexes of one client on one path wait for their turn locally and have one waiter key in
    etcd at a time (the local line); a test that needs several waiter keys in etcd -- several
    processes, as far as etcd can tell -- gives each contender a client of its own.
    """
    async with contextlib.AsyncExitStack() as stack:

        async def more(n: int) -> list[EtcdClient]:
            return [
                await stack.enter_async_context(connect(**etcd_server.client_kwargs()))
                for _ in range(n)
            ]

        yield more
