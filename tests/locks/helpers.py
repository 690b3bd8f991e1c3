"""Helpers shared by the lock tests: counting RPCs and watch events, and reading etcd."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from etcd_recipes import EtcdClient


class Traffic:
    """Counts the client's unary RPCs (by operation) and the watch responses carrying events."""

    def __init__(self) -> None:
        self.rpcs: Counter[str] = Counter()
        self.event_messages = 0
        self.events = 0

    def reset(self) -> None:
        self.rpcs.clear()
        self.event_messages = 0
        self.events = 0

    @property
    def rpc_total(self) -> int:
        return sum(self.rpcs.values())


@contextmanager
def traffic(client: EtcdClient) -> Iterator[Traffic]:
    """Count what ``client`` sends and receives while the block runs."""
    seen = Traffic()
    call, hub = client._call, client._watch_hub
    dispatch = hub._dispatch

    async def counting_call(op: str, method: str, *args: Any, **kwargs: Any) -> Any:
        seen.rpcs[f"{op}:{method}"] += 1
        return await call(op, method, *args, **kwargs)

    def counting_dispatch(msg: Any) -> None:
        if msg.events:
            seen.event_messages += 1
            seen.events += len(msg.events)
        dispatch(msg)

    client._call = counting_call  # type: ignore[method-assign]
    hub._dispatch = counting_dispatch  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del client._call
        del hub._dispatch


async def keys(client: EtcdClient, prefix: str) -> list[bytes]:
    """The keys under ``prefix``, oldest first."""
    from etcd_recipes import SortOrder, SortTarget

    result = await client.range(
        prefix, prefix=True, sort_target=SortTarget.CREATE, sort_order=SortOrder.ASCEND
    )
    return [kv.key for kv in result.kvs]


def lease_of(key: bytes) -> int:
    """The lease id a mutex key ``<path>/<lease hex>`` names."""
    return int(key.rsplit(b"/", 1)[1], 16)


async def lease_alive(client: EtcdClient, lease_id: int) -> bool:
    return (await client.lease_time_to_live(lease_id)).ttl > 0


async def lease_keys(client: EtcdClient, lease_id: int) -> list[bytes]:
    """The keys attached to ``lease_id`` on the server (empty when it does not exist)."""
    return list((await client.lease_time_to_live(lease_id, keys=True)).keys)


def short_idle_window(monkeypatch: Any, seconds: float = 0.3) -> None:
    """Make the client's pooled lock leases idle out after ``seconds`` (tests wait for it)."""
    from etcd_recipes.client import lease_pool

    monkeypatch.setattr(lease_pool, "IDLE_SECONDS", seconds)


async def server_leases(client: EtcdClient) -> set[int]:
    """The ids of the leases that exist on the server (a raw LeaseLeases call)."""
    from aetcd import rpc as pb

    stub = pb.LeaseStub(client._channel_or_raise())
    resp = await stub.LeaseLeases(pb.LeaseLeasesRequest(), metadata=client._runner.metadata())
    return {int(lease.ID) for lease in resp.leases}


async def queued(client: EtcdClient, prefix: str, n: int, timeout: float = 10.0) -> list[bytes]:
    """Wait until ``n`` keys are queued under ``prefix``; return them, oldest first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await keys(client, prefix)
        if len(found) >= n:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"only {len(found)} of {n} keys queued under {prefix}")
        await asyncio.sleep(0.02)


async def _cancel_task(coro: Any) -> None:
    task = asyncio.create_task(coro)
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _fail_after(coro: Any) -> None:
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.3):
            await coro


async def _asyncio_timeout(coro: Any) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(coro, 0.3)


# Ways a caller gives up on an acquisition after 0.3 s, each checked to raise what it should.
GIVE_UP = {
    "task-cancel": _cancel_task,
    "anyio-fail-after": _fail_after,
    "wait-for": _asyncio_timeout,
}
