"""The plumbing shared by the Kotlin-named caches (NodeCache, PathChildrenCache): each is a
recipe over one PrefixCache that starts and closes with it and reports its connection state
and failures as its own. Package-private."""

from __future__ import annotations

from typing import Any

from .._core.streams import Broadcast
from .._recipe.recipe import Recipe
from ..events import ConnectionState
from .prefix import PrefixCache


class _Layer(Recipe):
    """A recipe that is a view of ``self._cache`` and publishes to ``self._events``."""

    _cache: PrefixCache[Any]
    _events: Broadcast[Any]

    def _follow(self, cache: PrefixCache[Any], events: Broadcast[Any]) -> None:
        self._cache, self._events = cache, events
        cache._report_as(self._meter)  # its loads and sizes are this layer's metrics
        cache.add_connection_state_listener(self._on_state)
        cache.add_exception_listener(self._on_exception)

    async def _do_start(self) -> None:
        await self._cache.start()

    async def _do_close(self) -> None:
        await self._cache.aclose()
        await self._events.aclose()

    def _on_state(self, new: ConnectionState, old: ConnectionState) -> None:
        self._set_state(new)

    def _on_exception(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rsplit(":", 1)[-1] if ":" in context else None)
