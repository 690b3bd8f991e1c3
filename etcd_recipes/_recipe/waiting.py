"""Waiting for a change in etcd, and the cancellation contract every waiting recipe inherits.

Two pieces:

* :func:`wait_for_change` -- the waiter pattern (architecture §3.4, "snapshot, then watch"): the
  caller has read the state at revision ``R``; we watch from ``R + 1`` (nothing can fall between
  the read and the watch), return when an event satisfies ``trigger``, re-probe the state after
  every watch recovery (resubscribe or compaction resync), and raise if the watch fails for good.
* :func:`wait_for_put_under` -- the same guarantee for "a key was put under this prefix after
  ``R``" (the queues' empty-queue wait), with **one watch per client and prefix** shared by
  every parked waiter, each of which is a bare future: thousands of parked consumers cost a
  few KB each and one watch. Not guaranteed: the absence of spurious wake-ups (after a
  recovery, or for a read older than the shared watch's anchor); callers re-read anyway.

The cleanup half of the cancellation contract (``abort_guard``, ``settled``,
``run_shielded``) lives on the ground floor, :mod:`etcd_recipes._core.shield`, since the
client's own calls use it too.

Both work under plain asyncio (task cancel, ``asyncio.timeout``) and under anyio cancel scopes
(``fail_after``, task-group cancellation), since anyio on asyncio cancels with native
``CancelledError`` and honours ``CancelScope(shield=True)``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._core.logctx import library_logger
from ..errors import WatchFailedError
from ..events import WatchFailed, WatchRecoveryEvent, WatchResubscribed, WatchResynced
from ..types import SortOrder, SortTarget, WatchEvent

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "Interrupts",
    "Probe",
    "wait_for_change",
    "wait_for_put_under",
]

log = library_logger("etcd_recipes.waiting")

Probe = Callable[[], Awaitable[tuple[bool, int]]]
"""Re-reads the state: returns ``(done, revision_of_the_read)``."""


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


class Interrupts:
    """The parked put-waits of one recipe (:func:`wait_for_put_under` with ``interrupts=``),
    so that closing the recipe ends them at once: each such wait then returns ``False``."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: set[asyncio.Future[bool]] = set()

    def interrupt_all(self) -> None:
        """End every parked wait now (it returns ``False``)."""
        for future in self._futures:
            if not future.done():
                future.set_result(False)


YOUNG = 1.0
"""Seconds during which a shared watch created behind the head may still be replayed late by
etcd's 100 ms catch-up loop: a waiter that joins it meanwhile looks once itself."""


_SHARED: weakref.WeakKeyDictionary[EtcdClient, dict[Any, _PutWaker]] = weakref.WeakKeyDictionary()


def _shared(client: EtcdClient) -> dict[Any, _PutWaker]:
    """The shared wakers of ``client``, by ``("put", prefix, loop)``: a client's wakers die
    with it, and a caller on another loop (or in a forked child) gets a waker of its own, whose
    ``client.watch()`` raises the client's misuse error."""
    shared = _SHARED.get(client)
    if shared is None:
        shared = _SHARED[client] = {}
    return shared


class _PutWaker:
    """One watch for puts under a prefix, shared by every parked waiter of one client.

    A waiter is a future plus the revision its read saw (``after``); it is woken (``True``) by
    the first put above ``after``. The watch is anchored at the first waiter's ``after + 1``;
    a later waiter whose read is older than that anchor, or that was overtaken by a put the
    watch already delivered, is woken at once -- a spurious wake-up only costs its caller a
    re-read, a missed one would strand it. Closed when the last waiter leaves.
    """

    __slots__ = (
        "_client",
        "_key",
        "_prefix",
        "_probe",
        "_task",
        "_watch",
        "born",
        "last_put",
        "start",
        "waiters",
    )

    def __init__(self, client: EtcdClient, key: Any, prefix: str, after: int) -> None:
        self._client = client
        self._key = key
        self._prefix = prefix
        self.start = after + 1  # the first revision the watch covers
        self.last_put = 0  # the newest put the watch delivered (or a recovery read implied)
        self.born = asyncio.get_running_loop().time()
        # future -> (the revision its read saw, its recovery listener, woken alone by a put?)
        self.waiters: dict[
            asyncio.Future[bool], tuple[int, Callable[[WatchRecoveryEvent], Any] | None, bool]
        ] = {}
        self._probe = 0  # what the compaction resync read found: the newest put under it
        self._watch = client.watch(
            prefix,
            prefix=True,
            start_revision=self.start,
            no_delete=True,
            resync=self._resync,
        )
        self._task: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._run(), name="etcd-recipes-put-waker"
        )

    @property
    def synced(self) -> bool:
        return self._watch.is_synced

    def add(
        self,
        future: asyncio.Future[bool],
        after: int,
        on_recovery: Callable[[WatchRecoveryEvent], Any] | None,
        one: bool = False,
    ) -> None:
        if after + 1 < self.start or self.last_put > after:
            if not future.done():  # the watch cannot vouch for (after, start): look again
                future.set_result(True)
            return
        self.waiters[future] = (after, on_recovery, one)

    def discard(self, future: asyncio.Future[bool]) -> None:
        self.waiters.pop(future, None)
        if not self.waiters:
            self._close()

    def _close(self) -> None:
        shared = _shared(self._client)
        if shared.get(self._key) is self:
            del shared[self._key]
        self._task.cancel()

    async def _resync(self) -> int:
        self._probe, revision = await newest_put(self._client, self._prefix)
        return revision + 1

    def _wake(self, revision: int, *, put: bool = False) -> None:
        """A put at ``revision`` (``put``: one event of the watch) or a read that found a key
        last put then: wake the waiters whose read is older -- of those that take one item
        each (``one``), only the longest parked for one put: the others would only race it
        for the item and park again (a herd of re-reads that grows with the waiters)."""
        if revision > self.last_put:
            self.last_put = revision
        woke_one = False
        for future, (after, _, one) in list(self.waiters.items()):
            if after < revision and not future.done():
                if one and put:
                    if woke_one:
                        continue
                    woke_one = True
                future.set_result(True)

    def pass_on(self) -> None:
        """Wake the longest-parked waiter: a consumer that may have been woken for an item
        left without taking it (cancelled, failed, closed), so another looks instead."""
        for future in self.waiters:
            if not future.done():
                future.set_result(True)
                return

    def _recovered(self, item: WatchRecoveryEvent) -> None:
        listeners = {cb: None for _, cb, _ in self.waiters.values() if cb is not None}
        for listener in listeners:
            listener(item)

    async def _run(self) -> None:
        try:
            async with self._watch as watch:
                if not watch.is_synced:
                    # Writes landed between the first waiter's read and the watch: etcd
                    # replays them from its catch-up loop (up to ~100 ms late). Look now.
                    self._wake((await newest_put(self._client, self._prefix))[0])
                async for item in watch.items():
                    if isinstance(item, WatchEvent):
                        self._wake(item.kv.mod_revision, put=True)
                        continue
                    self._recovered(item)
                    if isinstance(item, WatchResynced):
                        self._wake(self._probe)  # events before the resync were dropped
                    elif isinstance(item, WatchResubscribed):
                        self._wake((await newest_put(self._client, self._prefix))[0])
                    elif isinstance(item, WatchFailed):
                        raise WatchFailedError(
                            f"the watch on {item.key!r} failed while waiting: {item.cause}"
                        ) from item.cause
            self._end(False)  # the watch ended: its waiters look again (a new one watches)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)
        finally:
            shared = _shared(self._client)
            if shared.get(self._key) is self:
                del shared[self._key]

    def _fail(self, exc: BaseException) -> None:
        for future in list(self.waiters):
            if not future.done():
                future.set_exception(exc)
        self.waiters.clear()

    def _end(self, result: bool) -> None:
        for future in list(self.waiters):
            if not future.done():
                future.set_result(result)
        self.waiters.clear()


async def newest_put(client: EtcdClient, prefix: str) -> tuple[int, int]:
    """``(mod revision of the key last put under prefix (0: none), the read's revision)``."""
    read = await client.range(
        prefix,
        prefix=True,
        limit=1,
        keys_only=True,
        sort_target=SortTarget.MOD,
        sort_order=SortOrder.DESCEND,
    )
    return (read.kvs[0].mod_revision if read.kvs else 0), read.revision


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)


async def wait_for_put_under(
    client: EtcdClient,
    prefix: str | Sequence[str],
    *,
    after_revision: int,
    timeout: float | None,
    on_recovery: Callable[[WatchRecoveryEvent], Any] | None = None,
    interrupts: Interrupts | None = None,
    one: bool = False,
) -> bool:
    """Wait until a key is put under ``prefix`` (or any of several) after ``after_revision``;
    False on timeout, or when ``interrupts`` ends the wait.

    ``one``: the caller takes one item per wake-up (a queue consumer): a put wakes only the
    longest-parked of such waiters, not all of them (recoveries still wake all). A caller that
    leaves without taking what it was woken for -- cancelled, failed, closed -- must call
    :func:`pass_on`, which wakes the next; a spurious wake-up only costs a re-read.

    The queues' empty-queue wait. Every waiter of one client on one prefix shares **one** watch
    (anchored at the first waiter's revision + 1) and parks on a future: no task, watch or
    cancel scope of its own. A waiter may be woken spuriously (after a recovery that found
    items, or when its read is older than the shared watch's anchor): the caller re-reads the
    true head either way, and never misses a put after its read. Cancellation propagates
    unchanged; a watch that fails for good raises :class:`~etcd_recipes.errors.WatchFailedError`.
    """
    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[bool] = loop.create_future()
    shared = _shared(client)
    wakers: list[_PutWaker] = []
    handle = None
    left_woken = False
    try:
        young = False
        for p in prefixes:
            if future.done():
                break
            key = ("put", p, loop)  # a waker serves the loop it runs on
            waker = shared.get(key)
            if waker is None:
                waker = shared[key] = _PutWaker(client, key, p, after_revision)
            elif not waker.synced and loop.time() - waker.born < YOUNG:
                young = True
            waker.add(future, after_revision, on_recovery, one)
            wakers.append(waker)
        if interrupts is not None:
            interrupts._futures.add(future)
        if timeout is not None and not future.done():
            handle = loop.call_later(timeout, _expire, future)
        if young and not future.done():
            for p in prefixes:  # a young shared watch may replay late: look once
                if (await newest_put(client, p))[0] > after_revision:
                    return True
        return await future
    except BaseException:
        # Woken, then cancelled before it could look: the next waiter looks instead.
        left_woken = one and future.done() and not future.cancelled() and not future.exception()
        raise
    finally:
        if handle is not None:
            handle.cancel()
        if interrupts is not None:
            interrupts._futures.discard(future)
        for waker in wakers:
            waker.discard(future)
            if left_woken and future.result():
                waker.pass_on()


def pass_on(client: EtcdClient, prefix: str | Sequence[str]) -> None:
    """Wake the longest-parked waiter of each of ``client``'s wakers on ``prefix`` (in this
    loop): what a consumer that may have been woken for an item calls when it leaves without
    taking it, so the item is never left with every other consumer asleep."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    shared = _shared(client)
    for p in [prefix] if isinstance(prefix, str) else prefix:
        waker = shared.get(("put", p, loop))
        if waker is not None:
            waker.pass_on()
