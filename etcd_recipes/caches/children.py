"""PathChildrenCache: the Kotlin library's cache of a path's children, a thin layer over a
:class:`~etcd_recipes.PrefixCache` of ``path + "/"``.

Guarantees: everything :class:`~etcd_recipes.PrefixCache` guarantees, with the Kotlin library's
names and events: children are named relative to the path (nested keys give ``"a/b"``; the
one trailing ``/`` is handled once, so ``"/svc"`` and ``"/svc/"`` name children alike);
``CHILD_ADDED`` / ``CHILD_UPDATED`` / ``CHILD_REMOVED`` (its data: the value the cache held);
``INITIALIZED`` with ``initial_data`` in ``POST_INITIALIZED_EVENT`` mode -- always sent once
the load is done, even if children vanish meanwhile (CURATOR-4). Python generics make the
typed form: ``PathChildrenCache(client, path, codec=JSON)`` is the Kotlin library's
``TypedPathChildrenCache``.

Metrics: the loads and entry count of the cache under it are reported as this
``PathChildrenCache`` (recipe label ``PathChildrenCache``, ``name``: its ``metrics_name``).

Deviations from the Kotlin library (quirks fixed, not copied): a failed initial load raises from
``start()`` instead of leaving a cache that never watches; ``NORMAL`` mode shows the existing
children too (it only sends no events for them; the Kotlin library hid them until they changed);
a resync reports the difference as events (``synthetic=True``) instead of changing the map
silently; there is no local-only ``clear()`` (it made the cache disagree with etcd until the
next change).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from .._core.keys import ensure_suffix
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from ..codecs import Codec, ValueT
from ..events import WatchRecoveryEvent
from ._layer import _Layer
from .events import BatchKind, CacheBatch, CacheEventType
from .prefix import PrefixCache

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "ChildData",
    "PathChildrenCache",
    "PathChildrenCacheEvent",
    "PathChildrenCacheEventType",
    "StartMode",
]


class StartMode(enum.Enum):
    """How :meth:`PathChildrenCache.start` reports the children that exist already."""

    NORMAL = "NORMAL"
    """Load them, send no events for them."""
    BUILD_INITIAL_CACHE = "BUILD_INITIAL_CACHE"
    """Load them, send no events for them (the Kotlin library's name for a loaded start)."""
    POST_INITIALIZED_EVENT = "POST_INITIALIZED_EVENT"
    """Load them, then send one ``INITIALIZED`` event carrying them as ``initial_data``."""


class PathChildrenCacheEventType(enum.Enum):
    """What happened to a child (relative to the cache), or that the load is done."""

    CHILD_ADDED = "CHILD_ADDED"
    CHILD_UPDATED = "CHILD_UPDATED"
    CHILD_REMOVED = "CHILD_REMOVED"
    INITIALIZED = "INITIALIZED"


@dataclass(frozen=True)
class ChildData(Generic[ValueT]):
    """A child: its ``name`` relative to the path, its full ``key``, its ``value``."""

    name: str
    key: str
    value: ValueT | None


@dataclass(frozen=True)
class PathChildrenCacheEvent(Generic[ValueT]):
    """A child's change (``child_name``, ``data``: the new value, or on ``CHILD_REMOVED`` the
    value the cache held), or ``INITIALIZED`` (``child_name`` empty, ``initial_data`` set)."""

    child_name: str
    type: PathChildrenCacheEventType
    data: ValueT | None
    initial_data: tuple[ChildData[ValueT], ...] = ()
    synthetic: bool = False


_KINDS = {
    CacheEventType.CREATED: PathChildrenCacheEventType.CHILD_ADDED,
    CacheEventType.UPDATED: PathChildrenCacheEventType.CHILD_UPDATED,
    CacheEventType.DELETED: PathChildrenCacheEventType.CHILD_REMOVED,
}


class PathChildrenCache(_Layer, Generic[ValueT]):
    """A local copy of the children of ``path`` (every key under ``path + "/"``).

    Example::

        from etcd_recipes import PathChildrenCache, PathChildrenCacheEventType, StartMode

        await client.put(f"{prefix}/workers/a", b"idle")
        cache = PathChildrenCache(client, f"{prefix}/workers")
        events = cache.events()
        await cache.start(StartMode.POST_INITIALIZED_EVENT)
        initialized = await anext(events)
        assert initialized.type is PathChildrenCacheEventType.INITIALIZED
        assert [child.name for child in initialized.initial_data] == ["a"]
        await client.put(f"{prefix}/workers/b", b"busy")
        added = await anext(events)
        assert (added.child_name, added.data) == ("b", b"busy")
        assert cache.current_data_as_map == {"a": b"idle", "b": b"busy"}
        await cache.aclose()
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        codec: Codec[ValueT] | None = None,
        start_timeout: float = 30.0,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.trailing_path: str = ensure_suffix(path)
        """``path`` with exactly one trailing ``/``: the prefix of every child key."""
        self.mode: StartMode = StartMode.NORMAL
        """The mode of the last ``start()``."""
        self._cache: PrefixCache[ValueT] = PrefixCache(
            client, self.trailing_path, codec=codec, start_timeout=start_timeout
        )
        self._events: Broadcast[PathChildrenCacheEvent[ValueT]] = Broadcast(
            "path-children-events", self._record_listener_error
        )
        self._cache.add_listener(self._on_batch)
        self._follow(self._cache, self._events)

    def __repr__(self) -> str:
        return (
            f"<{self.exception_context} {self._lifecycle} {self.mode.value} "
            f"children={len(self._cache)} {self._state.value}>"
        )

    async def start(self, mode: StartMode = StartMode.NORMAL) -> PathChildrenCache[ValueT]:
        """Load the children and start watching; see :class:`StartMode`. Raises (after the
        cache's ``start_timeout``) rather than start without them."""
        if not isinstance(mode, StartMode):
            raise TypeError(f"mode must be a StartMode, not {type(mode).__name__}")
        self.mode = mode
        return await super().start()

    async def wait_on_start_complete(self, timeout: float | None = None) -> bool:
        """Whether the initial load is done (``start()`` returns only then; this waits for a
        start running elsewhere). ``False`` if ``timeout`` passes first."""
        return await self._cache.wait_synced(timeout)

    # ---------------------------------------------------------------- reads (no I/O)

    def _name(self, key: str) -> str:
        return key[len(self.trailing_path) :]

    @property
    def current_data(self) -> list[ChildData[ValueT]]:
        """Every child, sorted by name. No I/O."""
        return [ChildData(self._name(k), k, v) for k, v in self._cache.items()]

    @property
    def current_data_as_map(self) -> dict[str, ValueT]:
        """``{child name: value}``. No I/O."""
        return {self._name(k): v for k, v in self._cache.items()}

    def get_current_data(self, child_name: str) -> ValueT | None:
        """The value of child ``child_name`` (relative to the path, not a full key)."""
        return self._cache.get(self.trailing_path + child_name)

    @property
    def revision(self) -> int:
        """The revision the cache reflects."""
        return self._cache.revision

    async def rebuild(self) -> None:
        """Re-read every child now; differences are reported as (synthetic) events."""
        await self._cache.rebuild()

    # ---------------------------------------------------------------- events

    def events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[PathChildrenCacheEvent[ValueT]]:
        """Every later event, as an async iterator (bounded; see
        :class:`~etcd_recipes.EventStream`). Take it before ``start()`` to see
        ``INITIALIZED``."""
        return self._events.stream(maxsize)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the cache's watch (``WatchSuspended``,
        ``WatchResubscribed``, ``WatchResynced`` -- after which the children found changed
        come as ``synthetic`` events --, ``WatchFailed``); see
        :meth:`PrefixCache.recovery_events <etcd_recipes.PrefixCache.recovery_events>`."""
        return self._cache.recovery_events(maxsize)

    def add_listener(self, listener: Callable[[PathChildrenCacheEvent[ValueT]], Any]) -> None:
        """Call ``listener(event)`` for every later event, in order, from its own task."""
        self._events.add_listener(listener)

    def remove_listener(self, listener: Callable[[PathChildrenCacheEvent[ValueT]], Any]) -> None:
        """Stop calling ``listener``."""
        self._events.remove_listener(listener)

    def clear_listeners(self) -> None:
        """Remove every listener."""
        self._events.clear_listeners()

    def _on_batch(self, batch: CacheBatch[ValueT]) -> None:
        if batch.kind is BatchKind.INITIAL:
            if self.mode is StartMode.POST_INITIALIZED_EVENT:
                initial = tuple(
                    ChildData(self._name(e.key), e.key, e.value)
                    for e in batch
                    if e.value is not None
                )
                self._events.publish(
                    PathChildrenCacheEvent(
                        "", PathChildrenCacheEventType.INITIALIZED, None, initial
                    )
                )
            return
        for event in batch:
            if event.entry is not None and event.entry.error is not None:
                continue  # recorded by the cache; nothing to deliver
            data = event.prev_value if event.type is CacheEventType.DELETED else event.value
            self._events.publish(
                PathChildrenCacheEvent(
                    self._name(event.key), _KINDS[event.type], data, (), event.synthetic
                )
            )
