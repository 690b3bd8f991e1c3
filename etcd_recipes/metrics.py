"""The metrics hook (SPI v2): one sink for everything the library measures.

Install an implementation through :class:`~etcd_recipes.resilience.ResilienceConfig`'s
``metrics`` field; the default, :data:`NOOP_METRICS`, records nothing.

:Status: Beta. Every recipe reports the v1 and v2 events; they are queued and delivered in
order by one daemon thread per sink (``_core/metering.py``), so a slow or failing sink never
stalls or breaks a recipe (what it raises is counted and logged once; a full queue of 10,000
events drops and counts the rest). A sink that sets :attr:`EtcdMetrics.deliver_inline` (both
ready-made sinks do: they only update in-memory aggregates) is called in the recipe's own
thread instead, which saves the hand-over to that thread; it still never raises into a
recipe, and one call slower than 50 ms moves the sink to the thread for good. Spans are
started inline, in the caller's context. Ready-made sinks:
:mod:`etcd_recipes.contrib.prometheus` and :mod:`etcd_recipes.contrib.otel`. Not guaranteed:
an event dropped by a full queue is not retried; an inline sink that blocks stalls the recipe
for that one call.

The contract:

- Every method has an empty default body, so a sink overrides only what it needs; the v2
  :meth:`EtcdMetrics.rpc_finished` forwards to ``record_rpc`` by default.
- Durations are in seconds (``float``). Labels are short, fixed vocabularies (listed on each
  method) plus ``recipe`` (the class name, such as ``"DistributedMutex"``) and ``name`` (a
  low-cardinality name a user gives a recipe; ``""`` when none). **Keys, paths and lease ids
  are never labels**: where a method receives one (the v1 ``key``/``lease_id`` arguments,
  :meth:`EtcdMetrics.start_span`'s ``path``), it is for logging or span attributes only.
- Sinks must be thread-safe and must not block.
- :meth:`EtcdMetrics.start_span` is meant for bounded operations only (lock acquire,
  campaign, barrier wait, queue enqueue/receive/settle), never the watch or keep-alive
  streams, called inline in the caller's context.

What it does **not** do: it aggregates nothing itself (a sink does), and it offers no gauge
that costs an RPC per scrape.

Example::

    from etcd_recipes import EtcdMetrics, ResilienceConfig, connect

    class Printing(EtcdMetrics):
        def record_rpc(self, op, duration, attempts, failed):
            print(f"{op} took {duration * 1000:.1f} ms in {attempts} attempt(s)")

    async with connect(endpoints, resilience=ResilienceConfig(metrics=Printing())) as measured:
        await measured.get(prefix + "/k")  # prints "get took ... ms in 1 attempt(s)"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

__all__ = ["NOOP_METRICS", "EtcdMetrics", "MetricsSpan"]


class MetricsSpan:
    """What :meth:`EtcdMetrics.start_span` returns: the end of one bounded operation.

    Example::

        from etcd_recipes import MetricsSpan

        class Timing(MetricsSpan):
            def end(self, outcome):
                print("ended:", outcome)

        Timing().end("acquired")  # prints "ended: acquired"
    """

    def end(self, outcome: str, error: BaseException | None = None) -> None:
        """The operation ended with ``outcome`` (the same vocabulary as its metric);
        ``error`` is the exception that ended it, if any."""


class EtcdMetrics:
    """Base class of metrics sinks; every method is a no-op by default.

    Example::

        from etcd_recipes import EtcdMetrics

        class LockWaits(EtcdMetrics):
            def lock_wait_finished(self, recipe, name, duration, outcome):
                print(recipe, outcome)

        LockWaits().lock_wait_finished("DistributedMutex", "", 0.01, "acquired")
    """

    deliver_inline: ClassVar[bool] = False
    """Whether events are delivered in the reporting thread instead of the sink's own thread.

    Leave it ``False`` (the default) for a sink that may block or take long: events then go
    through a queue and one daemon thread per sink, so nothing the sink does can stall a
    recipe. Set it ``True`` only for a sink whose every method returns in microseconds and
    never blocks (it updates in-memory aggregates, as ``prometheus_client`` and the
    OpenTelemetry SDK do): that saves a thread hand-over per batch of events, which costs far
    more than such a sink's own work. An inline call that raises is still counted and ignored;
    one that takes longer than 50 ms moves the sink back to its thread for good (logged once).

    Example::

        from etcd_recipes import EtcdMetrics

        class Counting(EtcdMetrics):
            deliver_inline = True  # only adds to an int

            def __init__(self) -> None:
                self.waits = 0

            def lock_wait_finished(self, recipe, name, duration, outcome):
                self.waits += 1

        assert Counting.deliver_inline and not EtcdMetrics.deliver_inline
    """

    # -- v1 (kept) -------------------------------------------------------------------------

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        """One unary RPC finished (after all its attempts); ``duration`` is in seconds.

        Called by the default :meth:`rpc_finished`; override one or the other."""

    def increment_watch_recovery(self, kind: str, key: bytes) -> None:
        """A watch reported a recovery event: ``suspended|resubscribed|resynced|failed``.

        ``key`` is the watched key or prefix: never use it as a label."""

    def increment_keep_alive(self, kind: str, lease_id: int) -> None:
        """A lease event: ``renewal|suspended|resumed|expired|restored|failed``.

        ``lease_id`` identifies the lease: never use it as a label."""

    def record_latency(self, name: str, seconds: float) -> None:
        """A recipe-level latency, for example ``"queue.dequeue"`` or ``"work_queue.receive"``."""

    # -- v2 --------------------------------------------------------------------------------

    def rpc_finished(self, operation: str, duration: float, attempts: int, outcome: str) -> None:
        """One unary RPC finished after ``attempts`` attempts (``attempts - 1`` retries).

        ``operation`` is the RPC's short name (``"put"``, ``"range"``, ``"txn"``,
        ``"lease_grant"``...); ``outcome`` is ``"ok"`` or the lower-case gRPC status of the
        last failure (``"unavailable"``, ``"deadline_exceeded"``, ``"cancelled"``,
        ``"resource_exhausted"``...). The default forwards to :meth:`record_rpc`."""
        self.record_rpc(operation, duration, attempts, outcome != "ok")

    def lease_lost(self, recipe: str, name: str, kind: str) -> None:
        """A recipe lost the lease its keys lived on.

        ``kind``: ``expired`` (etcd says the lease is gone), ``revoked`` (its key was deleted
        or its lease revoked by someone else, for instance ``etcd-recipes lock break``), or
        ``keep_alive_failed`` (renewals could not reach etcd before the TTL ran out)."""

    def lock_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """A lock or semaphore acquisition ended, ``duration`` after it began.

        ``outcome``: ``acquired``, ``timeout``, ``cancelled`` or ``lost`` (the acquisition's
        lease was lost while waiting). Reentrant re-acquisitions are not reported."""

    def lock_hold_finished(self, recipe: str, name: str, duration: float, ended: str) -> None:
        """A hold of a lock or semaphore permit ended; ``ended``: ``released`` or ``lost``."""

    def leadership_changed(self, recipe: str, name: str, transition: str) -> None:
        """This process's candidate changed role.

        ``transition``: ``acquired`` (it became the leader), ``relinquished`` (it stepped
        down: its work returned, it resigned or closed) or ``lost`` (its lease or key was
        lost while leading)."""

    def partition_changed(self, recipe: str, name: str, transition: str) -> None:
        """A partitioner's member took or gave up one item.

        ``transition``: ``assigned`` (it created the item's owner key), ``released`` (it gave
        the item back: a hand-over or its close) or ``lost`` (its lease expired or the owner
        key was deleted out of band). Owned items = assigned - released - lost."""

    def barrier_wait_finished(self, recipe: str, name: str, duration: float, outcome: str) -> None:
        """A barrier wait ended; ``outcome``: ``passed``, ``timeout``, ``cancelled`` (also:
        its recipe was closed meanwhile) or ``error``."""

    def queue_operation(
        self, recipe: str, name: str, operation: str, duration: float, outcome: str
    ) -> None:
        """A queue operation ended, ``duration`` after the call (waits on an empty queue included).

        ``operation``: ``enqueue``, ``dequeue`` (FIFO and priority queues), ``receive``,
        ``ack``, ``requeue``, ``dead_letter`` (the work queue).
        ``outcome``: ``ok``; ``empty`` (a try or timed wait found nothing); ``timeout``;
        ``cancelled``; ``stale`` (a settle whose claim was already gone: ``ack()`` returned
        ``False``, the work may have run twice); ``error``."""

    def queue_redelivered(self, recipe: str, name: str, count: int) -> None:
        """``count`` work items whose claim expired went back to the ready queue."""

    def cache_synced(self, recipe: str, name: str, kind: str, duration: float, size: int) -> None:
        """A cache finished a full load: ``kind`` is ``initial`` or ``resync`` (after a
        compaction or a lost watch); ``size`` is its entry count after the load."""

    def cache_size_changed(self, recipe: str, name: str, delta: int) -> None:
        """A cache's entry count changed by ``delta`` (a closed cache reports ``-size``), so a
        gauge summed over caches and processes stays right without reading any cache."""

    def shared_value_written(self, recipe: str, name: str, operation: str, outcome: str) -> None:
        """A shared value (``SharedValue``, ``SharedCount``) was written, or a write failed.

        ``operation``: ``set`` or ``try_set``. ``outcome``: ``ok``; ``conflict`` (a
        ``try_set`` whose expected version was not current: nothing written); ``error``."""

    def start_span(
        self, recipe: str, name: str, operation: str, path: str, attributes: Mapping[str, object]
    ) -> MetricsSpan | None:
        """A bounded operation begins (``lock.acquire``, ``election.campaign``,
        ``barrier.wait``, ``queue.enqueue``, ``queue.receive``, ``queue.settle``).

        Called inline, in the caller's context; return a :class:`MetricsSpan` to be told how
        it ended, or ``None`` (the default) to skip it. ``path`` is the recipe's path, for a
        span attribute only."""
        return None


NOOP_METRICS = EtcdMetrics()
"""The default sink: records nothing."""
