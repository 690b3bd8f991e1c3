"""Transient key/values: a key that exists while its owner lives.

:Status: Beta

Key layout (shared with the Kotlin library): ``<key>`` holds the value on a **self-healing**
lease of ``lease_ttl`` seconds, written with a plain put (no compare-and-swap), also when the
lease heals.

Guarantees: the key exists while the owning process runs and keeps its lease alive; it
disappears within ``lease_ttl`` seconds after the process dies, and at once on ``aclose()``.
After a lease loss (a long pause, a partition) it is re-created; lease events are reported to
listeners and drive ``connection_state``.

Not guaranteed: between a lease expiry and its restoration the key really does not exist --
watchers see a delete followed by a put. Two owners of the same key overwrite each other
(last write wins); use a lock or an election for exclusivity.

Example::

    from etcd_recipes import TransientKeyValue

    async with TransientKeyValue(client, f"{prefix}/worker-1", "alive") as presence:
        assert (await client.get(presence.key)).value == b"alive"   # exists while this runs
    assert await client.get(f"{prefix}/worker-1") is None            # gone at once on close
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from ._core.validate import check_ttl
from ._recipe.outcomes import lease_lost_kind
from ._recipe.recipe import Recipe
from .client.lease import SelfHealingLease
from .codecs import Codec, to_bytes
from .errors import LeaseEventError
from .events import LeaseEvent, LeaseRestored, LeaseResumed

if TYPE_CHECKING:
    from .client import EtcdClient

__all__ = ["TransientKeyValue"]

T = TypeVar("T")
DEFAULT_TTL = 2


class TransientKeyValue(Recipe, Generic[T]):
    """A key bound to this process's lifetime through a self-healing lease.

    ``value`` is bytes or str, or any ``T`` with ``codec=`` (encoded once, at construction).

    Example::

        from etcd_recipes import JSON, TransientKeyValue

        key = f"{prefix}/svc-a"
        presence = TransientKeyValue(client, key, {"port": 8080}, codec=JSON, lease_ttl=5)
        presence.add_lease_listener(print)
        await presence.start()
        assert (await client.get(presence.key)).value == b'{"port":8080}'
        await presence.aclose()   # the key is gone at once
        assert await client.get(presence.key) is None

    ``metrics_name`` is the ``name`` label of its metrics (low-cardinality; ``""``: none): each
    loss of the key's lease is one ``lease_lost``.
    """

    _path_arg = "key"

    def __init__(
        self,
        client: EtcdClient,
        key: str,
        value: T | bytes | str,
        *,
        codec: Codec[T] | None = None,
        lease_ttl: float = DEFAULT_TTL,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, key, client_id=client_id, metrics_name=metrics_name)
        self.value: T | bytes | str = value
        """The value as given."""
        self._data = codec.encode(value) if codec is not None else to_bytes(value)  # type: ignore[arg-type]
        self.lease_ttl: int = check_ttl(lease_ttl, what="lease_ttl")
        self._lease: SelfHealingLease | None = None
        self._lease_events: Broadcast[LeaseEvent] = self._broadcast("lease")

    @property
    def key(self) -> str:
        """The key this recipe owns."""
        return self.path

    @property
    def lease_id(self) -> int:
        """The current lease id (0 before start or while healing)."""
        return self._lease.current_lease_id if self._lease is not None else 0

    def add_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with each lease event (Suspended, Expired, Restored, Failed)."""
        self._lease_events.add_listener(listener)

    def remove_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._lease_events.remove_listener(listener)

    def lease_events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[LeaseEvent]:
        """Each later lease event (what the lease listeners get), as an async iterator that
        ends when the recipe is closed; bounded by ``maxsize`` (see
        :class:`~etcd_recipes.EventStream`).

        Example::

            from etcd_recipes import LeaseExpired, LeaseRestored, TransientKeyValue

            async with TransientKeyValue(client, f"{prefix}/worker", "up") as presence:
                events = presence.lease_events()
                await client.lease_revoke(presence.lease_id)  # out of band: the key goes
                assert isinstance(await anext(events), LeaseExpired)
                assert isinstance(await anext(events), LeaseRestored)  # healed: the key is back
        """
        return self._lease_events.stream(maxsize)

    async def _do_start(self) -> None:
        async def establish(lease_id: int) -> bool:
            await self._client.put(self.path, self._data, lease=lease_id)
            return True

        lease = self._client.self_healing_lease(self.lease_ttl, establish)
        lease.add_listener(self._on_lease_event)
        await lease.start()
        self._lease = lease

    def _on_lease_event(self, event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        kind = lease_lost_kind(event)
        if kind is not None:
            self._meter.lease_lost(kind)
        if not isinstance(event, (LeaseRestored, LeaseResumed)):
            self._record_exception(LeaseEventError(event), "lease")
        self._lease_events.publish(event)

    async def _do_close(self) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            await lease.aclose()
