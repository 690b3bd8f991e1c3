"""NodeCache: the Kotlin library's cache of one key, a thin layer over a single-key
:class:`~etcd_recipes.PrefixCache`.

Guarantees: everything :class:`~etcd_recipes.PrefixCache` guarantees (``start()`` raises
rather than start empty; no event lost or repeated across reconnects), with the Kotlin library's
events: ``CREATED`` / ``UPDATED`` / ``DELETED`` relative to the cache (a key that existed at
``start()`` reports ``UPDATED`` on its next change).

Deviation from the Kotlin library (a quirk fixed, not copied): after a compaction the Kotlin library
updated its value silently; here the difference is reported as an event with
``synthetic=True``. A value its codec cannot decode is recorded as a background exception and
its event is not delivered (as in the Kotlin library); ``current`` then raises the
:class:`~etcd_recipes.errors.CodecError`.

Metrics: the loads and entry count of the cache under it are reported as this ``NodeCache``
(recipe label ``NodeCache``, ``name``: its ``metrics_name``).

Not guaranteed: listeners added after ``start()`` get no replay of the current value (read
``current``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from ..codecs import Codec, ValueT
from ..events import WatchRecoveryEvent
from ._layer import _Layer
from .events import BatchKind, CacheBatch, CacheEntry, CacheEventType
from .prefix import PrefixCache

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["NodeCache", "NodeCacheEvent", "NodeCacheEventType"]


class NodeCacheEventType(enum.Enum):
    """What happened to the key, relative to the cache."""

    CREATED = "CREATED"
    UPDATED = "UPDATED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class NodeCacheEvent(Generic[ValueT]):
    """A change of a :class:`NodeCache`'s key: ``value`` is ``None`` on ``DELETED``.
    ``synthetic``: found by a resync's re-read rather than seen by the watch."""

    type: NodeCacheEventType
    value: ValueT | None
    revision: int
    synthetic: bool = False


class NodeCache(_Layer, Generic[ValueT]):
    """A local copy of one key, kept current by a watch.

    Example::

        from etcd_recipes import NodeCache, NodeCacheEventType

        key = f"{prefix}/config/flag"
        await client.put(key, b"off")
        cache = NodeCache(client, key)
        events = cache.events()
        async with cache:
            assert cache.current == b"off"
            await client.put(key, b"on")
            event = await anext(events)
            assert event.type is NodeCacheEventType.UPDATED and event.value == b"on"
    """

    _path_arg = "key"

    def __init__(
        self,
        client: EtcdClient,
        key: str,
        *,
        codec: Codec[ValueT] | None = None,
        start_timeout: float = 30.0,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, key, client_id=client_id, metrics_name=metrics_name)
        self._cache: PrefixCache[ValueT] = PrefixCache(
            client, key, codec=codec, single_key=True, start_timeout=start_timeout
        )
        self._events: Broadcast[NodeCacheEvent[ValueT]] = Broadcast(
            "node-cache-events", self._record_listener_error
        )
        self._cache.add_listener(self._on_batch)
        self._follow(self._cache, self._events)

    def __repr__(self) -> str:
        entry = self._cache.entry(self.path)
        held = "absent" if entry is None else f"mod_revision={entry.mod_revision}"
        return f"<{self.exception_context} {self._lifecycle} {held} {self._state.value}>"

    @property
    def current(self) -> ValueT | None:
        """The key's value now (``None`` if it does not exist). No I/O. Raises the
        :class:`~etcd_recipes.errors.CodecError` if the value could not be decoded."""
        return self._cache.get(self.path)

    @property
    def current_entry(self) -> CacheEntry[ValueT] | None:
        """The key's entry (value, revisions, decode error), or ``None``. No I/O."""
        return self._cache.entry(self.path)

    @property
    def revision(self) -> int:
        """The revision the cache reflects."""
        return self._cache.revision

    def events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[NodeCacheEvent[ValueT]]:
        """Every later change, as an async iterator (bounded; see
        :class:`~etcd_recipes.EventStream`)."""
        return self._events.stream(maxsize)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the cache's watch (``WatchSuspended``,
        ``WatchResubscribed``, ``WatchResynced`` -- after which a change found by the re-read
        comes as a ``synthetic`` event --, ``WatchFailed``); see
        :meth:`PrefixCache.recovery_events <etcd_recipes.PrefixCache.recovery_events>`."""
        return self._cache.recovery_events(maxsize)

    def add_listener(self, listener: Callable[[NodeCacheEvent[ValueT]], Any]) -> None:
        """Call ``listener(event)`` for every later change, in order, from its own task."""
        self._events.add_listener(listener)

    def remove_listener(self, listener: Callable[[NodeCacheEvent[ValueT]], Any]) -> None:
        """Stop calling ``listener``."""
        self._events.remove_listener(listener)

    def clear_listeners(self) -> None:
        """Remove every listener."""
        self._events.clear_listeners()

    async def wait_for_revision(self, revision: int, timeout: float | None = 10.0) -> int:
        """Wait until the cache reflects ``revision``; see
        :meth:`PrefixCache.wait_for_revision <etcd_recipes.PrefixCache.wait_for_revision>`."""
        return await self._cache.wait_for_revision(revision, timeout)

    def _on_batch(self, batch: CacheBatch[ValueT]) -> None:
        if batch.kind is BatchKind.INITIAL or batch.is_marker:
            return
        for event in batch:
            if event.entry is not None and event.entry.error is not None:
                continue  # recorded by the cache; nothing to deliver
            kind = NodeCacheEventType[event.type.name]
            value = None if event.type is CacheEventType.DELETED else event.value
            self._events.publish(NodeCacheEvent(kind, value, event.revision, event.synthetic))
