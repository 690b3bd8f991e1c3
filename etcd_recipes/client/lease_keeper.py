"""The client's lease keeper: every lease of a client kept alive on ONE multiplexed
``LeaseKeepAlive`` stream.

:class:`LeaseKeeper` renews every registered lease at a third of its TTL and detects loss: a
reply with TTL <= 0 (revoked or expired), or renewals stopped past the TTL (the stream is down
or the server is paused). A stream error while the lease may still be valid is reported as
suspended, and the first renewal answered after that as resumed (so every recovery is
reported, not only heals). The lease handles (:mod:`etcd_recipes.client.lease`) register
with it; it knows nothing about them.

Not guaranteed: a renewal reaches etcd in time when the stream is stalled; the keeper then
reports the lease lost at its deadline, which is the safe side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc as pb

from .._core.logctx import library_logger
from .._core.metering import meter_for
from ..errors import ClientClosedError, EtcdRecipeError, LeaseNotFoundError
from ..resilience import RetryPolicy
from .wire import REQUIRE_LEADER, StreamMoved, Wire, task_cancelling

if TYPE_CHECKING:
    pass

__all__ = ["LeaseKeeper", "unanswered_bound"]

log = library_logger("etcd_recipes.lease")

_STREAM_BACKOFF = RetryPolicy.exponential_backoff(initial_delay=0.05, max_delay=1.0, jitter=0.2)


class _Registration:
    """One lease kept alive by the keeper; callbacks are internal and must not block."""

    def __init__(
        self,
        lease_id: int,
        ttl: int,
        on_lost: Callable[[BaseException | None], None],
        on_suspended: Callable[[BaseException | None], None],
        on_resumed: Callable[[], None] | None = None,
    ) -> None:
        self.lease_id = lease_id
        self.ttl = ttl
        now = time.monotonic()
        self.next_due = now
        self.deadline = now + ttl
        self.sent: deque[float] = deque()  # send times of unanswered renewals, oldest first
        self.on_lost = on_lost
        self.on_suspended = on_suspended
        self.on_resumed = on_resumed
        self.suspended = False
        self.active = True
        self.renewals = 0
        self.loss_kind = ""  # why it was lost: see AcquisitionLease.loss_kind


def unanswered_bound(ttl: int) -> float:
    """Seconds a renewal of a lease of ``ttl`` may go unanswered before the keep-alive stream
    is treated as failed: a third of the TTL (the renewal interval), at least 2 s -- a slow
    answer costs a stream restart, never a lease."""
    return max(2.0, ttl / 3.0)


class LeaseKeeper:
    """Owns the client's keep-alive stream and the renewal schedule of its leases."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._metrics = meter_for(wire.metrics)
        self._regs: dict[int, _Registration] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._wake = asyncio.Event()
        self.streams_opened = 0
        """How many keep-alive streams were opened (for tests and diagnostics)."""
        self.stalls_detected = 0
        """How many streams were failed for an unanswered renewal (tests and diagnostics)."""
        self._call: Any = None
        self._moving: StreamMoved | None = None

    @property
    def lease_count(self) -> int:
        """How many leases are being kept alive."""
        return len(self._regs)

    def register(
        self,
        lease_id: int,
        ttl: int,
        on_lost: Callable[[BaseException | None], None],
        on_suspended: Callable[[BaseException | None], None],
        on_resumed: Callable[[], None] | None = None,
    ) -> _Registration:
        """Keep ``lease_id`` alive. ``on_suspended`` is called when keep-alives start failing,
        ``on_resumed`` when one is answered again after that, ``on_lost`` once it is gone."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        reg = _Registration(lease_id, ttl, on_lost, on_suspended, on_resumed)
        self._regs[lease_id] = reg
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name="etcd-recipes-keepalive"
            )
        self._wake.set()
        return reg

    def unregister(self, reg: _Registration) -> None:
        reg.active = False
        if self._regs.get(reg.lease_id) is reg:
            del self._regs[reg.lease_id]

    async def aclose(self) -> None:
        self._closed = True
        self._regs.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _lose(self, reg: _Registration, cause: BaseException | None, kind: str) -> None:
        if reg.active:
            self.unregister(reg)
            reg.loss_kind = kind
            reg.on_lost(cause)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for reg in list(self._regs.values()):
            if now >= reg.deadline:
                self._lose(
                    reg,
                    LeaseNotFoundError(
                        f"lease {reg.lease_id:x}: no renewal within its {reg.ttl}s TTL"
                    ),
                    "keep_alive_failed",
                )

    def move(self) -> None:
        """Re-open the keep-alive stream now, on the client's current channel (its endpoints
        changed); every lease is renewed at once on the new stream, nothing is suspended."""
        if self._call is not None:
            self._moving = StreamMoved("the keep-alive stream moves to the new endpoints")
            self._call.cancel()
            self._wake.set()

    def _check_answered(self, now: float) -> None:
        """A stream that stays open but leaves a renewal unanswered past
        :func:`unanswered_bound` is treated as failed (and re-opened, on another endpoint when
        the channel has one) while the lease may still be saved, not only at its deadline."""
        for reg in self._regs.values():
            if reg.sent and now - reg.sent[0] > unanswered_bound(reg.ttl):
                self.stalls_detected += 1
                raise EtcdRecipeError(
                    f"lease {reg.lease_id:x}: a renewal sent {now - reg.sent[0]:.1f}s ago is "
                    "unanswered; the keep-alive stream is treated as failed"
                )

    async def _supervise(self) -> None:
        attempt = 0
        failed_since = 0.0
        while not self._closed and self._regs:
            call = None
            reader: asyncio.Task[None] | None = None
            cause: BaseException | None = None
            try:
                stub = pb.LeaseStub(self._wire.channel())
                metadata = (*(self._wire.metadata() or ()), REQUIRE_LEADER)
                call = self._call = stub.LeaseKeepAlive(metadata=metadata)
                self._moving = None
                self.streams_opened += 1
                reader = asyncio.get_running_loop().create_task(self._read_loop(call))
                for reg in self._regs.values():
                    reg.next_due = 0.0  # renew everything at once on a new stream
                    reg.sent.clear()
                while self._regs:
                    if reader.done():
                        if reader.cancelled():  # its call was cancelled, not our task
                            raise self._moving or EtcdRecipeError(
                                "the keep-alive stream was cancelled (its channel closed)"
                            )
                        reader.result()
                        raise EtcdRecipeError("the keep-alive stream ended")
                    self._check_deadlines()
                    now = time.monotonic()
                    self._check_answered(now)
                    next_wake = now + 1.0
                    for reg in list(self._regs.values()):
                        if reg.next_due <= now:
                            reg.sent.append(now)
                            reg.next_due = now + max(reg.ttl / 3.0, 0.3)
                            await call.write(pb.LeaseKeepAliveRequest(ID=reg.lease_id))
                        next_wake = min(next_wake, reg.next_due, reg.deadline)
                    if reader.done():
                        continue
                    self._wake.clear()
                    wait_for = max(0.0, next_wake - time.monotonic())
                    with contextlib.suppress(asyncio.TimeoutError):
                        # Not shielded: a shielded wait left one pending Event.wait() task
                        # behind per timeout ("Task was destroyed but it is pending!").
                        await asyncio.wait_for(self._wake.wait(), wait_for)
                    if attempt and any(r.renewals for r in self._regs.values()):
                        attempt = 0
                return
            except asyncio.CancelledError:
                # A write on a call that move() cancelled, or whose channel closed, raises it
                # too: only the task's own cancellation ends the keeper.
                if task_cancelling() or self._closed:
                    raise
                cause = self._moving or EtcdRecipeError("the keep-alive call was cancelled")
            except Exception as exc:
                cause = exc
            finally:
                self._call = None
                if reader is not None:
                    reader.cancel()
                if call is not None:
                    call.cancel()
            if isinstance(cause, StreamMoved):
                continue  # re-open at once on the new channel: no failure to report
            mapped: BaseException = cause
            if isinstance(cause, grpc.aio.AioRpcError):
                mapped = self._wire.error(cause, op="lease keep-alive")
            log.debug("keep-alive stream failed: %r", mapped)
            for reg in list(self._regs.values()):
                if not reg.suspended:
                    reg.suspended = True
                    reg.on_suspended(mapped)
            if attempt == 0:
                failed_since = time.monotonic()
            attempt += 1
            delay = _STREAM_BACKOFF.next_delay(attempt, time.monotonic() - failed_since) or 1.0
            end = time.monotonic() + delay
            while time.monotonic() < end and self._regs:
                self._check_deadlines()
                await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))

    async def _read_loop(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            reg = self._regs.get(int(msg.ID))
            if reg is None:
                continue
            if msg.TTL <= 0:
                # Gone before its TTL ran out by our renewals' clock: someone revoked it.
                kind = "revoked" if time.monotonic() < reg.deadline else "expired"
                cause = LeaseNotFoundError(f"lease {reg.lease_id:x} expired or was revoked")
                self._lose(reg, cause, kind)
                continue
            # Replies come in order per lease: the TTL counts from when *that* renewal was sent.
            sent_at = reg.sent.popleft() if reg.sent else time.monotonic()
            reg.deadline = max(reg.deadline, sent_at + int(msg.TTL))
            reg.renewals += 1
            if reg.suspended:
                reg.suspended = False
                if reg.on_resumed is not None:
                    reg.on_resumed()
            self._metrics.emit("increment_keep_alive", "renewal", reg.lease_id)
