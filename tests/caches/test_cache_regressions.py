"""Regressions of PrefixCache bugs the model test (test_cache_model.py) found, each reduced to
a deterministic reproduction: a resume exactly at the compaction revision losing a delete,
and a failed re-read leaving the cache "not synced" for good."""

from __future__ import annotations

from typing import Any

import pytest

from etcd_recipes import BatchKind, EtcdClient, PrefixCache, connect
from etcd_recipes.caches import _reads as reads
from etcd_recipes.caches import prefix as prefix_module
from etcd_recipes.errors import EtcdConnectionError
from etcd_recipes.testing import EtcdServer, TcpProxy
from tests.helpers import eventually

from .helpers import drops_compacted_tombstone


def fast_client(url: str) -> EtcdClient:
    """A client whose keepalive notices a partition within ~1.5 s."""
    return connect(url, keepalive_time=1, keepalive_timeout=0.5)


@pytest.mark.slow
async def test_a_resume_at_the_compaction_revision_keeps_the_delete(
    fresh_etcd_server: EtcdServer, request: pytest.FixtureRequest
) -> None:
    """The cache is cut off; a key is deleted at revision R and history compacted at exactly
    R; the cache's watch resumes at R -- not below the compaction, so no resync. etcd below
    3.5.15 removed the tombstone at R (etcd-io/etcd#18089), sends no DELETE, and the cache
    kept the deleted key until some later resync. Now, after a resubscribe, a count-only read
    at ``revision=cache.revision`` raises CompactedError exactly when the compaction reached
    the resume point, and the cache re-reads."""
    server = fresh_etcd_server
    with TcpProxy.for_endpoint(server.endpoint) as proxy:
        async with (
            connect(**server.client_kwargs()) as direct,
            fast_client(proxy.url) as through,
        ):
            drops = drops_compacted_tombstone((await direct.status()).version)
            await direct.put("/t/gone", b"1")
            await direct.put("/t/kept", b"1")
            async with PrefixCache(through, "/t/") as cache:
                proxy.blackhole()
                deleted = await direct.delete("/t/gone")
                await direct.compact(deleted.revision)
                proxy.restore()
                later = await direct.put("/t/later", b"1")
                await cache.wait_for_revision(later.revision, timeout=20)
                assert cache.keys() == ["/t/kept", "/t/later"]
                if drops:  # the server lost the tombstone: only the re-read could tell
                    assert cache.resync_count == 1


async def test_a_failed_resync_in_the_watch_loop_still_ends_synced(
    etcd_client: EtcdClient,
    etcd_prefix: str,
    etcd_proxy: TcpProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection drops; the watch resubscribes; the server is gone again for the restore
    check and, half a second later, for the resync's read (injected: two failing reads -- a
    second outage at exactly those moments cannot be timed with real faults). The cache then
    watches again from its revision and applies every change; before the fix it stayed
    ``is_synced=False`` for good (``wait_synced`` timed out, progress was ignored) and its
    stream got a ``RESYNCING`` marker that no ``RESYNCED`` closed."""
    p = etcd_prefix + "stuck/"
    await etcd_client.put(p + "a", b"1")
    async with (
        fast_client(etcd_proxy.url) as through,
        PrefixCache(through, p) as cache,
    ):
        kinds: list[BatchKind] = []
        cache.add_listener(lambda batch: kinds.append(batch.kind))
        failures = {"restored": 1, "read_range": 1}
        real_restored, real_read = reads.restored, reads.read_range

        async def restored(*args: Any, **kwargs: Any) -> bool:
            if failures["restored"]:
                failures["restored"] -= 1
                raise EtcdConnectionError("injected: the server is gone again")
            return await real_restored(*args, **kwargs)

        async def read_range(*args: Any, **kwargs: Any) -> Any:
            if failures["read_range"] and not failures["restored"]:
                failures["read_range"] -= 1
                raise EtcdConnectionError("injected: still gone")
            return await real_read(*args, **kwargs)

        monkeypatch.setattr(prefix_module, "restored", restored)
        monkeypatch.setattr(prefix_module, "read_range", read_range)
        etcd_proxy.cut()
        await eventually(  # both consumed: the watch loop went through its error path
            lambda: not any(failures.values()), timeout=15, what="the injected failures"
        )
        written = await etcd_client.put(p + "b", b"2")
        await cache.wait_for_revision(written.revision, timeout=10)
        assert cache.get(p + "b") == b"2"  # the changes do arrive ...
        assert await cache.wait_synced(timeout=5), "the cache never became synced again"
        assert kinds.count(BatchKind.RESYNCING) == kinds.count(BatchKind.RESYNCED), kinds
