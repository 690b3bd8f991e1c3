"""Bounded head reads for the key-ordered queues of this family (not public).

etcd 3.5 answers a limited range read by visiting every key of the range (it counts them all
for ``RangeResponse.count``), so "the first 4 items of a prefix" costs as much as the prefix
is long: 4.2 ms at 100,000 keys against 0.38 ms at 100 (etcd 3.5.1; a read with any sort order
but ascending key fetches and sorts them all: 90 ms). A :class:`Horizon` keeps a head read to
the part of the prefix near its head: ``[prefix, bound)``, where ``bound`` lies ``span`` steps
past the head last seen (a step is the queue's own: a millisecond of the work queue's item
names, a sequence number of a priority bucket).

Guaranteed: every key below the bound is in the range, so the first key read **is** the head
whenever the range is not empty -- an item that comes back below the head (a requeue, a
returned orphan, a put-back, a producer with a slow clock) is seen by the next read -- and a
read costs what the keys below the bound cost, however deep the queue is beyond it. The span
adapts to what the reads count (shrunk in proportion when a range holds more than
``4 * TARGET`` keys, doubled while it holds fewer than ``TARGET / 2``). When the bounded range
is empty, :meth:`Horizon.beyond_op` reads ``[bound, end)`` once: as costly as the rest of the
queue is long, once per gap in the keys wider than the span.

Not guaranteed: a bounded cost over deleted keys etcd has not compacted yet (a range visits
their index entries too): compact etcd's history (``--auto-compaction-retention``), as etcd's
own docs advise. A horizon is a hint shared by the consumers of one queue on one client; it
never decides what a take may take (every take still compares the item's revision).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._core.keys import key_bytes, pad, prefix_range_end
from .._core.txn import GetOp, Op
from ..types import RangeResult

if TYPE_CHECKING:
    from ..client import EtcdClient

TARGET = 64  # keys a bounded head read aims to count
MAX_SPAN = 1 << 40  # steps: beyond any millisecond or sequence gap a queue will have

Bound = Callable[[bytes, int], "bytes | None"]
"""``(head key, span) -> range end``: the key ``span`` steps past ``head`` (``None``: a head
whose name the queue cannot step from -- read unbounded)."""


class Horizon:
    """Where the head of one key-ordered prefix is, and how far past it a read looks.

    Example::

        from etcd_recipes.queues._horizon import Horizon, millis_bound

        horizon = Horizon("/q/items/", millis_bound(b"/q/items/"))
        op = horizon.op(limit=4)            # no head seen yet: the whole prefix
        assert op.range_end == b"/q/items0"
    """

    __slots__ = ("__weakref__", "_bound", "end", "head", "prefix", "span")

    def __init__(self, prefix: str, bound: Bound, *, span: int = TARGET) -> None:
        self.prefix = key_bytes(prefix)
        self.end = prefix_range_end(self.prefix)
        self._bound = bound
        self.head: bytes | None = None  # the first key of the last read that found any
        self.span = span

    def __repr__(self) -> str:
        head = None if self.head is None else self.head.decode("utf-8", "replace")
        prefix = self.prefix.decode("utf-8", "replace")
        return f"<Horizon {prefix!r} head={head!r} span={self.span}>"

    def range_end(self) -> bytes:
        """The end of the next head read: ``span`` steps past the head, or the prefix's end."""
        if self.head is None:
            return self.end
        bound = self._bound(self.head, self.span)
        return self.end if bound is None or bound >= self.end else bound

    def op(self, *, limit: int, keys_only: bool = False) -> GetOp:
        """The next head read: ``[prefix, range_end())``, the first ``limit`` keys."""
        return Op.get(self.prefix, range_end=self.range_end(), limit=limit, keys_only=keys_only)

    def beyond_op(self, read: GetOp, *, limit: int, keys_only: bool = False) -> GetOp | None:
        """The read of what lies past a bounded ``read`` (``None``: it was not bounded)."""
        if read.range_end is None or read.range_end >= self.end:
            return None
        return Op.get(read.range_end, range_end=self.end, limit=limit, keys_only=keys_only)

    def observe(self, op: GetOp, read: RangeResult) -> None:
        """Learn from a head read made with ``op``: the head, and whether the span fits."""
        if read.kvs:
            self.head = read.kvs[0].key
        if op.range_end is None or op.range_end >= self.end:
            return
        if read.count > 4 * TARGET:
            self.span = max(1, self.span * TARGET // read.count)
        elif read.count < TARGET // 2:
            self.span = min(MAX_SPAN, self.span * 2)

    def forget(self) -> None:
        """Read the whole prefix next time (the head may be anywhere: after a purge, say)."""
        self.head = None


def millis_bound(prefix: bytes) -> Bound:
    """Steps of the work queue's item names, ``<prefix><millis%019d>-...``: milliseconds."""

    def bound(head: bytes, span: int) -> bytes | None:
        digits = head[len(prefix) : len(prefix) + 19]
        if not head.startswith(prefix) or len(digits) < 19 or not digits.isdigit():
            return None
        return prefix + pad(int(digits) + span, 19).encode()

    return bound


def sequence_bound(prefix: bytes) -> Bound:
    """Steps of a priority queue's keys, ``<prefix><priority%05d>/<seq%016d>``: sequence
    numbers within the head's priority (all of a lower-numbered priority sorts below)."""

    def bound(head: bytes, span: int) -> bytes | None:
        rest = head[len(prefix) :]
        bucket, _, seq = rest.partition(b"/")
        if not head.startswith(prefix) or not bucket.isdigit() or not seq.isdigit():
            return None
        return prefix + bucket + b"/" + pad(int(seq) + span, 16).encode()

    return bound


_SHARED: weakref.WeakKeyDictionary[EtcdClient, dict[bytes, Horizon]] = weakref.WeakKeyDictionary()


def shared_horizon(client: EtcdClient, prefix: str, bound: Bound) -> Horizon:
    """The :class:`Horizon` of ``prefix`` shared by every queue instance on ``client``."""
    horizons = _SHARED.setdefault(client, {})
    key = key_bytes(prefix)
    found = horizons.get(key)
    if found is None:
        found = horizons[key] = Horizon(prefix, bound)
    return found
