"""The cache's in-memory state: entries by key, secondary indexes, and the two ways it
changes -- a watched revision applied, or a fresh snapshot diffed in. Pure logic, no I/O.
Package-private."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic

from ..codecs import Codec, ValueT
from ..errors import CodecError
from ..types import EventType, KeyValue, WatchEvent
from .events import (
    BatchKind,
    CacheBatch,
    CacheEntry,
    CacheEvent,
    CacheEventType,
    IndexFn,
    KeyFilter,
    Transform,
)


def key_text(raw: bytes) -> str:
    """A key as ``str``; bytes that are not UTF-8 survive the round trip (surrogateescape)."""
    return raw.decode("utf-8", "surrogateescape")


class Store(Generic[ValueT]):
    """Entries by key plus indexes; every change goes through :meth:`apply` / :meth:`rebuild`,
    which return the events describing it."""

    def __init__(
        self,
        codec: Codec[ValueT],
        *,
        values: bool,
        transform: Transform[ValueT] | None,
        key_filter: KeyFilter | None,
        on_error: Callable[[str, Exception], None],
    ) -> None:
        self._codec = codec
        self._values = values
        self._transform = transform
        self._filter = key_filter
        self._on_error = on_error  # (where, exception): recorded by the recipe
        self.entries: dict[str, CacheEntry[ValueT]] = {}
        self.server_count = 0  # keys in the range on the server, filtered-out ones included
        self._indexes: dict[str, tuple[IndexFn[ValueT], dict[Hashable, set[str]]]] = {}

    # ---------------------------------------------------------------- building entries

    def _entry(self, kv: KeyValue, key: str) -> CacheEntry[ValueT]:
        value: ValueT | None = None
        error: CodecError | None = None
        if self._values:
            try:
                value = self._codec.decode(kv.value)
                if self._transform is not None:
                    value = self._transform(value)
            except Exception as exc:
                error = exc if isinstance(exc, CodecError) else CodecError(f"{key}: {exc}")
                if error is not exc:
                    error.__cause__ = exc
                self._on_error(f"decode {key}", error)
        return CacheEntry(
            key, value, kv.create_revision, kv.mod_revision, kv.version, kv.lease, error
        )

    def wanted(self, key: str) -> bool:
        return self._filter is None or self._filter(key)

    # ---------------------------------------------------------------- changes

    def load(
        self, revision: int, kvs: Iterable[KeyValue], total: int, *, events: bool = True
    ) -> CacheBatch[ValueT]:
        """The first snapshot: every entry is an ``initial`` CREATED event (none are made
        without ``events``). The hot loop of a start: one pass, no index or filter work
        unless configured."""
        made: list[CacheEvent[ValueT]] = []
        append, entries, created = made.append, self.entries, CacheEventType.CREATED
        keep = self._filter
        for kv in kvs:
            key = kv.key.decode("utf-8", "surrogateescape")
            if keep is not None and not keep(key):
                continue
            entry = self._entry(kv, key)
            if self._indexes:
                self._put(key, entry)
            else:
                entries[key] = entry
            if events:
                append(CacheEvent(created, key, entry.value, None, revision, entry, None, True))
        self.server_count = total
        return CacheBatch(BatchKind.INITIAL, revision, tuple(made))

    def snapshot_batch(self, revision: int) -> CacheBatch[ValueT]:
        """The current entries as an ``INITIAL`` batch (for a reader that joins late)."""
        events = tuple(
            CacheEvent(CacheEventType.CREATED, key, e.value, None, revision, e, None, True)
            for key, e in sorted(self.entries.items())
        )
        return CacheBatch(BatchKind.INITIAL, revision, events)

    def apply(self, revision: int, changes: Iterable[WatchEvent]) -> CacheBatch[ValueT]:
        """One revision's watch events."""
        events: list[CacheEvent[ValueT]] = []
        for change in changes:
            kv = change.kv
            key = key_text(kv.key)
            if change.type is EventType.PUT:
                if kv.version == 1:
                    self.server_count += 1
            else:
                self.server_count -= 1
            if not self.wanted(key):
                continue
            old = self.entries.get(key)
            if change.type is EventType.DELETE:
                if old is None:
                    continue
                self._remove(key, old)
                events.append(
                    CacheEvent(CacheEventType.DELETED, key, None, old.value, revision, None, old)
                )
                continue
            entry = self._entry(kv, key)
            kind = CacheEventType.CREATED if old is None else CacheEventType.UPDATED
            if old is not None and old.create_revision != entry.create_revision:
                # Only after a gap could this happen; report it as what it was.
                self._remove(key, old)
                events.append(
                    CacheEvent(CacheEventType.DELETED, key, None, old.value, revision, None, old)
                )
                old, kind = None, CacheEventType.CREATED
            self._put(key, entry)
            prev = None if old is None else old.value
            events.append(CacheEvent(kind, key, entry.value, prev, revision, entry, old))
        return CacheBatch(BatchKind.LIVE, revision, tuple(events))

    def rebuild(self, revision: int, kvs: Iterable[KeyValue], total: int) -> CacheBatch[ValueT]:
        """A fresh snapshot replaces the entries; the difference comes back as synthetic
        events (delete+recreate told apart by ``create_revision``). In place: readers never
        see an empty cache in between."""
        fresh: dict[str, KeyValue] = {}
        for kv in kvs:
            key = key_text(kv.key)
            if self.wanted(key):
                fresh[key] = kv
        events: list[CacheEvent[ValueT]] = []
        for key in [k for k in self.entries if k not in fresh]:
            gone = self.entries[key]
            self._remove(key, gone)
            events.append(
                CacheEvent(
                    CacheEventType.DELETED, key, None, gone.value, revision, None, gone, False, True
                )
            )
        for key, kv in fresh.items():
            old = self.entries.get(key)
            if old is not None and old.create_revision == kv.create_revision:
                if old.mod_revision == kv.mod_revision:
                    continue  # unchanged
                entry = self._entry(kv, key)
                self._put(key, entry)
                events.append(
                    CacheEvent(
                        CacheEventType.UPDATED,
                        key,
                        entry.value,
                        old.value,
                        revision,
                        entry,
                        old,
                        False,
                        True,
                    )
                )
                continue
            if old is not None:  # deleted and created again while we were not looking
                self._remove(key, old)
                events.append(
                    CacheEvent(
                        CacheEventType.DELETED,
                        key,
                        None,
                        old.value,
                        revision,
                        None,
                        old,
                        False,
                        True,
                    )
                )
            entry = self._entry(kv, key)
            self._put(key, entry)
            events.append(
                CacheEvent(
                    CacheEventType.CREATED,
                    key,
                    entry.value,
                    None,
                    revision,
                    entry,
                    None,
                    False,
                    True,
                )
            )
        self.server_count = total
        return CacheBatch(BatchKind.RESYNC, revision, tuple(events))

    def clear(self) -> None:
        self.entries.clear()
        for _, values in self._indexes.values():
            values.clear()

    # ---------------------------------------------------------------- indexes

    def add_index(self, name: str, fn: IndexFn[ValueT]) -> None:
        by_value: dict[Hashable, set[str]] = {}
        self._indexes[name] = (fn, by_value)
        for key, entry in self.entries.items():
            self._index_one(fn, by_value, key, entry)

    def remove_index(self, name: str) -> None:
        self._indexes.pop(name, None)

    def lookup(self, name: str, value: Hashable) -> list[str]:
        _, by_value = self._indexes[name]
        return sorted(by_value.get(value, ()))

    def has_index(self, name: str) -> bool:
        return name in self._indexes

    def _index_one(
        self,
        fn: IndexFn[ValueT],
        by_value: dict[Hashable, set[str]],
        key: str,
        entry: CacheEntry[ValueT],
    ) -> None:
        if entry.value is None:
            return
        indexed = self._index_value(fn, key, entry.value)
        if indexed is not None:
            by_value.setdefault(indexed, set()).add(key)

    def _index_value(self, fn: IndexFn[ValueT], key: str, value: ValueT) -> Hashable | None:
        try:
            return fn(key, value)
        except Exception as exc:  # a bug in the index function: that key is not indexed
            self._on_error(f"index {key}", exc)
            return None

    def _put(self, key: str, entry: CacheEntry[ValueT]) -> None:
        if not self._indexes:
            self.entries[key] = entry
            return
        old = self.entries.get(key)
        if old is not None:
            self._unindex(key, old)
        self.entries[key] = entry
        for fn, by_value in self._indexes.values():
            self._index_one(fn, by_value, key, entry)

    def _remove(self, key: str, old: CacheEntry[ValueT]) -> None:
        del self.entries[key]
        if self._indexes:
            self._unindex(key, old)

    def _unindex(self, key: str, old: CacheEntry[ValueT]) -> None:
        if old.value is None:
            return
        for fn, by_value in self._indexes.values():
            indexed = self._index_value(fn, key, old.value)
            if indexed is None:
                continue
            keys = by_value.get(indexed)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del by_value[indexed]
