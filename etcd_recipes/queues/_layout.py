"""The keys of a work queue and the reads of its snapshot (not public; pure, no I/O).

Layout (shared with the Kotlin library; ``<p>`` is the queue path, ``<id>`` an item's name):
``<p>/items/<id>`` (waiting payloads), ``<p>/claimed/<id>`` (payloads in flight),
``<p>/claims/<id>`` (claim markers, on the consumer's lease), ``<p>/attempts/<id>`` (int32 BE
delivery counts), ``<p>/dlq/<id>`` (dead letters), ``<p>/reasons/<id>`` (a dead letter's
failure reason, UTF-8, written in the transaction that made the dead letter: a sibling the JVM
library ignores), ``<p>/delayed/<ready%019d>-<r3>`` (an item requeued with a delay:
``<p>/delayed/<ready%019d>-<id>``, promoted back to ``items/<id>``), and -- only with trace
propagation on (``trace_propagation=``; off by default, and the JVM library knows nothing of
it) -- ``<p>/trace/<id>``, the producer's trace context, written with the item and deleted on
``ack()`` or purge; and -- only with ``max_items`` set -- ``<p>/admission``, which the producers
of a bounded queue write in every enqueue and compare on (see :mod:`._bounded`). See
:mod:`etcd_recipes.queues.work` for what each key guarantees.

========================================  =============================  ========================
key                                       value                          lease
========================================  =============================  ========================
``<p>/items/<id>``                        the payload, waiting           none
``<p>/claimed/<id>``                      the payload, in flight         none (survives a crash)
``<p>/claims/<id>``                       the consumer's ``client_id``   the consumer's lease
``<p>/attempts/<id>``                     deliveries so far, int32 BE    none
``<p>/dlq/<id>``                          a dead letter's payload        none
``<p>/reasons/<id>``                      a dead letter's reason, UTF-8  none
``<p>/delayed/<ready%019d>-<r3>``         a delayed payload              none
``<p>/trace/<id>``                        the producer's trace context   none (opt-in)
``<p>/admission``                         ``""`` (bounded queues only)   none
========================================  =============================  ========================
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core.keys import append_to_path, pad, random_token
from .._core.logctx import library_logger
from .._core.txn import AnyOp, GetOp, Op
from ..codecs import INT32
from ..errors import CodecError, InvalidArgumentError
from ..types import KeyValue
from ._horizon import Horizon
from ._produce import clock_millis, key_millis, now_millis

log = library_logger("etcd_recipes.work_queue")

WINDOW = 4  # items (with their payloads) a receive reads and may try in one claim


@dataclass(frozen=True, slots=True)
class WorkKeys:
    """The key prefixes of one work queue (each ends in ``/``)."""

    items: str
    claimed: str
    claims: str
    attempts: str
    dlq: str
    reasons: str
    delayed: str
    trace: str
    admission: str  # a bounded queue's producers compare on it (max_items)

    @classmethod
    def under(cls, path: str) -> WorkKeys:
        """The keys of the queue at ``path`` (one shared instance per path: frozen)."""
        return _keys_under(path)

    @classmethod
    def _make(cls, path: str) -> WorkKeys:
        base = append_to_path(path, "")
        return cls(
            items=base + "items/",
            claimed=base + "claimed/",
            claims=base + "claims/",
            attempts=base + "attempts/",
            dlq=base + "dlq/",
            reasons=base + "reasons/",
            delayed=base + "delayed/",
            trace=base + "trace/",
            admission=base + "admission",
        )

    def fresh(self, delay: float, batch: int = 0) -> list[str]:
        """New keys: one item (``batch`` 0) or ``batch`` items sharing one millis, in order;
        a ``delay`` > 0 makes the one item a delayed one, ready ``delay`` seconds from now."""
        if delay:
            ready = clock_millis() + round(delay * 1000)
            return [f"{self.delayed}{pad(ready, 19)}-{random_token(3)}"]
        millis = pad(key_millis(), 19)
        if not batch:
            return [f"{self.items}{millis}-{random_token(3)}"]
        return [f"{self.items}{millis}-{pad(i, 5)}-{random_token(3)}" for i in range(batch)]

    def writes(
        self, values: list[bytes], context: bytes | None, delay: float = 0, batch: int = 0
    ) -> tuple[Callable[[], list[str]], list[bytes]]:
        """The fresh keys (a callable: a clash draws new ones; see :meth:`fresh` for ``delay``
        and ``batch``) and values of an enqueue of ``values``, each with ``context`` under
        ``trace/<its name>`` in the same transaction unless ``context`` is ``None``. Item keys
        come first, in order."""
        if context is None:
            return lambda: self.fresh(delay, batch), values

        def keys() -> list[str]:
            fresh = self.fresh(delay, batch)
            return fresh + [self.trace + item_name(k.encode()) for k in fresh]

        return keys, [*values, *([context] * len(values))]

    def snapshot_ops(
        self, items: GetOp, delayed_until: int, *, orphans: bool = True
    ) -> list[AnyOp]:
        """The reads of a snapshot: ``items`` (the first items, a bounded read: see
        :class:`HeadReader`), the first delayed item due before ``delayed_until`` (millis) and
        -- unless a claim carries the snapshot (the sweeps and the next fresh snapshot look) --
        the in-flight and marker counts that reveal orphans."""
        ops: list[AnyOp] = [
            items,
            Op.get(
                self.delayed,
                range_end=self.delayed + pad(delayed_until, 19),
                limit=1,
                keys_only=True,
            ),
        ]
        if orphans:
            ops += [
                Op.get(self.claimed, prefix=True, count_only=True),
                Op.get(self.claims, prefix=True, count_only=True),
            ]
        return ops


@functools.lru_cache(maxsize=1024)
def _keys_under(path: str) -> WorkKeys:
    return WorkKeys._make(path)


@dataclass
class Snapshot:
    items: list[KeyValue]  # the first few items (with their values), or nothing
    delayed: KeyValue | None  # the first delayed item due soon (key only)
    orphans: bool  # more payloads in flight than claim markers
    revision: int
    kept: bool = False  # read by an earlier claim (see the queue's prefetch), not just now
    beyond: GetOp | None = None  # no items below the read's bound: the read of those past it
    limit: int = WINDOW  # items the read asked for (more may wait when it got that many)

    @classmethod
    def parse(cls, responses: list[Any], revision: int) -> Snapshot:
        """The snapshot in the responses of :meth:`WorkKeys.snapshot_ops`."""
        items, delayed, *counts = responses
        orphans = bool(counts) and counts[0].count > counts[1].count
        return cls(list(items.kvs), delayed.kvs[0] if delayed.kvs else None, orphans, revision)


class HeadReader:
    """The snapshot reads of one work queue, kept near its head (:mod:`._horizon`): items
    below a bound ``span`` milliseconds past the head last seen, delayed items due within
    ``lookahead`` seconds. A snapshot whose bounded items read found none carries the read of
    what lies past the bound (:attr:`Snapshot.beyond`): not empty until that read says so."""

    __slots__ = ("horizon", "keys", "lookahead")

    def __init__(self, keys: WorkKeys, horizon: Horizon, lookahead: float) -> None:
        self.keys = keys
        self.horizon = horizon
        self.lookahead = lookahead

    def ops(self, *, orphans: bool = True, limit: int = WINDOW) -> list[AnyOp]:
        """The reads of a snapshot of the first ``limit`` items (a batch reads more)."""
        until = now_millis() + round(self.lookahead * 1000)
        return self.keys.snapshot_ops(self.horizon.op(limit=limit), until, orphans=orphans)

    def parse(self, ops: list[AnyOp], responses: list[Any], revision: int) -> Snapshot:
        """The snapshot in the responses of ``ops`` (made by :meth:`ops`)."""
        snap = Snapshot.parse(responses, revision)
        items_op = ops[0]
        assert isinstance(items_op, GetOp)
        self.horizon.observe(items_op, responses[0])
        snap.limit = items_op.limit
        if not snap.items:
            snap.beyond = self.horizon.beyond_op(items_op, limit=items_op.limit)
        return snap


def item_name(key: bytes) -> str:
    return key.rsplit(b"/", 1)[-1].decode("utf-8", "replace")


def promoted_name(kv: KeyValue) -> str:
    """The ``items/`` name a matured delayed item is promoted under: its own, or -- for an item
    requeued with a delay (``<ready%019d>-<id>``) -- the item's id, so it keeps its id."""
    name = item_name(kv.key)
    rest = name.split("-", 1)[-1]
    millis = rest.split("-", 1)[0]
    return rest if "-" in rest and len(millis) == 19 and millis.isdigit() else name


def ready_millis(kv: KeyValue) -> int:
    """When a delayed item matures (its name's millis); a malformed name is due now."""
    try:
        return int(item_name(kv.key).split("-", 1)[0])
    except ValueError:
        return 0


def attempts_in(kvs: list[KeyValue]) -> int:
    """The delivery count stored in ``kvs`` (0 when absent or malformed)."""
    if not kvs:
        return 0
    try:
        return INT32.decode(kvs[0].value)
    except CodecError:
        log.warning("ignoring a malformed attempt count at %r", kvs[0].key)
        return 0


def check_id(item_id: str) -> str:
    """An item id as the public methods take it: a non-empty name without ``/``."""
    if not isinstance(item_id, str) or not item_id or "/" in item_id:
        raise InvalidArgumentError(f"not an item id: {item_id!r}")
    return item_id
