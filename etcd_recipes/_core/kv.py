"""The plain KV calls described once, as :class:`~etcd_recipes._core.rpc.Unary` values:
:class:`KVPlans`, a base of :class:`~etcd_recipes.EtcdClient`. Not public.

``_unary_<name>`` takes the arguments of the client's ``<name>`` (``get``, ``range``,
``get_prefix``, ``count``, ``put``, ``delete``), validates them and builds the request in the
calling thread. The async client awaits the result through its funnel (:meth:`KVPlans._send`);
the blocking facade sends it from the caller's own thread (``Runtime.direct`` and
:class:`~etcd_recipes._core.blocking.BlockingRunner`), so a plain KV call costs a blocking
caller no thread hand-off. Either way the same validation, request and result conversion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from aetcd import rpc as pb

from ..codecs import to_bytes
from ..types import DeleteResult, KeyValue, PutResult, RangeResult
from . import validate
from .rpc import UNSET, Unary, request_too_large

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["KVPlans"]

T = TypeVar("T")


class KVPlans:
    """The ``_unary_<name>`` plans of the client's plain KV calls (see the module doc)."""

    def _me(self) -> EtcdClient:
        return self  # type: ignore[return-value]  # only ever a base of EtcdClient

    async def _send(self, u: Unary[T]) -> T:
        """Await ``u`` through the client's funnel (retries, error mapping, metrics)."""
        resp = await self._me()._call(u.op, u.method, pb.KVStub, u.request, timeout=u.timeout)  # type: ignore[arg-type]
        return u.convert(resp)

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
        return Unary("get", "Range", req, c._conv.first_kv, timeout, c._blocking)

    def _unary_range(
        self, key: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        c = self._me()
        req = c._range_request(key, **kwargs)
        return Unary("range", "Range", req, c._range_result, timeout, c._blocking)

    def _unary_get_prefix(
        self, prefix: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        return self._unary_range(prefix, prefix=True, timeout=timeout, **kwargs)

    def _unary_count(self, prefix: bytes | str, *, timeout: float | None = UNSET) -> Unary[int]:
        c = self._me()
        req = c._range_request(prefix, prefix=True, count_only=True)
        return Unary("range", "Range", req, c._conv.count, timeout, c._blocking)

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
        return Unary("put", "Put", req, c._conv.put_result, timeout, c._blocking)

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
        return Unary("delete", "DeleteRange", req, convert, timeout, c._blocking)
