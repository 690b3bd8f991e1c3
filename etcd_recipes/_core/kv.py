"""The plain KV calls described once, as :class:`~etcd_recipes._core.rpc.Unary` values:
:class:`KVPlans`, a base of :class:`~etcd_recipes.EtcdClient`. Not public.

``_unary_<name>`` takes the arguments of the client's ``<name>`` (``get``, ``range``,
``get_prefix``, ``count``, ``put``, ``delete``, ``txn``, ``get_value``, ``put_value``),
validates them and builds the request in the calling thread. The async client awaits it
through its funnel (:meth:`Unary.send <etcd_recipes._core.rpc.Unary.send>`); the blocking
facade sends it from the caller's own thread (``Runtime.direct`` and
:class:`~etcd_recipes._core.blocking.BlockingRunner`), so such a call costs a blocking caller
no thread hand-off -- but a read-only transaction, which runs on the loop (``detached``).
Either way the same validation, request and result conversion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aetcd import rpc as pb

from ..codecs import Codec, to_bytes
from ..types import DeleteResult, KeyValue, PutResult, RangeResult, TxnResult
from . import validate
from .convert import writes
from .rpc import UNSET, Unary, request_too_large
from .txn import AnyOp, Compare

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["KVPlans"]

T = TypeVar("T")
D = TypeVar("D")


class KVPlans:
    """The ``_unary_<name>`` plans of the client's plain KV calls (see the module doc)."""

    def _me(self) -> EtcdClient:
        return self  # type: ignore[return-value]  # only ever a base of EtcdClient

    def _unary_get(
        self,
        key: bytes | str,
        *,
        revision: int = 0,
        serializable: bool = False,
        timeout: float | None = UNSET,
    ) -> Unary[KeyValue | None]:
        c = self._me()
        req = c._range_request(key, revision=revision, serializable=serializable)
        return Unary(c, "get", pb.KVStub, "Range", req, c._conv.first_kv, timeout)

    def _unary_range(
        self, key: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        c = self._me()
        req = c._range_request(key, **kwargs)
        return Unary(c, "range", pb.KVStub, "Range", req, c._range_result, timeout)

    def _unary_get_prefix(
        self, prefix: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        return self._unary_range(prefix, prefix=True, timeout=timeout, **kwargs)

    def _unary_count(self, prefix: bytes | str, *, timeout: float | None = UNSET) -> Unary[int]:
        c = self._me()
        req = c._range_request(prefix, prefix=True, count_only=True)
        return Unary(c, "range", pb.KVStub, "Range", req, c._conv.count, timeout)

    def _unary_put(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        lease: int = 0,
        prev_kv: bool = False,
        timeout: float | None = UNSET,
    ) -> Unary[PutResult]:
        c = self._me()
        lease = validate.check_lease(lease)
        k, v = c._k(key), to_bytes(value)
        if len(k) + len(v) > c._max_request:  # the server would refuse it: do not send it
            raise request_too_large("put", len(k) + len(v), c._max_request)
        req = pb.PutRequest(key=k, value=v, lease=lease, prev_kv=prev_kv)
        return Unary(c, "put", pb.KVStub, "Put", req, c._conv.put_result, timeout)

    def _unary_delete(
        self,
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        prev_kv: bool = False,
        timeout: float | None = UNSET,
    ) -> Unary[DeleteResult]:
        c = self._me()
        k = c._k(key)
        req = pb.DeleteRangeRequest(
            key=k, range_end=c._conv.end(k, prefix, range_end), prev_kv=prev_kv
        )
        convert = c._conv.delete_result
        return Unary(c, "delete", pb.KVStub, "DeleteRange", req, convert, timeout)

    def _unary_txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[AnyOp] = (),
        failure: Sequence[AnyOp] = (),
        *,
        timeout: float | None = UNSET,
    ) -> Unary[TxnResult]:
        c = self._me()
        req = c._conv.txn_pb(compare, success, failure)
        if (size := req.ByteSize()) > c._max_request:
            raise request_too_large("txn", size, c._max_request)
        # etcd 3.5.0-3.5.2 panic when a *read-only* transaction is cancelled server-side:
        # those are never cancelled there (see RpcRunner.call). Writes are applied through
        # raft without the request's context, so they keep the normal, cancellable path.
        detached = not writes(success) and not writes(failure)
        convert = c._conv.txn_result
        return Unary(
            c, "txn", pb.KVStub, "Txn", req, convert, timeout, retry=False, detached=detached
        )

    @overload
    def _unary_get_value(self, key: bytes | str, codec: Codec[T]) -> Unary[T | None]: ...

    @overload
    def _unary_get_value(
        self, key: bytes | str, codec: Codec[T], *, default: D
    ) -> Unary[T | D]: ...

    def _unary_get_value(
        self, key: bytes | str, codec: Codec[T], *, default: D | None = None
    ) -> Unary[Any]:
        c = self._me()
        first_kv = c._conv.first_kv

        def decoded(resp: Any) -> T | D | None:
            kv = first_kv(resp)
            return default if kv is None else codec.decode(kv.value)

        return Unary(c, "get", pb.KVStub, "Range", c._range_request(key), decoded, UNSET)

    def _unary_put_value(
        self, key: bytes | str, value: T, codec: Codec[T], *, lease: int = 0
    ) -> Unary[PutResult]:
        return self._unary_put(key, codec.encode(value), lease=lease)
