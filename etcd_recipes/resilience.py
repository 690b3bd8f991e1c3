"""Retry policies and the resilience settings of RPCs, watches and leases.

A :class:`RetryPolicy` answers one question: after failed attempt number ``attempt`` (1-based),
with ``elapsed`` seconds spent so far, how long to wait before the next attempt -- or ``None``
to give up. Policies are pure and side-effect free, so one instance can be shared freely.

Example::

    from etcd_recipes import ResilienceConfig, RetryPolicy, RpcResilience, connect

    policy = RetryPolicy.exponential_backoff(initial_delay=0.1, max_attempts=5)
    config = ResilienceConfig(rpc=RpcResilience(retry_policy=policy, operation_timeout=2.0))
    async with connect(endpoints, resilience=config) as patient:
        await patient.get(prefix + "/k")
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

from ._core.validate import check_count, check_duration, check_timeout
from .errors import InvalidArgumentError
from .metrics import NOOP_METRICS, EtcdMetrics

__all__ = [
    "Bounded",
    "ExponentialBackoff",
    "LeaseResilience",
    "Never",
    "ResilienceConfig",
    "RetryPolicy",
    "RpcResilience",
    "WatchResilience",
]


class RetryPolicy(ABC):
    """Decides the delay before the next attempt, or ``None`` to stop retrying.

    Build one with the factories: :meth:`exponential_backoff`, :meth:`bounded`,
    :meth:`forever` and :meth:`never`.

    Example::

        from etcd_recipes import RetryPolicy

        assert RetryPolicy.bounded(2, delay=0.5).next_delay(1, 0.0) == 0.5
        assert RetryPolicy.bounded(2, delay=0.5).next_delay(3, 0.0) is None  # gives up
    """

    @abstractmethod
    def next_delay(self, attempt: int, elapsed: float) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (1-based), or ``None`` to give up."""

    @staticmethod
    def exponential_backoff(
        initial_delay: float = 0.25,
        max_delay: float = 15.0,
        factor: float = 2.0,
        jitter: float = 0.25,
        max_attempts: int | None = None,
        max_elapsed: float | None = None,
    ) -> ExponentialBackoff:
        """Exponential backoff with bounded jitter (the Kotlin library's defaults).

        ``delay = min(initial_delay * factor**(attempt-1), max_delay)``, then scaled by a random
        factor in ``[1 - jitter, 1 + jitter]`` and capped at ``max_delay``. Gives up after
        ``max_attempts`` attempts or once ``max_elapsed`` seconds have passed (``None``: never).
        """
        return ExponentialBackoff(
            initial_delay=initial_delay,
            max_delay=max_delay,
            factor=factor,
            jitter=jitter,
            max_attempts=max_attempts,
            max_elapsed=max_elapsed,
        )

    @staticmethod
    def bounded(max_attempts: int, delay: float = 0.5) -> Bounded:
        """A fixed ``delay`` between attempts, giving up after ``max_attempts`` attempts."""
        return Bounded(max_attempts=max_attempts, delay=delay)

    @staticmethod
    def forever() -> ExponentialBackoff:
        """Exponential backoff with the default settings that never gives up."""
        return ExponentialBackoff()

    @staticmethod
    def never() -> Never:
        """Never retry: the first failure is final."""
        return Never()


def _check_attempt(attempt: int) -> None:
    if attempt < 1:
        raise InvalidArgumentError(f"attempt must be >= 1, got {attempt}")


@dataclass(frozen=True)
class ExponentialBackoff(RetryPolicy):
    """See :meth:`RetryPolicy.exponential_backoff`."""

    initial_delay: float = 0.25
    max_delay: float = 15.0
    factor: float = 2.0
    jitter: float = 0.25
    max_attempts: int | None = None
    max_elapsed: float | None = None

    def __post_init__(self) -> None:
        if not self.initial_delay > 0:
            raise InvalidArgumentError(f"initial_delay must be > 0, got {self.initial_delay}")
        if not self.max_delay >= self.initial_delay:
            raise InvalidArgumentError(
                f"max_delay ({self.max_delay}) must be >= initial_delay ({self.initial_delay})"
            )
        if not self.factor >= 1.0:
            raise InvalidArgumentError(f"factor must be >= 1, got {self.factor}")
        if not 0.0 <= self.jitter <= 1.0:
            raise InvalidArgumentError(f"jitter must be in [0, 1], got {self.jitter}")
        if self.max_attempts is not None:
            check_count(self.max_attempts, what="max_attempts")
        if self.max_elapsed is not None and not self.max_elapsed > 0:
            raise InvalidArgumentError(f"max_elapsed must be > 0, got {self.max_elapsed}")

    def next_delay(self, attempt: int, elapsed: float) -> float | None:
        _check_attempt(attempt)
        if self.max_attempts is not None and attempt > self.max_attempts:
            return None
        if self.max_elapsed is not None and elapsed >= self.max_elapsed:
            return None
        try:
            scaled = self.initial_delay * math.pow(self.factor, attempt - 1)
        except OverflowError:
            scaled = math.inf
        base = min(scaled, self.max_delay)
        if self.jitter:
            base *= 1.0 + random.uniform(-self.jitter, self.jitter)
        return min(base, self.max_delay)


@dataclass(frozen=True)
class Bounded(RetryPolicy):
    """See :meth:`RetryPolicy.bounded`."""

    max_attempts: int
    delay: float = 0.5

    def __post_init__(self) -> None:
        check_count(self.max_attempts, what="max_attempts")
        check_duration(self.delay, what="delay", inclusive=True)

    def next_delay(self, attempt: int, elapsed: float) -> float | None:
        _check_attempt(attempt)
        return self.delay if attempt <= self.max_attempts else None


@dataclass(frozen=True)
class Never(RetryPolicy):
    """See :meth:`RetryPolicy.never`."""

    def next_delay(self, attempt: int, elapsed: float) -> float | None:
        _check_attempt(attempt)
        return None


def _check_timeout(name: str, value: float | None) -> None:
    check_timeout(value, what=name)


@dataclass(frozen=True)
class RpcResilience:
    """How unary RPCs are bounded and retried.

    ``operation_timeout`` bounds **each attempt** (``None``: unbounded). Failures with gRPC
    status UNAVAILABLE, DEADLINE_EXCEEDED or INTERNAL are retried per ``retry_policy``;
    anything else is raised at once. Transactions are never retried (a commit may have
    landed); lease revocation is best-effort.

    Deviation from the Kotlin library: the per-attempt timeout defaults to 10 s (not 30 s) so that a
    blackholed endpoint surfaces as an error within a minute rather than two.
    """

    retry_policy: RetryPolicy = field(default_factory=lambda: RetryPolicy.bounded(4, 0.25))
    operation_timeout: float | None = 10.0

    def __post_init__(self) -> None:
        _check_timeout("operation_timeout", self.operation_timeout)

    @classmethod
    def disabled(cls) -> RpcResilience:
        """One attempt, no timeout (the pre-resilience behaviour)."""
        return cls(retry_policy=Never(), operation_timeout=None)


@dataclass(frozen=True)
class WatchResilience:
    """How a watch recovers after its stream fails.

    ``retry_policy`` paces re-subscription attempts; when it gives up the watch reports
    ``Failed``. ``progress_notify`` asks etcd for progress notifications, which advance the
    resume revision of idle watches. ``stall_timeout`` (seconds, ``None``: off) bounds how
    long the client's watch stream may stay open and silent -- no event, no answer to a
    progress request sent at half the bound -- before it is treated as failed and re-opened;
    it applies to servers that answer progress requests (etcd does, ``etcd grpc-proxy`` does
    not) and is read from the client's configuration (``ResilienceConfig.watch``), since all
    watches of a client share one stream.

    Example::

        from etcd_recipes import ResilienceConfig, WatchResilience, connect

        quick = ResilienceConfig(watch=WatchResilience(stall_timeout=6.0))
        async with connect(endpoints, resilience=quick) as app:
            assert app.resilience.watch.stall_timeout == 6.0
    """

    retry_policy: RetryPolicy = field(
        default_factory=lambda: RetryPolicy.exponential_backoff(initial_delay=0.05, max_delay=2.0)
    )
    progress_notify: bool = True
    stall_timeout: float | None = 15.0

    def __post_init__(self) -> None:
        if self.stall_timeout is not None:
            _check_timeout("stall_timeout", self.stall_timeout)

    @classmethod
    def disabled(cls) -> WatchResilience:
        """No recovery: the first stream failure is final."""
        return cls(retry_policy=Never(), progress_notify=False)


@dataclass(frozen=True)
class LeaseResilience:
    """How a self-healing lease re-grants after loss.

    ``retry_policy`` paces heal attempts; ``heal_operation_timeout`` bounds each grant.
    """

    retry_policy: RetryPolicy = field(
        default_factory=lambda: RetryPolicy.exponential_backoff(initial_delay=0.05, max_delay=2.0)
    )
    heal_operation_timeout: float = 10.0

    def __post_init__(self) -> None:
        _check_timeout("heal_operation_timeout", self.heal_operation_timeout)

    @classmethod
    def disabled(cls) -> LeaseResilience:
        """No healing: a lost lease stays lost."""
        return cls(retry_policy=Never())


@dataclass(frozen=True)
class ResilienceConfig:
    """All resilience settings of a client, plus its metrics sink.

    Example::

        from etcd_recipes import EtcdMetrics, ResilienceConfig

        config = ResilienceConfig().with_metrics(EtcdMetrics())
        assert config.rpc.operation_timeout > 0
    """

    rpc: RpcResilience = field(default_factory=RpcResilience)
    watch: WatchResilience = field(default_factory=WatchResilience)
    lease: LeaseResilience = field(default_factory=LeaseResilience)
    metrics: EtcdMetrics = NOOP_METRICS

    @classmethod
    def disabled(cls) -> ResilienceConfig:
        """Every sub-config disabled: no retries, no recovery, no healing."""
        return cls(RpcResilience.disabled(), WatchResilience.disabled(), LeaseResilience.disabled())

    def with_metrics(self, metrics: EtcdMetrics) -> ResilienceConfig:
        """A copy of this config that reports to ``metrics``."""
        return replace(self, metrics=metrics)
