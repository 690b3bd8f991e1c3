"""Waiting for a change in etcd, and the cancellation contract every waiting recipe inherits.

Three pieces:

* :func:`wait_for_change` -- the waiter pattern (reference.md §2.7): the caller has read the
  state at revision ``R``; we watch from ``R + 1`` (nothing can fall between the read and the
  watch), return when an event satisfies ``trigger``, re-probe the state after every watch
  recovery (resubscribe or compaction resync), and raise if the watch fails for good.
* :func:`abort_guard` -- the cancellation contract (DESIGN §4): if the guarded block ends by
  cancellation, timeout or error, the recipe's ``cleanup`` runs **to completion**, shielded
  from the cancellation and bounded in time, and then the original exception -- the caller's
  own ``CancelledError`` or anyio cancellation -- is re-raised unchanged.
* :func:`settled` -- for the write such a cleanup undoes: a cancelled caller lets the write
  finish first (etcd may apply a write whose RPC was cancelled, *after* a cleanup's delete).

Both work under plain asyncio (task cancel, ``asyncio.timeout``) and under anyio cancel scopes
(``fail_after``, task-group cancellation), since anyio on asyncio cancels with native
``CancelledError`` and honours ``CancelScope(shield=True)``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from ..errors import WatchFailedError
from ..events import WatchFailed, WatchRecoveryEvent, WatchResubscribed, WatchResynced
from ..types import EventType, WatchEvent
from .logctx import library_logger

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "CLEANUP_TIMEOUT",
    "Probe",
    "abort_guard",
    "run_shielded",
    "settled",
    "wait_for_change",
    "wait_for_put_under",
]

log = library_logger("etcd_recipes.waiting")

CLEANUP_TIMEOUT = 5.0
"""Seconds a cleanup may take before it is abandoned (leases then expire at their TTL)."""

_T = TypeVar("_T")

Probe = Callable[[], Awaitable[tuple[bool, int]]]
"""Re-reads the state: returns ``(done, revision_of_the_read)``."""


async def run_shielded(
    cleanup: Callable[[], Awaitable[Any]],
    *,
    what: str = "cleanup",
    timeout: float = CLEANUP_TIMEOUT,
) -> None:
    """Run ``cleanup`` to completion, shielded from cancellation, bounded by ``timeout``.

    Shielded against both kinds of cancellation: anyio's (a ``CancelScope(shield=True)``) and
    native asyncio ones (``task.cancel()`` again while cleaning up, e.g. by a task group whose
    sibling failed), which pierce anyio shields. The cleanup runs in its own task; a native
    cancellation that arrives meanwhile is re-raised once the cleanup has finished.
    Failures are logged, never raised: a cleanup must not mask the error that triggered it.
    """

    async def bounded() -> None:
        with anyio.move_on_after(timeout) as scope:
            try:
                await cleanup()
            except Exception as exc:
                log.warning("%s failed: %r", what, exc)
        if scope.cancelled_caught:
            log.warning("%s did not finish within %.1fs; abandoned", what, timeout)

    late_cancel: BaseException | None = None
    with anyio.CancelScope(shield=True):
        task = asyncio.get_running_loop().create_task(bounded())
        while True:
            try:
                await asyncio.shield(task)
                break
            except asyncio.CancelledError as exc:
                if task.done():
                    break
                late_cancel = exc  # keep waiting: the cleanup must finish first
    if late_cancel is not None:
        raise late_cancel


async def settled(write: Awaitable[_T], *, what: str = "a cancelled write") -> _T:
    """Await ``write`` so that cancelling the caller cannot leave its outcome for later.

    A write RPC cancelled in flight may still be applied by etcd -- after whatever the caller
    does next, such as a cleanup that deletes the key it was creating, which would leave the
    key behind (with a lease its recipe keeps alive). Here the write runs in its own task and
    is never cancelled: on cancellation the caller waits (shielded, bounded by
    :data:`CLEANUP_TIMEOUT`) until it has been answered, then re-raises the cancellation
    unchanged. The caller's cleanup then sees the write applied or not, never pending.

    Example::

        import asyncio

        from etcd_recipes._core.waiting import settled

        key = prefix + "/claimed"
        task = asyncio.ensure_future(settled(client.put(key, b"me")))
        await asyncio.sleep(0)  # the put is in flight ...
        task.cancel()  # ... when the caller gives up
        try:
            await task
        except asyncio.CancelledError:
            pass
        await client.delete(key)  # the put has been answered: this delete comes after it
        assert await client.get(key) is None
    """
    task = asyncio.ensure_future(write)
    try:
        return await asyncio.shield(task)
    except BaseException:
        if not task.done():

            async def answered() -> None:
                with contextlib.suppress(Exception):
                    await task

            await run_shielded(answered, what=what)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: its failure is the caller's cancellation now
        raise


@contextlib.asynccontextmanager
async def abort_guard(
    cleanup: Callable[[], Awaitable[Any]], *, what: str = "cleanup"
) -> AsyncIterator[None]:
    """Run ``cleanup`` (shielded, bounded) if the block exits with any exception, then re-raise
    that exception unchanged -- including cancellation.

    Example::

        import asyncio

        from etcd_recipes._core.waiting import abort_guard

        key = prefix + "/waiter"

        async def remove_waiter() -> None:
            await client.delete(key)

        try:
            async with abort_guard(remove_waiter):
                await client.put(key, b"me")
                await asyncio.wait_for(asyncio.Event().wait(), 0.1)  # gives up waiting
        except asyncio.TimeoutError:
            assert await client.get(key) is None  # the cleanup ran
    """
    try:
        yield
    except BaseException:
        await run_shielded(cleanup, what=what)
        raise


async def wait_for_change(
    client: EtcdClient,
    key: bytes | str,
    *,
    after_revision: int,
    trigger: Callable[[WatchEvent], bool],
    probe: Probe,
    prefix: bool = False,
    no_put: bool = False,
    no_delete: bool = False,
    timeout: float | None = None,
    on_recovery: Callable[[WatchRecoveryEvent], Any] | None = None,
) -> bool:
    """Wait until a change after ``after_revision`` satisfies ``trigger``; False on timeout.

    ``probe`` re-reads the state after any watch recovery: if it reports done, the wait ends;
    on compaction it also provides the revision to continue from. ``on_watch`` is called with
    the watch once it is live (recipes use it to drive their connection state). The watch is
    always closed on exit; cancellation propagates unchanged.
    """
    done_by_resync = False

    async def resync() -> int:
        nonlocal done_by_resync
        done, revision = await probe()
        done_by_resync = done_by_resync or done
        return revision + 1

    watch = client.watch(
        key,
        prefix=prefix,
        start_revision=after_revision + 1,
        no_put=no_put,
        no_delete=no_delete,
        resync=resync,
    )
    with anyio.move_on_after(timeout):
        async with watch:
            if not watch.is_synced:
                # Writes landed between the read and the watch: etcd replays them to this
                # watch from its catch-up loop (up to ~100 ms late). Look now instead; the
                # watch still covers everything after.
                done, _ = await probe()
                if done:
                    return True
            async for item in watch.items():
                if isinstance(item, WatchEvent):
                    if trigger(item):
                        return True
                    continue
                if on_recovery is not None:
                    on_recovery(item)
                if isinstance(item, WatchResynced):
                    if done_by_resync:
                        return True
                elif isinstance(item, WatchResubscribed):
                    done, _ = await probe()
                    if done:
                        return True
                elif isinstance(item, WatchFailed):
                    raise WatchFailedError(
                        f"the watch on {item.key!r} failed while waiting: {item.cause}"
                    ) from item.cause
    return False


def _is_put(event: WatchEvent) -> bool:
    return event.type is EventType.PUT


async def wait_for_put_under(
    client: EtcdClient,
    prefix: str,
    *,
    after_revision: int,
    timeout: float | None,
    on_recovery: Callable[[WatchRecoveryEvent], Any] | None = None,
) -> bool:
    """Wait until a key is put under ``prefix`` after ``after_revision``; False on timeout.

    The queues' empty-queue wait: after a recovery it returns if anything is under the prefix
    (the caller re-reads the true head either way).
    """

    async def probe() -> tuple[bool, int]:
        now = await client.range(prefix, prefix=True, count_only=True)
        return now.count > 0, now.revision

    return await wait_for_change(
        client,
        prefix,
        after_revision=after_revision,
        trigger=_is_put,
        probe=probe,
        prefix=True,
        no_delete=True,
        timeout=timeout,
        on_recovery=on_recovery,
    )
