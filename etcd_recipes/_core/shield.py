"""Shielded cleanup: the second half of the cancellation contract (architecture §4), shared
by every floor.

* :func:`run_shielded` -- run a cleanup **to completion**, shielded from both kinds of
  cancellation (anyio's scopes and native ``task.cancel()``), bounded by
  :data:`CLEANUP_TIMEOUT`; failures are logged, never raised.
* :func:`abort_guard` -- run a cleanup that way if a block ends by cancellation, timeout or
  error, then re-raise the original exception unchanged.
* :func:`settled` -- for the write such a cleanup undoes: a cancelled caller lets the write
  finish first (etcd may apply a write whose RPC was cancelled, *after* a cleanup's delete).

Not guaranteed: a cleanup longer than its bound finishes (it is abandoned, logged, and the
leases it would have revoked expire at their TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio

from .logctx import library_logger

__all__ = ["CLEANUP_TIMEOUT", "abort_guard", "run_shielded", "settled"]

log = library_logger("etcd_recipes.waiting")

CLEANUP_TIMEOUT = 5.0
"""Seconds a cleanup may take before it is abandoned (leases then expire at their TTL)."""

_T = TypeVar("_T")


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

        from etcd_recipes._core.shield import settled

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

        from etcd_recipes._core.shield import abort_guard

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
