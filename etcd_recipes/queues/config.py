"""The settings of a work queue: :class:`WorkQueueConfig` (public as
``etcd_recipes.WorkQueueConfig``; defined here so that :mod:`.work` stays about the recipe).

Guaranteed: a config is validated when it is made (nothing is checked later, at a claim);
it is frozen, so one config may serve several queues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core.validate import check_count, check_duration, check_ttl
from ..errors import InvalidArgumentError

__all__ = ["WorkQueueConfig"]


@dataclass(frozen=True)
class WorkQueueConfig:
    """Settings of a :class:`~etcd_recipes.DistributedWorkQueue` (all in seconds except
    ``max_deliveries``).

    :param visibility_timeout: TTL of the consumer lease (whole seconds, at least 1): how long
        after a consumer **dies** its claims become reclaimable. A live consumer renews its
        lease, so this does not bound processing time -- tune it for crash recovery.
    :param max_deliveries: deliveries before an orphaned item is dead-lettered (at least 1).
    :param sweep_interval: how often each consumer looks for orphans and matured delayed items
        (finite, > 0); also the longest a parked ``receive()`` sleeps without looking.
    :param max_items: a bound on the items waiting (ready and delayed; ``None``: unbounded):
        ``enqueue`` waits for room, ``try_enqueue`` returns ``None`` at once when full (see
        the queue's docs for what the bound does not cover).

    Example::

        from etcd_recipes import DistributedWorkQueue, WorkQueueConfig

        config = WorkQueueConfig(visibility_timeout=10, max_deliveries=3, sweep_interval=5)
        async with DistributedWorkQueue(client, f"{prefix}/jobs", config) as queue:
            assert queue.config.max_deliveries == 3
    """

    visibility_timeout: float = 30.0
    max_deliveries: int = 5
    sweep_interval: float = 30.0
    max_items: int | None = None

    def __post_init__(self) -> None:
        check_ttl(self.visibility_timeout, what="visibility_timeout")
        check_count(self.max_deliveries, what="max_deliveries", minimum=1)
        check_duration(self.sweep_interval, what="sweep_interval")
        if self.max_items is not None:
            check_count(self.max_items, what="max_items", minimum=1)


def _check_config(config: Any) -> WorkQueueConfig:
    """``config`` itself, or the defaults for ``None``; anything else is refused."""
    if config is not None and not isinstance(config, WorkQueueConfig):
        raise InvalidArgumentError(f"config must be a WorkQueueConfig, not {config!r}")
    return config or _DEFAULT


_DEFAULT = WorkQueueConfig()  # shared: a config is frozen
