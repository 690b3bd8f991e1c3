"""What a cache asks etcd: the paged snapshot at one revision, the proof that a range did not
change since a revision, and whether a server went back in time. Package-private."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.logctx import library_logger
from ..errors import CompactedError
from ..types import KeyValue

if TYPE_CHECKING:
    from ..client import EtcdClient

log = library_logger("etcd_recipes.caches")


async def read_range(
    client: EtcdClient, key: bytes, end: bytes | None, page_size: int, *, keys_only: bool
) -> tuple[int, list[KeyValue], int]:
    """``(revision, kvs, count)`` of the range ``[key, end)`` (or the key ``key``), read in
    pages of ``page_size`` keys, every page at the first page's revision. If that revision is
    compacted mid-load, the load restarts at a new one."""
    while True:
        first = await client.range(key, range_end=end, limit=page_size, keys_only=keys_only)
        revision, kvs, more = first.revision, list(first.kvs), first.more
        try:
            while more and kvs:
                page = await client.range(
                    kvs[-1].key + b"\x00",
                    range_end=end,
                    limit=page_size,
                    revision=revision,
                    keys_only=keys_only,
                )
                kvs.extend(page.kvs)
                more = page.more
        except CompactedError:
            log.info("revision %d of %r compacted mid-load; reloading", revision, key)
            continue
        return revision, kvs, first.count


async def unchanged_since(
    client: EtcdClient, key: bytes, end: bytes | None, seen: int, count: int
) -> int | None:
    """The server's current revision if the range is provably unchanged since ``seen`` --
    it holds ``count`` keys and none was modified after ``seen`` (then every key present now
    was present, unchanged, at ``seen``, and there are as many) -- else ``None``."""
    head = await client.range(key, range_end=end, count_only=True)
    if head.count != count:
        return None
    try:
        # keys_only, not count_only: etcd applies min_mod_revision to the keys it returns,
        # never to the count (which stays the whole range's).
        changed = await client.range(
            key, range_end=end, keys_only=True, min_mod_revision=seen + 1, revision=head.revision
        )
    except CompactedError:
        return None
    return head.revision if not changed.kvs else None


async def restored(
    client: EtcdClient, key: bytes, end: bytes | None, revision: int, cluster_id: int
) -> bool:
    """After a reconnect: must the cache re-read? True if the server is another one, or the
    same one back in time (restored from a backup: its cluster id changed, or its revision is
    below ``revision``) -- or if history up to ``revision`` was compacted while we were away:
    a watch that resumes exactly at the compact revision is allowed, but etcd before 3.5.15
    (etcd-io/etcd#18089) has dropped the deletions *at* that revision by then."""
    status = await client.status()
    head = await client.range(key, range_end=end, count_only=True)
    if bool(cluster_id and status.cluster_id != cluster_id) or head.revision < revision:
        return True
    try:
        await client.range(key, range_end=end, count_only=True, revision=revision)
    except CompactedError:
        return True
    return False
