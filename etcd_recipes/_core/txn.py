"""Readable builders for transaction compares and operations.

Compares are built with operators on :class:`Cmp` targets; operations with :class:`Op`::

    result = await client.txn(
        compare=[Cmp.version("/jobs/1") == 0],          # "the key does not exist"
        success=[Op.put("/jobs/1", b"worker-a")],
        failure=[Op.get("/jobs/1")],
    )
    if not result.succeeded:
        holder = result.responses[0].kvs[0].value

The builders are plain data; :class:`~etcd_recipes.client.EtcdClient` turns them into protobuf
messages (applying its key namespace), so they can be built once and reused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from ..codecs import to_bytes
from ..types import SortOrder, SortTarget
from .keys import key_bytes
from .validate import check_choice, check_lease, check_revision

__all__ = ["Cmp", "CmpResult", "CmpTarget", "Compare", "DeleteOp", "GetOp", "Op", "PutOp", "TxnOp"]


class CmpTarget(enum.IntEnum):
    """What a compare looks at (etcd's ``Compare.CompareTarget``)."""

    VERSION = 0
    CREATE = 1
    MOD = 2
    VALUE = 3
    LEASE = 4


class CmpResult(enum.IntEnum):
    """The relation a compare tests (etcd's ``Compare.CompareResult``)."""

    EQUAL = 0
    GREATER = 1
    LESS = 2
    NOT_EQUAL = 3


@dataclass(frozen=True)
class Compare:
    """One compare of a transaction's guard. Build it with :class:`Cmp`."""

    key: bytes
    target: CmpTarget
    result: CmpResult
    operand: int | bytes
    range_end: bytes | None = None
    prefix: bool = False


@dataclass(frozen=True)
class _Target:
    key: bytes
    target: CmpTarget
    prefix: bool

    def _cmp(self, result: CmpResult, other: object) -> Compare:
        if self.target is CmpTarget.VALUE:
            operand: int | bytes = to_bytes(other)  # type: ignore[arg-type]
        else:
            if isinstance(other, bool) or not isinstance(other, int):
                raise TypeError(f"compare operand for {self.target.name} must be an int")
            operand = other
        return Compare(self.key, self.target, result, operand, prefix=self.prefix)

    def __eq__(self, other: object) -> Compare:  # type: ignore[override]
        return self._cmp(CmpResult.EQUAL, other)

    def __ne__(self, other: object) -> Compare:  # type: ignore[override]
        return self._cmp(CmpResult.NOT_EQUAL, other)

    def __lt__(self, other: object) -> Compare:
        return self._cmp(CmpResult.LESS, other)

    def __gt__(self, other: object) -> Compare:
        return self._cmp(CmpResult.GREATER, other)

    __hash__ = None  # type: ignore[assignment]


class Cmp:
    """Compare targets; combine with ``==``, ``!=``, ``<`` and ``>``.

    Example::

        from etcd_recipes import Cmp

        unchanged = Cmp.mod_revision("/k") == 42  # unchanged since revision 42
        is_on = Cmp.value("/k") == b"on"
        present, absent = Cmp.exists("/k"), Cmp.missing("/k")
    """

    @staticmethod
    def version(key: bytes | str, *, prefix: bool = False) -> _Target:
        """The key's version (0 when it does not exist)."""
        return _Target(key_bytes(key), CmpTarget.VERSION, prefix)

    @staticmethod
    def create_revision(key: bytes | str, *, prefix: bool = False) -> _Target:
        """The revision that created the key (0 when it does not exist)."""
        return _Target(key_bytes(key), CmpTarget.CREATE, prefix)

    @staticmethod
    def mod_revision(key: bytes | str, *, prefix: bool = False) -> _Target:
        """The revision of the key's last modification (0 when it does not exist)."""
        return _Target(key_bytes(key), CmpTarget.MOD, prefix)

    @staticmethod
    def value(key: bytes | str, *, prefix: bool = False) -> _Target:
        """The key's value (compared as bytes)."""
        return _Target(key_bytes(key), CmpTarget.VALUE, prefix)

    @staticmethod
    def lease(key: bytes | str, *, prefix: bool = False) -> _Target:
        """The id of the lease the key is attached to (0 for none)."""
        return _Target(key_bytes(key), CmpTarget.LEASE, prefix)

    @staticmethod
    def exists(key: bytes | str) -> Compare:
        """The key exists (``version > 0``)."""
        return Cmp.version(key) > 0

    @staticmethod
    def missing(key: bytes | str) -> Compare:
        """The key does not exist (``version == 0``)."""
        return Cmp.version(key) == 0


@dataclass(frozen=True)
class GetOp:
    """A range read inside a transaction. Build it with :meth:`Op.get`."""

    key: bytes
    prefix: bool = False
    range_end: bytes | None = None
    limit: int = 0
    sort_target: SortTarget = SortTarget.KEY
    sort_order: SortOrder = SortOrder.NONE
    keys_only: bool = False
    count_only: bool = False


@dataclass(frozen=True)
class PutOp:
    """A put inside a transaction. Build it with :meth:`Op.put`."""

    key: bytes
    value: bytes
    lease: int = 0
    prev_kv: bool = False


@dataclass(frozen=True)
class DeleteOp:
    """A delete inside a transaction. Build it with :meth:`Op.delete`."""

    key: bytes
    prefix: bool = False
    range_end: bytes | None = None
    prev_kv: bool = False


@dataclass(frozen=True)
class TxnOp:
    """A nested transaction. Build it with :meth:`Op.txn`."""

    compare: list[Compare] = field(default_factory=list)
    success: list[AnyOp] = field(default_factory=list)
    failure: list[AnyOp] = field(default_factory=list)


AnyOp = Union[GetOp, PutOp, DeleteOp, TxnOp]


class Op:
    """Operations for the branches of a transaction.

    Example::

        from etcd_recipes import Op

        put = Op.put("/k", b"v", lease=0x1234)
        clear = Op.delete("/queue/", prefix=True)
        read = Op.get("/k")
    """

    @staticmethod
    def get(
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        limit: int = 0,
        sort_target: SortTarget = SortTarget.KEY,
        sort_order: SortOrder = SortOrder.NONE,
        keys_only: bool = False,
        count_only: bool = False,
    ) -> GetOp:
        """Read a key, a prefix, or ``[key, range_end)``."""
        return GetOp(
            key_bytes(key),
            prefix,
            None if range_end is None else key_bytes(range_end),
            check_revision(limit, what="limit"),
            check_choice(sort_target, SortTarget, what="sort_target"),
            check_choice(sort_order, SortOrder, what="sort_order"),
            keys_only,
            count_only,
        )

    @staticmethod
    def put(
        key: bytes | str, value: bytes | str, *, lease: int = 0, prev_kv: bool = False
    ) -> PutOp:
        """Write ``value`` (``str`` is UTF-8 encoded), optionally attached to ``lease``."""
        return PutOp(key_bytes(key), to_bytes(value), check_lease(lease), prev_kv)

    @staticmethod
    def delete(
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        prev_kv: bool = False,
    ) -> DeleteOp:
        """Delete a key, a prefix, or ``[key, range_end)``."""
        return DeleteOp(
            key_bytes(key), prefix, None if range_end is None else key_bytes(range_end), prev_kv
        )

    @staticmethod
    def txn(
        compare: list[Compare], success: list[AnyOp], failure: list[AnyOp] | None = None
    ) -> TxnOp:
        """A nested transaction."""
        return TxnOp(list(compare), list(success), list(failure or []))
