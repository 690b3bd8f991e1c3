"""etcd-recipes: asyncio-native distributed coordination recipes over etcd v3.

The public async API is re-exported here; the blocking twin lives in :mod:`etcd_recipes.sync`.

Example::

    import asyncio
    from etcd_recipes import connect

    async def main() -> None:
        async with connect("127.0.0.1:2379") as client:
            await client.put("/hello", "world")
            print((await client.get("/hello")).text)

    asyncio.run(main())
"""

from __future__ import annotations

from ._core.lease import AcquisitionLease, SelfHealingLease
from ._core.logctx import RecipeContextFilter, current_recipe
from ._core.recipe import BackgroundException, Recipe
from ._core.txn import Cmp, Compare, Op
from ._core.watch import Watch
from .barrier import DistributedBarrier
from .client import EtcdClient, connect
from .codecs import (
    BYTES,
    INT32,
    INT64,
    JSON,
    UTF8,
    BytesCodec,
    Codec,
    Int32Codec,
    Int64Codec,
    JsonCodec,
    PydanticCodec,
    StrCodec,
)
from .counted_barrier import DistributedBarrierWithCount, DistributedDoubleBarrier
from .counter import DistributedAtomicLong
from .election import (
    Elected,
    ElectionLeaderKey,
    LeaderLatch,
    LeaderObserver,
    LeaderSelector,
    LeadershipEvent,
    LeadershipTerm,
    Participant,
    Vacated,
    election_campaign,
    election_leader,
    election_observe,
    election_proclaim,
    election_resign,
    get_participants,
    leadership_events,
)
from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .events import (
    ConnectionState,
    LeaseEvent,
    LeaseExpired,
    LeaseFailed,
    LeaseRestored,
    LeaseSuspended,
    WatchFailed,
    WatchRecoveryEvent,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
)
from .keyvalue import TransientKeyValue
from .lock import (
    DistributedMutex,
    DistributedReadWriteLock,
    LockHold,
    ReadWriteLockView,
    server_lock,
    server_unlock,
)
from .metrics import EtcdMetrics
from .queue import MAX_PRIORITY, DistributedPriorityQueue, DistributedQueue, InvalidPriorityError
from .resilience import (
    LeaseResilience,
    ResilienceConfig,
    RetryPolicy,
    RpcResilience,
    WatchResilience,
)
from .semaphore import DistributedSemaphore
from .types import (
    DeleteResult,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseInfo,
    Member,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Status,
    TxnResult,
    WatchEvent,
)
from .work_queue import DeadLetter, DistributedWorkQueue, WorkItem, WorkQueueConfig

__version__ = "0.1.0.dev0"

__all__ = [
    "BYTES",
    "INT32",
    "INT64",
    "JSON",
    "UTF8",
    "AcquisitionLease",
    "BackgroundException",
    "BytesCodec",
    "Cmp",
    "Codec",
    "Compare",
    "ConnectionState",
    "DeleteResult",
    "DistributedAtomicLong",
    "DistributedBarrier",
    "EtcdClient",
    "EtcdMetrics",
    "EventType",
    "Int32Codec",
    "Int64Codec",
    "JsonCodec",
    "KeyValue",
    "LeaseEvent",
    "LeaseExpired",
    "LeaseFailed",
    "LeaseGrant",
    "LeaseInfo",
    "LeaseRestored",
    "LeaseResilience",
    "LeaseSuspended",
    "Member",
    "Op",
    "PutResult",
    "PydanticCodec",
    "RangeResult",
    "Recipe",
    "RecipeContextFilter",
    "ResilienceConfig",
    "RetryPolicy",
    "RpcResilience",
    "SelfHealingLease",
    "SortOrder",
    "SortTarget",
    "Status",
    "StrCodec",
    "TransientKeyValue",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "WatchFailed",
    "WatchRecoveryEvent",
    "WatchResilience",
    "WatchResubscribed",
    "WatchResynced",
    "WatchSuspended",
    "DistributedBarrierWithCount",
    "DistributedDoubleBarrier",
    "Elected",
    "ElectionLeaderKey",
    "LeaderLatch",
    "LeaderObserver",
    "LeaderSelector",
    "LeadershipEvent",
    "LeadershipTerm",
    "Participant",
    "Vacated",
    "election_campaign",
    "election_leader",
    "election_observe",
    "election_proclaim",
    "election_resign",
    "get_participants",
    "leadership_events",
    "DistributedMutex",
    "DistributedReadWriteLock",
    "LockHold",
    "ReadWriteLockView",
    "server_lock",
    "server_unlock",
    "DistributedSemaphore",
    "MAX_PRIORITY",
    "DistributedPriorityQueue",
    "DistributedQueue",
    "InvalidPriorityError",
    "DeadLetter",
    "DistributedWorkQueue",
    "WorkItem",
    "WorkQueueConfig",
    "connect",
    "current_recipe",
    *_errors_all,
]
