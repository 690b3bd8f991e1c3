"""SharedCount: an integer :class:`~etcd_recipes.SharedValue` (Apache Curator's
``SharedCount``), stored as :class:`~etcd_recipes.DistributedAtomicLong` stores its value.

Guarantees: those of :class:`~etcd_recipes.SharedValue` (it is one, with the ``INT64`` codec,
under this recipe's name); the value is an int64, encoded as 8 big-endian bytes, so a
``SharedCount`` and a ``DistributedAtomicLong`` (or the JVM library's counter) on one path read
and write the same number. Not guaranteed: an atomic increment -- use
``DistributedAtomicLong.add`` for that, or a ``try_set`` loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._core.streams import DEFAULT_STREAM_BUFFER, EventStream
from .._core.validate import check_count, check_int64
from .._recipe.recipe import Recipe
from ..codecs import INT64
from ..events import ConnectionState, WatchRecoveryEvent
from .value import SharedValue, Versioned

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["SharedCount"]


class SharedCount(Recipe):
    """A shared int64 at ``path``, created with ``seed`` when missing: a
    ``SharedValue[int]`` with the ``INT64`` codec (every method is the same).

    Example::

        from etcd_recipes import SharedCount

        async with SharedCount(client, f"{prefix}/workers", seed=3) as workers:
            seen = await workers.get()
            assert seen.value == 3
            assert await workers.try_set(seen.value + 1, seen.version)
            assert (await workers.get()).value == 4
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        seed: int = 0,
        *,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self.seed: int = check_int64(seed, what="seed")
        """The count the key is created with, and what a missing key reads as."""
        self._value: SharedValue[int] = SharedValue(
            client, path, self.seed, codec=INT64, client_id=self.client_id
        )
        self._value._meter_view = self._meter  # its writes are this recipe's metrics
        self._value.add_connection_state_listener(self._on_state)
        self._value.add_exception_listener(self._on_exception)

    def __repr__(self) -> str:
        return repr(self._value).replace("SharedValue", "SharedCount", 1)

    @property
    def current(self) -> Versioned[int]:
        """The count as the watch last delivered it (no I/O); see
        :attr:`SharedValue.current <etcd_recipes.SharedValue.current>`."""
        return self._value.current

    @property
    def revision(self) -> int:
        """The etcd revision ``current`` reflects."""
        return self._value.revision

    async def get(self) -> Versioned[int]:
        """The count and its version, read from etcd now (a missing key: the seed, version 0)."""
        return await self._value.get()

    async def set(self, count: int) -> Versioned[int]:
        """Write ``count`` whatever the current version; returns it with its new version."""
        return await self._value.set(check_int64(count, what="count"))

    async def try_set(self, count: int, expected_version: int) -> bool:
        """Write ``count`` only if the key is still at ``expected_version``; see
        :meth:`SharedValue.try_set <etcd_recipes.SharedValue.try_set>`."""
        return await self._value.try_set(check_int64(count, what="count"), expected_version)

    def changes(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[Versioned[int]]:
        """The current count, then every change; see
        :meth:`SharedValue.changes <etcd_recipes.SharedValue.changes>`."""
        check_count(maxsize, what="maxsize")
        self._check_started()
        return self._value.changes(maxsize)

    def add_listener(self, listener: Callable[[Versioned[int]], Any]) -> None:
        """Call ``listener(versioned)`` for every later change, in order, from its own task."""
        self._value.add_listener(listener)

    def remove_listener(self, listener: Callable[[Versioned[int]], Any]) -> None:
        """Stop calling ``listener``."""
        self._value.remove_listener(listener)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the watch; see
        :meth:`SharedValue.recovery_events <etcd_recipes.SharedValue.recovery_events>`."""
        return self._value.recovery_events(maxsize)

    async def _do_start(self) -> None:
        await self._value.start()

    async def _do_close(self) -> None:
        await self._value.aclose()

    def _on_state(self, new: ConnectionState, old: ConnectionState) -> None:
        self._set_state(new)

    def _on_exception(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rsplit(":", 1)[-1] if ":" in context else None)
