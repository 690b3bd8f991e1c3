"""Helpers for the cache tests: collecting batches, replaying them, comparing with etcd."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from etcd_recipes import BatchKind, CacheBatch, CacheEventType, EtcdClient, PrefixCache


class Collector:
    """Consumes a cache's event stream in a background task and keeps every batch."""

    def __init__(self, cache: PrefixCache[Any]) -> None:
        self.batches: list[CacheBatch[Any]] = []
        self.error: BaseException | None = None
        self._stream = cache.events()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self._stream:
                self.batches.append(batch)
        except Exception as exc:  # recorded for the test
            self.error = exc

    def kinds(self) -> list[BatchKind]:
        return [b.kind for b in self.batches]

    def data(self) -> list[CacheBatch[Any]]:
        return [b for b in self.batches if not b.is_marker]

    async def stop(self) -> None:
        await self._stream.aclose()
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


def replay(batches: list[CacheBatch[Any]]) -> dict[str, Any]:
    """Apply every event of ``batches`` onto an empty map (an INITIAL batch starts over)."""
    state: dict[str, Any] = {}
    for batch in batches:
        if batch.kind is BatchKind.INITIAL:
            state = {}
        for event in batch:
            if event.type is CacheEventType.DELETED:
                assert event.key in state, f"DELETED {event.key} that was not there"
                del state[event.key]
            elif event.type is CacheEventType.CREATED:
                assert event.key not in state, f"CREATED {event.key} twice"
                state[event.key] = event.value
            else:
                assert event.key in state, f"UPDATED {event.key} that was not there"
                state[event.key] = event.value
    return state


def check_order(batches: list[CacheBatch[Any]]) -> None:
    """Data batches' revisions strictly increase (after the INITIAL one); no (key, mod
    revision) is reported twice."""
    last = 0
    seen: set[tuple[str, int]] = set()
    for batch in batches:
        if batch.is_marker:
            continue
        assert batch.revision > last or (batch.kind is BatchKind.INITIAL and last == 0), (
            f"batch at {batch.revision} after {last}"
        )
        last = batch.revision
        for event in batch:
            if event.entry is not None:
                mark = (event.key, event.entry.mod_revision)
                assert mark not in seen, f"{mark} reported twice"
                seen.add(mark)


async def server_state(client: EtcdClient, prefix: str, revision: int = 0) -> dict[str, bytes]:
    read = await client.range(prefix, prefix=True, revision=revision)
    return {kv.key_text: kv.value for kv in read.kvs}


def cache_state(cache: PrefixCache[Any]) -> dict[str, Any]:
    return dict(cache.items())


def drops_compacted_tombstone(version: str) -> bool:
    """Whether an etcd of ``version`` removes a tombstone *at* the compaction revision, so a
    watch from exactly that revision misses the delete (etcd-io/etcd#18089, fixed by
    etcd-io/etcd#18274 in 3.5.15 and 3.4.34)."""
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:3])
    return parts < (3, 4, 34) or (3, 5) <= parts < (3, 5, 15)
