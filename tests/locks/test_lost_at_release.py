"""A hold lost while its process was not looking (paused past its TTL, say), whose first action
afterwards is ``release()``: the release must answer False -- its guarded delete found the key
gone -- and the loss must be reported (lock-lost listener, lock_lost_events, exceptions,
``connection_state``) although the monitor never saw it (issue 16 item 22).

"Not looking" is made deterministic: the hold's loss monitor is kept from starting (it starts
``_MONITOR_DELAY`` after the acquisition) and the lease TTL is long, so the keep-alive does not
notice either before the release runs; the lease is revoked (or the key deleted) by a second
client, as etcd would expire it while the holder is stopped.
"""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    ConnectionState,
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    LockLostError,
    PermitLostError,
    connect,
)
from etcd_recipes.locks import _session
from tests.helpers import eventually, take


@pytest.fixture
def unmonitored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_session, "_MONITOR_DELAY", 3600.0)


def _recipe(kind: str, client, path: str):
    if kind == "mutex":
        return DistributedMutex(client, path, lease_ttl=30)
    if kind == "write":
        return DistributedReadWriteLock(client, path, lease_ttl=30)
    return DistributedSemaphore(client, path, 1, lease_ttl=30)


def _side(kind: str, recipe):
    return recipe.write_lock if kind == "write" else recipe


@pytest.mark.parametrize("how", ["revoke", "delete"])
@pytest.mark.parametrize("kind", ["mutex", "write", "semaphore"])
async def test_release_of_a_hold_lost_unnoticed_returns_false_and_reports_it(
    etcd_server, etcd_client, etcd_prefix, unmonitored, kind, how
):
    path = etcd_prefix + "l"
    recipe = _recipe(kind, etcd_client, path)
    side = _side(kind, recipe)
    causes: list[object] = []
    states: list[ConnectionState] = []
    if kind == "semaphore":
        side.add_permit_lost_listener(causes.append)
        losses = side.permit_lost_events()
    else:
        side.add_lock_lost_listener(causes.append)
        losses = side.lock_lost_events()
    recipe.add_connection_state_listener(lambda new, old: states.append(new))
    assert await side.acquire(timeout=5)
    hold = side.hold
    assert hold is not None
    async with connect(**etcd_server.client_kwargs()) as other:  # etcd, behind our back
        if how == "revoke":
            assert await other.lease_revoke(hold.lease_id)
        else:
            await other.delete(hold.key)
    assert not hold.is_lost  # nothing noticed it yet: the holder was "stopped"
    assert await side.release() is False
    assert hold.is_lost
    await eventually(lambda: len(causes) == 1, what="the lost listener")
    assert await take(losses, 1) == [causes[0]]
    assert recipe.connection_state is ConnectionState.LOST and ConnectionState.LOST in states
    error = LockLostError if kind != "semaphore" else PermitLostError
    assert any(isinstance(e.exception, error) for e in recipe.exceptions)
    await asyncio.sleep(0.1)
    assert len(causes) == 1  # once, whoever noticed
    # The instance is usable again, on a lease that is alive.
    assert await side.acquire(timeout=5)
    assert await side.release() is True
    await recipe.aclose()


async def test_release_of_a_current_hold_returns_true_and_reports_nothing(
    etcd_client, etcd_prefix, unmonitored
):
    mutex = DistributedMutex(etcd_client, etcd_prefix + "m", lease_ttl=30)
    causes: list[object] = []
    mutex.add_lock_lost_listener(causes.append)
    assert await mutex.acquire(timeout=5)
    assert await mutex.release() is True
    await asyncio.sleep(0.1)
    assert causes == [] and mutex.connection_state is ConnectionState.CONNECTED
    await mutex.aclose()
