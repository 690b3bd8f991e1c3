"""The metrics hook: one small, synchronous, non-blocking sink for everything the library measures.

Install an implementation through :class:`~etcd_recipes.resilience.ResilienceConfig`'s
``metrics`` field; the default, :data:`NOOP_METRICS`, records nothing. Every method has an empty
default body, so an implementation overrides only what it needs. Methods are called on the
event loop thread and must return quickly (no I/O, no blocking).

Example::

    from etcd_recipes import EtcdMetrics, ResilienceConfig, connect

    class Printing(EtcdMetrics):
        def record_rpc(self, op, duration, attempts, failed):
            print(f"{op} took {duration * 1000:.1f} ms in {attempts} attempt(s)")

    async with connect(endpoints, resilience=ResilienceConfig(metrics=Printing())) as measured:
        await measured.get(prefix + "/k")  # prints "get took ... ms in 1 attempt(s)"
"""

from __future__ import annotations

__all__ = ["NOOP_METRICS", "EtcdMetrics"]


class EtcdMetrics:
    """Base class of metrics sinks; every method is a no-op by default."""

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        """One unary RPC finished (after all its attempts); ``duration`` is in seconds."""

    def increment_watch_recovery(self, kind: str, key: bytes) -> None:
        """A watch reported a recovery event: ``suspended|resubscribed|resynced|failed``."""

    def increment_keep_alive(self, kind: str, lease_id: int) -> None:
        """A lease event: ``renewal|suspended|resumed|expired|restored|failed``."""

    def record_latency(self, name: str, seconds: float) -> None:
        """A recipe-level latency, for example ``"queue.dequeue"`` or ``"work_queue.receive"``."""


NOOP_METRICS = EtcdMetrics()
"""The default sink: records nothing."""
