"""Cooperative revocation, the holder's side: the marker a revocation request writes and the
watch that tells a holder of it. Package-private (the public side is
:mod:`etcd_recipes.locks.revocation`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._recipe.waiting import wait_for_change
from ..events import WatchRecoveryEvent
from ..types import EventType, WatchEvent
from ._holds import _Held
from ._waiters import _wait_unless_lost

if TYPE_CHECKING:
    from ..client import EtcdClient

REVOKE_VALUE = b"__REVOKE__"
"""The holder key's value once a revocation is requested (Curator's marker)."""


async def _watch_for_revocation(
    client: EtcdClient,
    held: _Held,
    on_request: Callable[[], None],
    on_recovery: Callable[[WatchRecoveryEvent], Any],
) -> None:
    """Wait until the hold's key carries :data:`REVOKE_VALUE` (then call ``on_request``), or
    the hold ends (its key deleted, its lease lost)."""
    hold = held.hold
    key, token = hold.key, hold.fencing_token

    async def probe() -> tuple[bool, int]:
        read = await client.range(key)
        kv = read.kvs[0] if read.kvs else None
        done = kv is None or kv.create_revision != token or kv.value == REVOKE_VALUE
        return done, read.revision

    def changed(event: WatchEvent) -> bool:
        return event.type is EventType.DELETE or event.kv.value == REVOKE_VALUE

    ok, _ = await _wait_unless_lost(
        hold.lease,
        wait_for_change(
            client,
            key,
            after_revision=token,
            trigger=changed,
            probe=probe,
            on_recovery=on_recovery,
        ),
    )
    if not ok or hold.is_released or hold.is_lost:
        return
    read = await client.range(key)
    kv = read.kvs[0] if read.kvs else None
    if kv is not None and kv.create_revision == token and kv.value == REVOKE_VALUE:
        on_request()
