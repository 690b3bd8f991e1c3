"""etcd-recipes: asyncio-native distributed coordination recipes over etcd v3.

The public async API is re-exported here; the blocking twin lives in :mod:`etcd_recipes.sync`.

"The Kotlin library", in these docstrings, is `etcd-recipes for the JVM
<https://github.com/pambrose/etcd-recipes>`_ (v0.12): the recipes share its key layouts and value
formats, so Python and JVM processes can use the same locks, elections, queues and registries;
each module says where it deviates on purpose.

Where everything lives, and the rules the layout follows: ``docs/contributing/code-map.md``
(and ``docs/contributing/architecture.md`` for why).

The import statements below are **the** export list: ``__all__`` repeats exactly their names
(a test checks it), and ``tools/gen_sync`` reads these statements to learn which modules and
names the blocking facade twins or re-exports. A new public name is added here, once.

Example::

    import asyncio
    from etcd_recipes import connect

    async def main() -> None:
        async with connect(endpoints) as client:
            await client.put(f"{prefix}/hello", "world")
            print((await client.get(f"{prefix}/hello")).text)

    asyncio.run(main())
"""

from __future__ import annotations

from ._core.logctx import LOG_FIELDS, RecipeContextFilter, current_recipe
from ._core.streams import EventStream
from ._core.txn import Cmp, CmpResult, CmpTarget, Compare, DeleteOp, GetOp, Op, PutOp, TxnOp
from ._recipe.recipe import BackgroundException, Recipe
from .barriers.barrier import DistributedBarrier
from .barriers.counted import DistributedBarrierWithCount
from .barriers.double import DistributedDoubleBarrier
from .caches.children import (
    ChildData,
    PathChildrenCache,
    PathChildrenCacheEvent,
    PathChildrenCacheEventType,
    StartMode,
)
from .caches.events import BatchKind, CacheBatch, CacheEntry, CacheEvent, CacheEventType
from .caches.node import NodeCache, NodeCacheEvent, NodeCacheEventType
from .caches.prefix import PrefixCache
from .client import EtcdClient, connect
from .client.lease import AcquisitionLease, SelfHealingLease
from .client.watch import Watch, WatchItem
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
    as_codec,
    to_bytes,
)
from .counter import DistributedAtomicLong
from .discovery.cache import ServiceCache
from .discovery.facade import ServiceDiscovery
from .discovery.instance import ServiceInstance, ServiceType
from .discovery.naming import (
    NamingEndpoint,
    NamingEndpoints,
    encode_naming_record,
    naming_registration,
)
from .discovery.provider import ServiceProvider
from .discovery.registry import ServiceRegistry
from .discovery.strategies import (
    ProviderStrategy,
    RandomStrategy,
    RoundRobinStrategy,
    StickyStrategy,
)
from .election.latch import LeaderLatch
from .election.observer import LeaderObserver, leadership_events
from .election.selector import LeaderSelector
from .election.server import (
    election_campaign,
    election_leader,
    election_observe,
    election_proclaim,
    election_resign,
)
from .election.terms import (
    Elected,
    LeadershipEvent,
    LeadershipGap,
    LeadershipTerm,
    Participant,
    Vacated,
    get_participants,
)
from .errors import (
    AlreadyStartedError,
    AuthenticationError,
    ClaimLostError,
    ClientClosedError,
    CodecError,
    CompactedError,
    ConnectionRetriesExhaustedError,
    DuplicateKeyError,
    DuplicateParticipantError,
    DuplicateServiceInstanceError,
    EmptyKeyError,
    EmptyPathError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdServerError,
    EtcdTimeoutError,
    EventStreamOverflowError,
    ForkedProcessError,
    FutureRevisionError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidEndpointError,
    InvalidPathError,
    LeadershipLostError,
    LeaseEventError,
    LeaseNotFoundError,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUpgradeError,
    LostError,
    NoInstancesError,
    NotLeaderError,
    NotStartedError,
    PermissionDeniedError,
    PermitLostError,
    QuotaExceededError,
    RecipeClosedError,
    RetriesExhaustedError,
    SemaphorePermitMismatchError,
    ServiceInstanceNotFoundError,
    StmConflictError,
    TimeoutRetriesExhaustedError,
    TlsHandshakeError,
    TooManyOperationsError,
    UsageError,
    ValueTooLargeError,
    WatchFailedError,
    WrongEventLoopError,
)
from .events import (
    ConnectionState,
    LeaseEvent,
    LeaseExpired,
    LeaseFailed,
    LeaseRestored,
    LeaseResumed,
    LeaseSuspended,
    WatchFailed,
    WatchRecoveryEvent,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
    state_after,
)
from .groups.events import (
    GroupEvent,
    GroupResynced,
    ItemAssigned,
    ItemReleased,
    MemberJoined,
    MemberLeft,
    MemberUpdated,
    PartitionEvent,
    PartitionState,
)
from .groups.member import DuplicateMemberError, GroupMember
from .groups.partitioner import ItemNotOwnedError, SetPartitioner
from .keyvalue import TransientKeyValue
from .locks.hold import LockHold, LockParticipant
from .locks.multi import DistributedMultiLock
from .locks.mutex import DistributedMutex
from .locks.revocation import request_revoke
from .locks.rwlock import DistributedReadWriteLock, ReadWriteLockView
from .locks.semaphore import DistributedSemaphore
from .locks.server import server_lock, server_unlock
from .metrics import NOOP_METRICS, EtcdMetrics, MetricsSpan
from .queues.config import WorkQueueConfig
from .queues.dead_letters import DeadLetter
from .queues.fifo import DistributedQueue
from .queues.item import ItemState, WorkItem
from .queues.priority import MAX_PRIORITY, DistributedPriorityQueue, InvalidPriorityError
from .queues.work import DistributedWorkQueue
from .resilience import (
    Bounded,
    ExponentialBackoff,
    LeaseResilience,
    Never,
    ResilienceConfig,
    RetryPolicy,
    RpcResilience,
    WatchResilience,
)
from .shared.count import SharedCount
from .shared.value import SharedValue, Versioned
from .stm.stm import STM, Isolation, run_stm
from .types import (
    Alarm,
    DeleteResult,
    ElectionLeaderKey,
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
    WatchProgress,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "Alarm",
    "BYTES",
    "INT32",
    "INT64",
    "JSON",
    "LOG_FIELDS",
    "MAX_PRIORITY",
    "NOOP_METRICS",
    "UTF8",
    "AcquisitionLease",
    "AlreadyStartedError",
    "AuthenticationError",
    "BackgroundException",
    "BatchKind",
    "Bounded",
    "BytesCodec",
    "CacheBatch",
    "CacheEntry",
    "CacheEvent",
    "CacheEventType",
    "ChildData",
    "ClaimLostError",
    "ClientClosedError",
    "Cmp",
    "CmpResult",
    "CmpTarget",
    "Codec",
    "CodecError",
    "CompactedError",
    "ConnectionRetriesExhaustedError",
    "Compare",
    "ConnectionState",
    "DeadLetter",
    "DeleteOp",
    "DeleteResult",
    "DistributedAtomicLong",
    "DistributedBarrier",
    "DistributedBarrierWithCount",
    "DistributedDoubleBarrier",
    "DistributedMultiLock",
    "DistributedMutex",
    "DistributedPriorityQueue",
    "DistributedQueue",
    "DistributedReadWriteLock",
    "DistributedSemaphore",
    "DistributedWorkQueue",
    "DuplicateKeyError",
    "DuplicateMemberError",
    "DuplicateParticipantError",
    "DuplicateServiceInstanceError",
    "Elected",
    "ElectionLeaderKey",
    "EmptyKeyError",
    "EmptyPathError",
    "EtcdClient",
    "EtcdConnectionError",
    "EtcdMetrics",
    "MetricsSpan",
    "EtcdRecipeError",
    "EtcdServerError",
    "EtcdTimeoutError",
    "EventStream",
    "EventStreamOverflowError",
    "EventType",
    "ExponentialBackoff",
    "ForkedProcessError",
    "FutureRevisionError",
    "GetOp",
    "GroupEvent",
    "GroupMember",
    "GroupResynced",
    "Int32Codec",
    "Int64Codec",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidEndpointError",
    "InvalidPathError",
    "InvalidPriorityError",
    "ItemState",
    "ItemAssigned",
    "ItemNotOwnedError",
    "ItemReleased",
    "JsonCodec",
    "KeyValue",
    "LeaderLatch",
    "LeaderObserver",
    "LeaderSelector",
    "LeadershipEvent",
    "LeadershipGap",
    "LeadershipLostError",
    "LeadershipTerm",
    "LeaseEvent",
    "LeaseEventError",
    "LeaseExpired",
    "LeaseFailed",
    "LeaseGrant",
    "LeaseInfo",
    "LeaseNotFoundError",
    "LeaseResilience",
    "LeaseRestored",
    "LeaseResumed",
    "LeaseSuspended",
    "LockHold",
    "LockParticipant",
    "LockLostError",
    "LockNotHeldError",
    "LockTimeoutError",
    "LockUpgradeError",
    "LostError",
    "Member",
    "MemberJoined",
    "MemberLeft",
    "MemberUpdated",
    "Never",
    "NamingEndpoint",
    "NamingEndpoints",
    "NoInstancesError",
    "NodeCache",
    "NodeCacheEvent",
    "NodeCacheEventType",
    "NotLeaderError",
    "NotStartedError",
    "Op",
    "Participant",
    "PartitionEvent",
    "PartitionState",
    "PathChildrenCache",
    "PathChildrenCacheEvent",
    "PathChildrenCacheEventType",
    "PermissionDeniedError",
    "PermitLostError",
    "QuotaExceededError",
    "PrefixCache",
    "ProviderStrategy",
    "PutOp",
    "PutResult",
    "PydanticCodec",
    "RandomStrategy",
    "RangeResult",
    "ReadWriteLockView",
    "Recipe",
    "RecipeClosedError",
    "RecipeContextFilter",
    "ResilienceConfig",
    "RetriesExhaustedError",
    "RetryPolicy",
    "RoundRobinStrategy",
    "RpcResilience",
    "SelfHealingLease",
    "SetPartitioner",
    "SemaphorePermitMismatchError",
    "ServiceCache",
    "ServiceDiscovery",
    "ServiceInstance",
    "ServiceInstanceNotFoundError",
    "ServiceProvider",
    "ServiceRegistry",
    "ServiceType",
    "SharedCount",
    "SharedValue",
    "SortOrder",
    "SortTarget",
    "StartMode",
    "Status",
    "StickyStrategy",
    "STM",
    "StmConflictError",
    "Isolation",
    "run_stm",
    "StrCodec",
    "TimeoutRetriesExhaustedError",
    "TlsHandshakeError",
    "TooManyOperationsError",
    "TransientKeyValue",
    "TxnOp",
    "TxnResult",
    "UsageError",
    "Vacated",
    "ValueTooLargeError",
    "Versioned",
    "Watch",
    "WatchEvent",
    "WatchFailed",
    "WatchFailedError",
    "WatchItem",
    "WatchProgress",
    "WatchRecoveryEvent",
    "WatchResilience",
    "WatchResubscribed",
    "WatchResynced",
    "WatchSuspended",
    "WorkItem",
    "WorkQueueConfig",
    "WrongEventLoopError",
    "as_codec",
    "connect",
    "current_recipe",
    "election_campaign",
    "election_leader",
    "election_observe",
    "election_proclaim",
    "election_resign",
    "encode_naming_record",
    "get_participants",
    "leadership_events",
    "naming_registration",
    "request_revoke",
    "server_lock",
    "server_unlock",
    "state_after",
    "to_bytes",
]

# Public classes and functions report the package they are imported from (anyio's way), not
# the private module that defines them: tracebacks, reprs and docs show ``etcd_recipes.X``.
for _value in list(locals().values()):
    if (isinstance(_value, type) or callable(_value)) and getattr(
        _value, "__module__", ""
    ).startswith("etcd_recipes."):
        try:
            _value.__module__ = __name__
        except (AttributeError, TypeError):  # pragma: no cover - builtins, slots
            pass
del _value
