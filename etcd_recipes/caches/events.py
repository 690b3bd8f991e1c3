"""What a :class:`~etcd_recipes.PrefixCache` holds and reports: entries, events, batches.

A cache reports changes one **batch** per etcd revision (a transaction's changes arrive
together). Every batch says what it is (:class:`BatchKind`); the snapshot is the first batch
(``INITIAL``), even when it is empty, so "the cache is loaded" is always signalled. A resync
is bracketed by two empty marker batches (``RESYNCING`` and ``RESYNCED``) around a
``RESYNC`` batch of *synthetic* events: the difference between what the cache held and what
etcd holds now, so a listener that applies every event converges too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic

from ..codecs import ValueT
from ..errors import CodecError

__all__ = [
    "BatchKind",
    "CacheBatch",
    "CacheEntry",
    "CacheEvent",
    "CacheEventType",
    "IndexFn",
    "KeyFilter",
    "Transform",
]

KeyFilter = Callable[[str], bool]
"""Which keys a cache keeps: a pure, fast function of the key."""
Transform = Callable[[ValueT], ValueT]
"""What a cache stores of each decoded value: a pure, fast function, applied at ingest."""
IndexFn = Callable[[str, ValueT], "Hashable | None"]
"""A secondary index: the indexed value of ``(key, value)`` (``None``: not indexed)."""


class CacheEventType(enum.Enum):
    """A change relative to the cache: ``CREATED`` (the cache had no such key), ``UPDATED``,
    ``DELETED``. A key deleted and re-created while the cache was not watching (seen by its
    ``create_revision``) is reported as ``DELETED`` then ``CREATED``."""

    CREATED = "CREATED"
    UPDATED = "UPDATED"
    DELETED = "DELETED"


class BatchKind(enum.Enum):
    """Where a :class:`CacheBatch` comes from."""

    INITIAL = "INITIAL"
    """The snapshot taken at start (events marked ``initial``); always sent, even empty."""
    LIVE = "LIVE"
    """One revision's changes, from the watch."""
    RESYNCING = "RESYNCING"
    """Marker (no events): the cache lost track (compaction, restore) and is re-reading."""
    RESYNC = "RESYNC"
    """The difference found by the re-read (events marked ``synthetic``)."""
    RESYNCED = "RESYNCED"
    """Marker (no events): the cache equals etcd at ``revision`` again."""


@dataclass(frozen=True, slots=True)
class CacheEntry(Generic[ValueT]):
    """A cached key: its decoded ``value`` (``None`` with ``values=False`` or when decoding
    failed, see ``error``) and its revisions.

    Example::

        from etcd_recipes import PrefixCache

        await client.put(f"{prefix}/cfg/a", b"1")
        async with PrefixCache(client, f"{prefix}/cfg/") as cache:
            entry = cache.entry(f"{prefix}/cfg/a")
            assert entry is not None and entry.value == b"1" and entry.version == 1
    """

    key: str
    value: ValueT | None
    create_revision: int
    mod_revision: int
    version: int
    lease: int
    error: CodecError | None = None
    """Why the value could not be decoded (the entry stays; the failure is also recorded as
    a background exception of the cache)."""


@dataclass(frozen=True, slots=True)
class CacheEvent(Generic[ValueT]):
    """One key's change. ``value`` is the new value (``None`` for ``DELETED``), ``prev_value``
    the value the cache held before (``None`` for ``CREATED``); ``entry`` / ``prev_entry``
    carry the revisions. ``revision`` is the revision of the batch.

    Example::

        from etcd_recipes import CacheEventType, PrefixCache

        async with PrefixCache(client, f"{prefix}/cfg/") as cache:
            events = cache.events()
            assert (await anext(events)).kind.value == "INITIAL"  # the content now
            await client.put(f"{prefix}/cfg/b", b"2")
            (event,) = await anext(events)
            assert event.type is CacheEventType.CREATED and event.value == b"2"
    """

    type: CacheEventType
    key: str
    value: ValueT | None
    prev_value: ValueT | None
    revision: int
    entry: CacheEntry[ValueT] | None
    prev_entry: CacheEntry[ValueT] | None
    initial: bool = False
    """Part of the start snapshot."""
    synthetic: bool = False
    """Found by a resync's re-read rather than seen by the watch."""


@dataclass(frozen=True, slots=True)
class CacheBatch(Generic[ValueT]):
    """The changes of one revision (iterate it for its :class:`CacheEvent` s), or a marker.

    Data batches' revisions strictly increase; markers repeat the revision they were sent at.

    Example::

        from etcd_recipes import BatchKind, Op, PrefixCache

        async with PrefixCache(client, f"{prefix}/cfg/") as cache:
            events = cache.events()
            await anext(events)  # INITIAL
            await client.txn([], [Op.put(f"{prefix}/cfg/x", b"1"), Op.put(f"{prefix}/cfg/y", b"2")])
            batch = await anext(events)
            assert batch.kind is BatchKind.LIVE and len(batch) == 2  # one transaction
    """

    kind: BatchKind
    revision: int
    events: tuple[CacheEvent[ValueT], ...] = field(default=())

    def __iter__(self) -> Iterator[CacheEvent[ValueT]]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @property
    def is_marker(self) -> bool:
        """Whether this is a ``RESYNCING``/``RESYNCED`` marker (it has no events)."""
        return self.kind in (BatchKind.RESYNCING, BatchKind.RESYNCED)
