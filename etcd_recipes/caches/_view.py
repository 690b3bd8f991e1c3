"""The no-I/O read surface of a cache (get, items, keys, len, in, indexes), shared by
:class:`~etcd_recipes.PrefixCache` as a private base. Package-private."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Generic

from ..codecs import ValueT
from ..errors import CodecError, InvalidArgumentError, UsageError
from ._store import Store
from .events import CacheEntry, IndexFn


class _CacheReads(Generic[ValueT]):
    """Reads of the local copy; every method is answered from memory."""

    _store: Store[ValueT]
    _values: bool

    if TYPE_CHECKING:  # provided by the recipe (Recipe.exception_context)

        @property
        def exception_context(self) -> str: ...

    # ---------------------------------------------------------------- reads (no I/O)

    def get(self, key: str, default: ValueT | None = None) -> ValueT | None:
        """The cached value of ``key`` (``default`` if absent). No I/O.

        Raises the entry's :class:`~etcd_recipes.errors.CodecError` if its value could not
        be decoded, and :class:`~etcd_recipes.errors.UsageError` with ``values=False``.

        Example::

            from etcd_recipes import JSON, PrefixCache

            await client.put(f"{prefix}/svc/a", b'{"port": 80}')
            async with PrefixCache(client, f"{prefix}/svc/", codec=JSON) as cache:
                assert cache.get(f"{prefix}/svc/a") == {"port": 80}
                assert cache.get(f"{prefix}/svc/none", {}) == {}
        """
        if not self._values:
            raise UsageError(f"{self.exception_context}: values=False keeps no values")
        entry = self._store.entries.get(key)
        if entry is None:
            return default
        if entry.error is not None:
            raise entry.error
        return entry.value

    def entry(self, key: str) -> CacheEntry[ValueT] | None:
        """The cached entry of ``key`` (value, revisions, decode error), or ``None``. No I/O.

        Example::

            from etcd_recipes import PrefixCache

            await client.put(f"{prefix}/m/a", b"1")
            async with PrefixCache(client, f"{prefix}/m/", values=False) as cache:
                entry = cache.entry(f"{prefix}/m/a")
                assert entry is not None and entry.value is None and entry.version == 1
        """
        return self._store.entries.get(key)

    def keys(self) -> list[str]:
        """The cached keys, sorted. No I/O."""
        return sorted(self._store.entries)

    def items(self) -> list[tuple[str, ValueT]]:
        """``(key, value)`` of every entry whose value decoded, sorted by key. No I/O.

        Example::

            from etcd_recipes import UTF8, PrefixCache

            await client.put(f"{prefix}/i/b", "2")
            await client.put(f"{prefix}/i/a", "1")
            async with PrefixCache(client, f"{prefix}/i/", codec=UTF8) as cache:
                assert cache.items() == [(f"{prefix}/i/a", "1"), (f"{prefix}/i/b", "2")]
        """
        entries = self._store.entries
        return [
            (k, e.value)
            for k, e in sorted(entries.items())
            if e.error is None and e.value is not None
        ]

    def entries(self) -> list[CacheEntry[ValueT]]:
        """Every entry, sorted by key (decode failures included, with ``error`` set)."""
        return [e for _, e in sorted(self._store.entries.items())]

    def decode_errors(self) -> dict[str, CodecError]:
        """The keys whose value could not be decoded, with why."""
        return {k: e.error for k, e in self._store.entries.items() if e.error is not None}

    def __len__(self) -> int:
        return len(self._store.entries)

    def __contains__(self, key: object) -> bool:
        return key in self._store.entries

    # ---------------------------------------------------------------- indexes

    def add_index(self, name: str, fn: IndexFn[ValueT]) -> None:
        """Maintain a secondary index: ``fn(key, value)`` gives the indexed value (hashable;
        ``None``: not indexed). Built over the current entries at once, then kept current.
        ``fn`` must be pure and fast: it runs for every change.

        Example::

            from etcd_recipes import JSON, PrefixCache

            await client.put(f"{prefix}/n/a", b'{"zone": "eu"}')
            await client.put(f"{prefix}/n/b", b'{"zone": "us"}')
            async with PrefixCache(client, f"{prefix}/n/", codec=JSON) as cache:
                cache.add_index("zone", lambda key, node: node["zone"])
                assert [k for k, _ in cache.by_index("zone", "eu")] == [f"{prefix}/n/a"]
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("an index name must be a non-empty str")
        if not callable(fn):
            raise InvalidArgumentError("an index function must be callable")
        if not self._values:
            raise UsageError(f"{self.exception_context}: values=False: nothing to index")
        self._store.add_index(name, fn)

    def remove_index(self, name: str) -> None:
        """Stop maintaining index ``name`` (unknown names are ignored)."""
        self._store.remove_index(name)

    def by_index(self, name: str, value: Hashable) -> list[tuple[str, ValueT]]:
        """``(key, value)`` of the entries that index ``name`` maps to ``value``, by key."""
        if not self._store.has_index(name):
            raise InvalidArgumentError(f"{self.exception_context}: no index named {name!r}")
        entries = self._store.entries
        return [(k, entries[k].value) for k in self._store.lookup(name, value)]  # type: ignore[misc]
