"""The plain KV calls described once, as :class:`~etcd_recipes.client.rpc.Unary` values:
:class:`KVCalls`, a base of :class:`~etcd_recipes.EtcdClient` that also holds the public KV
methods (``get``, ``range``, ``put``, ``delete``, ``txn``, ...). Not public itself.

``_unary_<name>`` takes the arguments of the client's ``<name>`` (``get``, ``range``,
``get_prefix``, ``count``, ``put``, ``delete``, ``txn``, ``get_value``, ``put_value``),
validates them and builds the request in the calling thread. The async client awaits it
through its funnel (:meth:`Unary.send <etcd_recipes.client.rpc.Unary.send>`); the blocking
facade sends it from the caller's own thread (``Runtime.direct`` and
:class:`~etcd_recipes.client.blocking.BlockingRunner`), so such a call costs a blocking caller
no thread hand-off -- but a read-only transaction, which runs on the loop (``detached``).
Either way the same validation, request and result conversion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

from aetcd import rpc as pb

from .._core import validate
from .._core.txn import AnyOp, Compare
from ..codecs import Codec, to_bytes
from ..types import DeleteResult, KeyValue, PutResult, RangeResult, SortOrder, SortTarget, TxnResult
from .base import ClientBase
from .convert import writes
from .rpc import UNSET, Unary, request_too_large

__all__ = ["KVCalls"]

T = TypeVar("T")
D = TypeVar("D")


class KVCalls(ClientBase):
    """The client's plain KV calls and their ``_unary_<name>`` plans (see the module doc)."""

    def _unary_get(
        self,
        key: bytes | str,
        *,
        revision: int = 0,
        serializable: bool = False,
        timeout: float | None = UNSET,
    ) -> Unary[KeyValue | None]:
        c = self
        req = c._range_request(key, revision=revision, serializable=serializable)
        return Unary(c, "get", pb.KVStub, "Range", req, c._conv.first_kv, timeout)

    def _unary_range(
        self, key: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        c = self
        req = c._range_request(key, **kwargs)
        return Unary(c, "range", pb.KVStub, "Range", req, c._range_result, timeout)

    def _unary_get_prefix(
        self, prefix: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> Unary[RangeResult]:
        return self._unary_range(prefix, prefix=True, timeout=timeout, **kwargs)

    def _unary_count(self, prefix: bytes | str, *, timeout: float | None = UNSET) -> Unary[int]:
        c = self
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
        c = self
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
        c = self
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
        c = self
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
        c = self
        first_kv = c._conv.first_kv

        def decoded(resp: Any) -> T | D | None:
            kv = first_kv(resp)
            return default if kv is None else codec.decode(kv.value)

        return Unary(c, "get", pb.KVStub, "Range", c._range_request(key), decoded, UNSET)

    def _unary_put_value(
        self, key: bytes | str, value: T, codec: Codec[T], *, lease: int = 0
    ) -> Unary[PutResult]:
        return self._unary_put(key, codec.encode(value), lease=lease)

    # ------------------------------------------------------------------ KV
    # Each plain KV call is described once by its ``_unary_<name>`` plan (below):
    # awaited here, sent from the caller's own thread by the blocking facade.

    async def get(
        self,
        key: bytes | str,
        *,
        revision: int = 0,
        serializable: bool = False,
        timeout: float | None = UNSET,
    ) -> KeyValue | None:
        """Read one key; ``None`` when it does not exist.

        Example::

            assert await client.get(prefix + "/config/mode") is None
            await client.put(prefix + "/config/mode", "on")
            assert (await client.get(prefix + "/config/mode")).text == "on"
        """
        u = self._unary_get(key, revision=revision, serializable=serializable, timeout=timeout)
        return await u.send()

    async def range(
        self,
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        limit: int = 0,
        revision: int = 0,
        sort_target: SortTarget = SortTarget.KEY,
        sort_order: SortOrder = SortOrder.NONE,
        keys_only: bool = False,
        count_only: bool = False,
        serializable: bool = False,
        max_create_revision: int = 0,
        min_mod_revision: int = 0,
        timeout: float | None = UNSET,
    ) -> RangeResult:
        """Read a key, a prefix (``prefix=True``) or the range ``[key, range_end)``.

        ``max_create_revision`` keeps only keys created at or before that revision, and
        ``min_mod_revision`` only keys modified at or after it (``0``: no filter; etcd filters
        ``kvs``, never ``count``). One plain ``Range`` RPC, never a read-only transaction
        (etcd 3.5.0 and 3.5.1 panic when a read-only ``Txn`` is cancelled in flight).

        Example::

            from etcd_recipes import SortOrder, SortTarget

            first = (await client.put(prefix + "/q/a", b"1")).revision
            await client.put(prefix + "/q/b", b"2")
            oldest = await client.range(prefix + "/q/", prefix=True, limit=1,
                                        sort_target=SortTarget.CREATE,
                                        sort_order=SortOrder.ASCEND)
            assert oldest.kvs[0].value == b"1"
            assert (await client.range(prefix + "/q/", prefix=True, count_only=True)).count == 2
            early = await client.range(prefix + "/q/", prefix=True, max_create_revision=first)
            assert [kv.value for kv in early] == [b"1"]
            assert len(await client.range(prefix + "/q/", prefix=True, min_mod_revision=first)) == 2
        """
        u = self._unary_range(
            key,
            prefix=prefix,
            range_end=range_end,
            limit=limit,
            revision=revision,
            sort_target=sort_target,
            sort_order=sort_order,
            keys_only=keys_only,
            count_only=count_only,
            serializable=serializable,
            max_create_revision=max_create_revision,
            min_mod_revision=min_mod_revision,
            timeout=timeout,
        )
        return await u.send()

    async def get_prefix(
        self, prefix: bytes | str, *, timeout: float | None = UNSET, **kwargs: Any
    ) -> RangeResult:
        """Shorthand for ``range(prefix, prefix=True, ...)``."""
        return await self._unary_get_prefix(prefix, timeout=timeout, **kwargs).send()

    async def count(self, prefix: bytes | str, *, timeout: float | None = UNSET) -> int:
        """How many keys start with ``prefix`` (one count-only RPC)."""
        return await self._unary_count(prefix, timeout=timeout).send()

    async def put(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        lease: int = 0,
        prev_kv: bool = False,
        timeout: float | None = UNSET,
    ) -> PutResult:
        """Write ``value`` at ``key`` (optionally attached to ``lease``).

        Example::

            rev = (await client.put(prefix + "/k", "v")).revision
            assert (await client.get(prefix + "/k")).mod_revision == rev
        """
        u = self._unary_put(key, value, lease=lease, prev_kv=prev_kv, timeout=timeout)
        return await u.send()

    async def delete(
        self,
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        prev_kv: bool = False,
        timeout: float | None = UNSET,
    ) -> DeleteResult:
        """Delete a key, a prefix (``prefix=True``) or the range ``[key, range_end)``.

        Example::

            await client.put(prefix + "/jobs/1", b"a")
            await client.put(prefix + "/jobs/2", b"b")
            assert (await client.delete(prefix + "/jobs/", prefix=True)).deleted == 2
        """
        u = self._unary_delete(
            key, prefix=prefix, range_end=range_end, prev_kv=prev_kv, timeout=timeout
        )
        return await u.send()

    # ------------------------------------------------------------------ transactions

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[AnyOp] = (),
        failure: Sequence[AnyOp] = (),
        *,
        timeout: float | None = UNSET,
    ) -> TxnResult:
        """Run a transaction: if every compare holds, the ``success`` ops, else ``failure``.

        Never retried (a timed-out commit may have landed): the caller decides.

        Example::

            from etcd_recipes import Cmp, Op

            key = prefix + "/leader"
            r = await client.txn([Cmp.missing(key)], [Op.put(key, b"me")])
            assert r.succeeded
            r = await client.txn([Cmp.missing(key)], [Op.put(key, b"you")], [Op.get(key)])
            assert not r.succeeded and r.responses[0].kvs[0].value == b"me"
        """
        return await self._unary_txn(compare, success, failure, timeout=timeout).send()
