"""ServiceRegistry: the write side of discovery -- register, update, unregister.

Each registration is the key ``<service_path>/names/<name>/<id>`` holding the instance's JSON,
on **its own self-healing lease** of ``lease_ttl`` seconds.

Guaranteed:

* ``register`` writes only if the key does not exist (never overwrites another registrant's
  record: :class:`~etcd_recipes.errors.DuplicateServiceInstanceError`);
* a heal re-writes the **latest** JSON: ``update`` changes what a heal writes, and an update
  racing a heal is serialised with it, so a stale payload is never resurrected (CURATOR-181);
* a heal after etcd comes back with the record still present on the lease this registry gave
  up on (a restart or a pause longer than the TTL) takes the record over onto the new lease
  instead of failing -- only a record on someone else's lease is left alone (then
  ``LeaseFailed``, and the registration is dropped);
* ``unregister`` (and ``aclose``) revoke the lease and delete the record at once, shielded
  from cancellation; a cancelled ``register`` leaves no record behind;
* lease events of every registration go to the lease listeners and :meth:`lease_events`, and
  drive ``connection_state``; each loss of a registration's lease is one ``lease_lost`` event
  to the client's metrics hook (``expired`` or ``keep_alive_failed``; ``name`` label: the
  ``metrics_name`` given, never the instance or its key).

Not guaranteed: between an expiry and its heal the record does not exist (caches see a delete
then a put); a record deleted out of band while its lease lives is re-created only by the next
``update`` or heal.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic

from .._core.logctx import library_logger
from .._core.shield import run_shielded, settled
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Op
from .._core.validate import check_ttl
from .._recipe.outcomes import lease_lost_kind
from .._recipe.recipe import Recipe
from ..client.lease import SelfHealingLease
from ..codecs import Codec
from ..errors import (
    DuplicateServiceInstanceError,
    EtcdRecipeError,
    InvalidArgumentError,
    LeaseEventError,
    ServiceInstanceNotFoundError,
)
from ..events import LeaseEvent, LeaseFailed, LeaseRestored
from ..types import KeyValue, RangeResult, TxnResult
from ._keys import instance_key, names_path
from .instance import PayloadT, ServiceInstance

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DEFAULT_TTL", "ServiceRegistry"]

log = library_logger("etcd_recipes.discovery")

DEFAULT_TTL = 2


def _read(result: TxnResult) -> list[KeyValue]:
    """The keys the failure branch's ``Op.get`` read."""
    first = result.responses[0] if result.responses else None
    return first.kvs if isinstance(first, RangeResult) else []


class _Registration(Generic[PayloadT]):
    """One registered instance: its latest version and JSON, its lease, and the lease id the
    record was last written on (the heal's proof that a surviving record is ours)."""

    def __init__(self, key: str, instance: ServiceInstance[PayloadT], data: bytes) -> None:
        self.key = key
        self.instance = instance
        self.data = data
        self.owned = 0  # the lease the record was last written on by us
        self.lease: SelfHealingLease | None = None
        self.lock = asyncio.Lock()  # serialises update() with a heal's establish


def _lease_ttl(lease_ttl: float, ttl: float | None, owner: str) -> int:
    """``lease_ttl``, or the deprecated ``ttl=`` spelling of it (with a warning)."""
    if ttl is None:
        return check_ttl(lease_ttl, what="lease_ttl")
    warnings.warn(
        f"{owner}(ttl=...) is deprecated: say lease_ttl=, as every other recipe does",
        DeprecationWarning,
        stacklevel=3,
    )
    if lease_ttl != DEFAULT_TTL and lease_ttl != ttl:
        raise InvalidArgumentError(f"{owner}: give lease_ttl= or its old name ttl=, not both")
    return check_ttl(ttl, what="ttl")


class ServiceRegistry(Recipe, Generic[PayloadT]):
    """Registers service instances under ``service_path``, each on a self-healing lease.

    ``codec`` encodes payloads to the text of ``jsonPayload`` (payloads are ``str`` without
    one). No ``start()`` is needed (``async with`` is the usual form); ``aclose()``
    unregisters everything still registered.

    Example::

        from dataclasses import replace
        from etcd_recipes import JSON, ServiceInstance, ServiceRegistry

        async with ServiceRegistry(client, f"{prefix}/services", codec=JSON) as registry:
            me = ServiceInstance("orders", {"v": 1}, address="10.0.0.7", port=8080)
            await registry.register(me)
            assert (await client.get(registry.key_of(me))).lease == registry.lease_id(me)
            await registry.update(replace(me, payload={"v": 2}))  # heals write this one
        assert await client.get(f"{prefix}/services/names/orders/{me.id}") is None
    """

    one_shot = False

    def __init__(
        self,
        client: EtcdClient,
        service_path: str,
        *,
        lease_ttl: float = DEFAULT_TTL,
        codec: Codec[PayloadT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
        ttl: float | None = None,
    ) -> None:
        super().__init__(client, service_path, client_id=client_id, metrics_name=metrics_name)
        self.lease_ttl: int = _lease_ttl(lease_ttl, ttl, type(self).__name__)
        """The lease TTL of each registration, in whole seconds."""
        self.ttl: int = self.lease_ttl
        """Deprecated alias of :attr:`lease_ttl` (every other recipe says ``lease_ttl``)."""
        self._codec = codec
        self._regs: dict[str, _Registration[PayloadT]] = {}
        self._pending: set[str] = set()
        self._lease_events: Broadcast[LeaseEvent] = self._broadcast("lease")

    def __repr__(self) -> str:
        return (
            f"<{self.exception_context} {self._lifecycle} registered={len(self._regs)} "
            f"{self._state.value}>"
        )

    @property
    def names_path(self) -> str:
        """``<service_path>/names``: the prefix every registration lives under."""
        return names_path(self.path)

    def key_of(self, instance: ServiceInstance[PayloadT]) -> str:
        """The key of ``instance``'s record: ``<service_path>/names/<name>/<id>``."""
        return instance_key(self.path, instance)

    def registered(self) -> list[ServiceInstance[PayloadT]]:
        """The latest version of every instance registered here, by key. No I/O."""
        return [reg.instance for _, reg in sorted(self._regs.items())]

    def lease_id(self, instance: ServiceInstance[PayloadT]) -> int:
        """The lease ``instance``'s record is on now (0 while healing)."""
        reg = self._regs.get(self.key_of(instance))
        if reg is None:
            raise ServiceInstanceNotFoundError(f"{self.key_of(instance)} is not registered here")
        return reg.lease.current_lease_id if reg.lease is not None else 0

    # ---------------------------------------------------------------- lease events

    def add_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Call ``listener`` with each lease event of every registration (Suspended,
        Expired, Restored, Failed)."""
        self._lease_events.add_listener(listener)

    def remove_lease_listener(self, listener: Callable[[LeaseEvent], Any]) -> None:
        """Stop calling ``listener``."""
        self._lease_events.remove_listener(listener)

    def lease_events(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[LeaseEvent]:
        """Each later lease event of every registration, as an async iterator that ends
        when the registry is closed; bounded by ``maxsize`` (see
        :class:`~etcd_recipes.EventStream`).

        Example::

            from etcd_recipes import LeaseExpired, LeaseRestored
            from etcd_recipes import ServiceInstance, ServiceRegistry

            async with ServiceRegistry(client, f"{prefix}/services") as registry:
                me = ServiceInstance("orders", "", port=8080)
                await registry.register(me)
                events = registry.lease_events()
                await client.lease_revoke(registry.lease_id(me))  # out of band
                assert isinstance(await anext(events), LeaseExpired)
                assert isinstance(await anext(events), LeaseRestored)  # the record is back
        """
        return self._lease_events.stream(maxsize)

    def _on_lease_event(self, reg: _Registration[PayloadT], event: LeaseEvent) -> None:
        self._on_recovery_event(event)
        kind = lease_lost_kind(event)  # a later LeaseFailed is the heal giving up on it
        if kind is not None:
            self._meter.lease_lost(kind)
        if not isinstance(event, LeaseRestored):
            self._record_exception(LeaseEventError(event), f"lease {reg.key}")
        if isinstance(event, LeaseFailed) and self._regs.get(reg.key) is reg:
            del self._regs[reg.key]  # someone else's record is there now: ours is gone
            if reg.lease is not None:
                self._spawn(reg.lease.aclose(), f"close the lease of {reg.key}")
            log.warning(
                "%s: %s could not be re-registered; dropped", self.exception_context, reg.key
            )
        self._lease_events.publish(event)

    # ---------------------------------------------------------------- writes

    def _establish_for(self, reg: _Registration[PayloadT]) -> Callable[[int], Any]:
        client = self._client

        async def establish(lease_id: int) -> bool:
            async with reg.lock:
                key = reg.key
                for _ in range(3):  # the record may vanish between our two transactions
                    data = reg.data
                    r = await settled(
                        client.txn(
                            [Cmp.missing(key)], [Op.put(key, data, lease=lease_id)], [Op.get(key)]
                        )
                    )
                    if r.succeeded:
                        reg.owned = lease_id
                        return True
                    kvs = _read(r)
                    if not kvs:
                        continue  # deleted since: create it
                    if not (reg.owned and kvs[0].lease == reg.owned):
                        return False  # not ours (or the first registration): never overwrite
                    # Ours, on the lease we gave up on (etcd came back with it): move it over.
                    r = await settled(
                        client.txn(
                            [Cmp.mod_revision(key) == kvs[0].mod_revision],
                            [Op.put(key, data, lease=lease_id)],
                        )
                    )
                    if r.succeeded:
                        old, reg.owned = reg.owned, lease_id
                        log.info(
                            "%s: %s moved from lease %x to %x",
                            self.exception_context,
                            key,
                            old,
                            lease_id,
                        )
                        self._spawn(client.lease_revoke(old), f"revoke {old:x}")
                        return True
                return False

        return establish

    async def register(self, instance: ServiceInstance[PayloadT]) -> None:
        """Write ``instance``'s record on a new self-healing lease.

        Raises :class:`~etcd_recipes.errors.DuplicateServiceInstanceError` if its id is
        already registered under its name, here or by anyone. Cancelled, it leaves nothing
        behind (the lease is revoked, so a record that landed goes with it)."""
        self._check_open()
        key = self._key_checked(instance)
        if key in self._regs or key in self._pending:
            raise DuplicateServiceInstanceError(f"{key} is already registered by this registry")
        reg = _Registration(key, instance, instance.to_json(self._codec))
        lease = self._client.self_healing_lease(self.lease_ttl, self._establish_for(reg))
        lease.add_listener(lambda event: self._on_lease_event(reg, event))
        self._pending.add(key)
        try:
            if not await lease.start():
                raise DuplicateServiceInstanceError(
                    f"{key} already exists: another registrant holds this id"
                )
            reg.lease = lease
            if self.is_closed:  # closed while we were registering: undo
                await run_shielded(lease.aclose, what=f"unregistering {key}")
                self._check_open()
            self._regs[key] = reg
        except BaseException:
            await run_shielded(lease.aclose, what=f"undoing the registration of {key}")
            raise
        finally:
            self._pending.discard(key)

    async def update(self, instance: ServiceInstance[PayloadT]) -> None:
        """Replace the record of a registered instance (same name and id) with ``instance``;
        from now on heals write this version. While the lease is healing the record is not
        written here: the heal writes it.

        Raises :class:`~etcd_recipes.errors.ServiceInstanceNotFoundError` if the instance
        was not registered by this registry."""
        self._check_open()
        key = self._key_checked(instance)
        reg = self._regs.get(key)
        if reg is None:
            raise ServiceInstanceNotFoundError(
                f"{key} was not registered with this registry (register() it first)"
            )
        data = instance.to_json(self._codec)
        async with reg.lock:
            reg.instance, reg.data = instance, data
            lease = reg.lease
            if lease is None or not lease.is_healthy or not reg.owned:
                return  # healing: the heal writes the latest data
            owned = reg.owned
            r = await settled(
                self._client.txn(
                    [Cmp.lease(key) == owned], [Op.put(key, data, lease=owned)], [Op.get(key)]
                )
            )
            if r.succeeded:
                return
            kvs = _read(r)
            if kvs:
                raise DuplicateServiceInstanceError(
                    f"{key} is now held by lease {kvs[0].lease:x}, not ours ({owned:x})"
                )
            # Deleted out of band while our lease lives: re-create it.
            await settled(self._client.txn([Cmp.missing(key)], [Op.put(key, data, lease=owned)]))

    async def unregister(self, instance: ServiceInstance[PayloadT]) -> None:
        """Remove ``instance``'s record at once (its lease is revoked); shielded from
        cancellation. Raises :class:`~etcd_recipes.errors.ServiceInstanceNotFoundError` if
        it is not registered here."""
        key = self._key_checked(instance)
        reg = self._regs.pop(key, None)
        if reg is None:
            raise ServiceInstanceNotFoundError(f"{key} is not registered with this registry")
        await run_shielded(lambda: self._drop(reg), what=f"unregistering {key}")

    async def _drop(self, reg: _Registration[PayloadT]) -> None:
        owned = reg.owned
        if reg.lease is not None:
            await reg.lease.aclose()  # revokes: the record goes with the lease
        if owned:  # belt and braces, should the revoke not have reached etcd
            await self._client.txn([Cmp.lease(reg.key) == owned], [Op.delete(reg.key)])

    def _key_checked(self, instance: Any) -> str:
        if not isinstance(instance, ServiceInstance):
            raise InvalidArgumentError(f"expected a ServiceInstance, got {type(instance).__name__}")
        return self.key_of(instance)

    async def _do_close(self) -> None:
        regs, self._regs = list(self._regs.values()), {}
        errors: list[BaseException] = []
        for reg in regs:
            try:
                await self._drop(reg)
            except EtcdRecipeError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
