"""Read-only inspection of a queue at a path, for operators: :func:`queue_stats` and
:func:`peek_queue` (the ``etcd-recipes queue`` command uses them).

The three queue kinds are told apart by their key layouts, decoded here with the family's own
layout code (``_layout`` for the work queue; the FIFO and priority layouts of
:mod:`~etcd_recipes.queues.fifo` and :mod:`~etcd_recipes.queues.priority`):

* ``fifo`` -- :class:`~etcd_recipes.DistributedQueue`: ``<p>/<millis%019d>-<r3>`` (a batch
  ``<p>/<millis%019d>-<index%05d>-<r3>``);
* ``priority`` -- :class:`~etcd_recipes.DistributedPriorityQueue`: ``<p>/<prio%05d>/<seq%016d>``
  and the producers' guard keys ``__<p>/<prio%05d>``;
* ``work`` -- :class:`~etcd_recipes.DistributedWorkQueue`: ``<p>/items/``, ``claimed/``,
  ``claims/``, ``attempts/``, ``dlq/``, ``reasons/``, ``delayed/``.

Guaranteed: every count of one call comes from **one** read transaction (one revision, given in
the result); nothing is written, no lease is taken, no recipe is started.

Not guaranteed: the numbers are stale as soon as they are returned (advisory, like ``size()``);
ages come from the producer's wall clock in the key (an item's ``millis``), so a producer with a
skewed clock skews them; a priority queue's keys carry no clock, so its ``oldest_age`` is
``None``; a FIFO or work queue that is empty and has never dead-lettered anything leaves no key
behind, so it cannot be told from "nothing here" without ``kind=``.

Example::

    from etcd_recipes import DistributedWorkQueue
    from etcd_recipes.queues.inspection import peek_queue, queue_stats

    async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
        await queue.enqueue(b"job-1")
        stats = await queue_stats(client, f"{prefix}/jobs")
        assert (stats.kind, stats.ready, stats.in_flight) == ("work", 1, 0)
        [head] = await peek_queue(client, f"{prefix}/jobs", 10, payload=True)
        assert head.state == "ready" and head.payload == b"job-1"
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal, get_args

from .._core.keys import append_to_path
from .._core.txn import AnyOp, Op
from .._core.validate import check_count, check_path
from ..client import check_client
from ..errors import InvalidArgumentError
from ..types import KeyValue, RangeResult, SortOrder, SortTarget
from ._layout import WorkKeys, attempts_in, item_name, promoted_name, ready_millis
from ._produce import now_millis

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "QueueKind",
    "QueueStats",
    "QueuedEntry",
    "detect_queue_kind",
    "in_flight",
    "peek_queue",
    "queue_stats",
]

QueueKind = Literal["fifo", "priority", "work"]
"""The queue kinds: ``"fifo"``, ``"priority"``, ``"work"``."""

_KINDS: tuple[str, ...] = get_args(QueueKind)
_FIFO_NAME = re.compile(rb"^(\d{19})-(?:\d{5}-)?[A-Za-z0-9]+$")
_PRIORITY_TAIL = re.compile(rb"^(\d{5})/(\d{16})$")
_WORK_PARTS = tuple(  # the work queue's sub-prefixes, from its own layout (trace/ included)
    getattr(WorkKeys.under("/"), f.name).removeprefix("/") for f in fields(WorkKeys)
)


@dataclass(frozen=True)
class QueueStats:
    """What a queue holds, as of one read at ``revision``.

    ``ready``: items a take or receive would get now; ``delayed``: work items not yet due;
    ``in_flight``: work items claimed by a consumer (``orphans`` of them have lost their
    consumer's claim marker: the next sweep redelivers or dead-letters them); ``dead``: dead
    letters. FIFO and priority queues have no delayed, in-flight or dead items (0).
    ``oldest_age``: seconds since the oldest ready item was enqueued (``None`` when there is
    none or the layout keeps no clock: the priority queue).

    Example::

        from etcd_recipes.queues.inspection import queue_stats

        stats = await queue_stats(client, f"{prefix}/jobs", kind="work")
        print(stats.ready, stats.delayed, stats.in_flight, stats.dead, stats.oldest_age)
    """

    path: str
    kind: QueueKind
    ready: int
    delayed: int
    in_flight: int
    dead: int
    orphans: int
    oldest_age: float | None
    revision: int


@dataclass(frozen=True)
class QueuedEntry:
    """One item as :func:`peek_queue` lists it, in delivery order.

    ``id``: the item's name (a work item's id; a priority item's ``<prio>/<seq>``); ``state``:
    ``"ready"``, or ``"delayed"`` (a work item not yet due: ``due_in`` seconds); ``priority``
    (priority queue only); ``age`` (seconds since enqueue, ``None`` when the key has no clock);
    ``attempts`` (work queue: deliveries so far); ``size`` (payload bytes); ``payload`` (the
    stored bytes, or ``None`` unless asked for).

    Example::

        from etcd_recipes.queues.inspection import peek_queue

        for entry in await peek_queue(client, f"{prefix}/jobs", 10):
            print(entry.id, entry.state, entry.size)
    """

    id: str
    key: str
    state: Literal["ready", "delayed"]
    create_revision: int
    size: int
    age: float | None = None
    due_in: float | None = None
    priority: int | None = None
    attempts: int | None = None
    payload: bytes | None = None


async def detect_queue_kind(client: EtcdClient, path: str) -> QueueKind | None:
    """The kind of queue whose keys are at ``path``, or ``None`` when nothing is there.

    Raises :class:`~etcd_recipes.errors.InvalidArgumentError` when ``path`` holds keys that no
    queue writes (another recipe's, or an application's).

    Example::

        from etcd_recipes import DistributedQueue
        from etcd_recipes.queues.inspection import detect_queue_kind

        await DistributedQueue(client, f"{prefix}/orders").enqueue(b"x")
        assert await detect_queue_kind(client, f"{prefix}/orders") == "fifo"
    """
    client, path = check_client(client), check_path(path)
    base = append_to_path(path, "")
    first, guards = (
        await client.txn(
            [],
            [
                Op.get(base, prefix=True, limit=1, keys_only=True),  # key order: no sort
                Op.get("__" + base, prefix=True, count_only=True),
            ],
        )
    ).responses
    assert isinstance(first, RangeResult)
    assert isinstance(guards, RangeResult)
    if not first.kvs:
        return "priority" if guards.count else None
    tail = first.kvs[0].key[len(base.encode()) :]
    if _FIFO_NAME.match(tail):
        return "fifo"
    if _PRIORITY_TAIL.match(tail):
        return "priority"
    if any(tail.startswith(part.encode()) for part in _WORK_PARTS):
        return "work"
    raise InvalidArgumentError(
        f"{path} is not a queue: it holds {first.kvs[0].key_text!r}, which no queue writes"
    )


async def _kind(client: EtcdClient, path: str, kind: str | None) -> QueueKind | None:
    if kind is None:
        return await detect_queue_kind(client, path)
    if kind not in _KINDS:
        raise InvalidArgumentError(f"kind must be one of {', '.join(_KINDS)}, not {kind!r}")
    return kind  # type: ignore[return-value]


def _age(millis: int | None, now: int) -> float | None:
    return None if millis is None else max(0.0, (now - millis) / 1000)


def _millis(name: bytes) -> int | None:
    found = _FIFO_NAME.match(name)
    return int(found.group(1)) if found else None


async def queue_stats(
    client: EtcdClient, path: str, *, kind: QueueKind | None = None
) -> QueueStats | None:
    """The counts and the oldest ready item's age of the queue at ``path`` (one read), or
    ``None`` when no queue keys are there. ``kind`` skips the detection (an empty queue of a
    known kind then gives zeros instead of ``None``).

    Example::

        from etcd_recipes import DistributedPriorityQueue
        from etcd_recipes.queues.inspection import queue_stats

        await DistributedPriorityQueue(client, f"{prefix}/jobs").enqueue(b"x", 3)
        stats = await queue_stats(client, f"{prefix}/jobs")
        assert stats is not None and (stats.kind, stats.ready) == ("priority", 1)
    """
    client, path = check_client(client), check_path(path)
    found = await _kind(client, path, kind)
    if found is None:
        return None
    if found == "work":
        return await _work_stats(client, path)
    base = append_to_path(path, "")
    # Ascending key order is etcd's own (no sort: a sorted read fetches and sorts every key).
    head_sort = SortTarget.MOD if found == "fifo" else SortTarget.KEY
    head_order = SortOrder.ASCEND if found == "fifo" else SortOrder.NONE
    count, head = (
        await client.txn(
            [],
            [
                Op.get(base, prefix=True, count_only=True),
                Op.get(
                    base,
                    prefix=True,
                    limit=1,
                    keys_only=True,
                    sort_target=head_sort,
                    sort_order=head_order,
                ),
            ],
        )
    ).responses
    assert isinstance(count, RangeResult)
    assert isinstance(head, RangeResult)
    oldest = None
    if found == "fifo" and head.kvs:
        oldest = _age(_millis(head.kvs[0].key[len(base.encode()) :]), now_millis())
    return QueueStats(path, found, count.count, 0, 0, 0, 0, oldest, count.revision)


async def _work_stats(client: EtcdClient, path: str) -> QueueStats:
    keys = WorkKeys.under(path)
    parts = (keys.items, keys.delayed, keys.claimed, keys.claims, keys.dlq)
    ops: list[AnyOp] = [Op.get(p, prefix=True, count_only=True) for p in parts]
    ops.append(Op.get(keys.items, prefix=True, limit=1, keys_only=True))
    ready, delayed, claimed, claims, dead, head = (await client.txn([], ops)).responses
    counts = [
        r.count for r in (ready, delayed, claimed, claims, dead) if isinstance(r, RangeResult)
    ]
    assert isinstance(head, RangeResult)
    assert isinstance(ready, RangeResult)
    oldest = None
    if head.kvs:
        oldest = _age(_millis(item_name(head.kvs[0].key).encode()), now_millis())
    return QueueStats(
        path,
        "work",
        ready=counts[0],
        delayed=counts[1],
        in_flight=counts[2],
        dead=counts[4],
        orphans=max(0, counts[2] - counts[3]),
        oldest_age=oldest,
        revision=ready.revision,
    )


async def peek_queue(
    client: EtcdClient,
    path: str,
    limit: int = 10,
    *,
    kind: QueueKind | None = None,
    payload: bool = False,
) -> list[QueuedEntry]:
    """The next ``limit`` items of the queue at ``path`` in the order consumers get them (a work
    queue: its ready items, then its delayed ones by due time), without taking any; payloads
    only with ``payload=True``. One read; an empty list when nothing is queued.

    Example::

        from etcd_recipes import DistributedQueue
        from etcd_recipes.queues.inspection import peek_queue

        queue = DistributedQueue(client, f"{prefix}/orders")
        await queue.enqueue_all([b"a", b"b"])
        assert [e.payload for e in await peek_queue(client, f"{prefix}/orders", payload=True)] == [
            b"a",
            b"b",
        ]
    """
    client, path = check_client(client), check_path(path)
    limit = check_count(limit, what="limit")
    found = await _kind(client, path, kind)
    if found is None:
        return []
    now = now_millis()
    if found == "work":
        return await _work_peek(client, path, limit, payload, now)
    base = append_to_path(path, "")
    sort = SortTarget.MOD if found == "fifo" else SortTarget.KEY
    order = SortOrder.ASCEND if found == "fifo" else SortOrder.NONE  # key order: etcd's own
    read = await client.range(base, prefix=True, limit=limit, sort_target=sort, sort_order=order)
    kvs = read.kvs
    if found == "fifo":
        kvs = sorted(kvs, key=lambda kv: (kv.mod_revision, kv.key))  # a batch: argument order
    out = []
    for kv in kvs:
        name = kv.key[len(base.encode()) :]
        prio = _PRIORITY_TAIL.match(name)
        out.append(
            QueuedEntry(
                id=name.decode("utf-8", "replace"),
                key=kv.key_text,
                state="ready",
                create_revision=kv.create_revision,
                size=len(kv.value),
                age=_age(_millis(name), now) if found == "fifo" else None,
                priority=int(prio.group(1)) if prio else None,
                payload=kv.value if payload else None,
            )
        )
    return out


async def _work_peek(
    client: EtcdClient, path: str, limit: int, payload: bool, now: int
) -> list[QueuedEntry]:
    keys = WorkKeys.under(path)
    items, delayed = (
        await client.txn(
            [],
            [
                Op.get(keys.items, prefix=True, limit=limit),
                Op.get(keys.delayed, prefix=True, limit=limit),
            ],
        )
    ).responses
    assert isinstance(items, RangeResult)
    assert isinstance(delayed, RangeResult)
    chosen: list[tuple[KeyValue, bool]] = [(kv, False) for kv in items.kvs]
    chosen += [(kv, True) for kv in delayed.kvs]
    chosen = chosen[:limit]
    names = [promoted_name(kv) if late else item_name(kv.key) for kv, late in chosen]
    counts = (
        (await client.txn([], [Op.get(keys.attempts + n) for n in names])).responses
        if names
        else []
    )
    out = []
    for (kv, is_delayed), name, count in zip(chosen, names, counts, strict=True):
        assert isinstance(count, RangeResult)
        due = ready_millis(kv) if is_delayed else None
        out.append(
            QueuedEntry(
                id=name,
                key=kv.key_text,
                state="delayed" if is_delayed else "ready",
                create_revision=kv.create_revision,
                size=len(kv.value),
                age=None if is_delayed else _age(_millis(name.encode()), now),
                due_in=None if due is None else max(0.0, (due - now) / 1000),
                attempts=attempts_in(count.kvs),
                payload=kv.value if payload else None,
            )
        )
    return out


async def in_flight(client: EtcdClient, path: str, item_ids: Iterable[str]) -> set[str]:
    """Which of ``item_ids`` are in flight in the work queue at ``path`` right now: claimed by
    a consumer, neither acknowledged, requeued nor dead-lettered yet. One read.

    Example::

        from etcd_recipes import DistributedWorkQueue
        from etcd_recipes.queues.inspection import in_flight

        async with DistributedWorkQueue(client, f"{prefix}/jobs") as queue:
            item_id = await queue.enqueue(b"job")
            assert await in_flight(client, f"{prefix}/jobs", [item_id]) == set()
            item = await queue.receive()
            assert await in_flight(client, f"{prefix}/jobs", [item_id]) == {item_id}
            await item.ack()
    """
    client, path = check_client(client), check_path(path)
    ids = list(dict.fromkeys(item_ids))
    for item_id in ids:
        if not isinstance(item_id, str) or not item_id or "/" in item_id:
            raise InvalidArgumentError(f"an item id is a non-empty str without '/': {item_id!r}")
    if not ids:
        return set()
    claimed = WorkKeys.under(path).claimed
    reads = (await client.txn([], [Op.get(claimed + i, count_only=True) for i in ids])).responses
    return {i for i, r in zip(ids, reads, strict=True) if isinstance(r, RangeResult) and r.count}
