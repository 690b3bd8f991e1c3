"""Conversions between the client's typed API and etcd's protobuf messages. Not public.

One :class:`Convert` per client (it knows the key namespace): key prefixing and stripping,
range request building, ``Cmp``/``Op`` encoding, and protobuf -> typed results. The client
binds these methods as its own attributes, so the hot path pays no extra call frame.

:class:`PreparedTxn` is a transaction encoded once and run many times (the lock recipes' fixed
queueing transaction), and :func:`guarded_delete` the hold release's delete built
straight as protobuf: the hot paths skip the ``Cmp``/``Op`` round trip. Both run through the
client's one funnel (``EtcdClient._call``: retries off, error mapping, metrics), exactly as
:meth:`~etcd_recipes.EtcdClient.txn` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aetcd import rpc as pb

from .._core.keys import key_bytes, prefix_range_end
from .._core.txn import AnyOp, Cmp, Compare, DeleteOp, GetOp, Op, PutOp, TxnOp
from .._core.validate import check_choice, check_revision
from ..errors import InvalidArgumentError
from ..types import (
    DeleteResult,
    KeyValue,
    LeaseInfo,
    Member,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Status,
    TxnResult,
)
from .rpc import request_too_large

if TYPE_CHECKING:
    from .base import ClientBase

__all__ = ["Convert", "EnqueueTxn", "PreparedTxn", "guarded_delete", "members", "status", "writes"]

_DELETE_TEMPLATES = 256  # guarded_delete_pb keeps at most this many (then starts afresh)
_CMP_OPERAND = ("version", "create_revision", "mod_revision", "value", "lease")  # by CmpTarget


class Convert:
    """Namespaced encoding and decoding for one client."""

    def __init__(self, namespace: bytes) -> None:
        self.namespace = namespace
        self._deletes: dict[bytes | str, Any] = {}  # guarded_delete_pb's templates, by key

    # ------------------------------------------------------------------ keys

    def k(self, key: bytes | str) -> bytes:
        """``key`` as bytes, inside the namespace."""
        return self.namespace + key_bytes(key)

    def end(self, key: bytes, prefix: bool, range_end: bytes | str | None) -> bytes:
        """The namespaced ``range_end`` for a prefix/range request (``key`` already namespaced)."""
        if prefix:
            if range_end is not None:
                raise InvalidArgumentError("give either prefix=True or range_end=, not both")
            return prefix_range_end(key)
        if range_end is None:
            return b""
        end = key_bytes(range_end, allow_empty=True)
        if end == b"\x00":  # "every key from key on": stay inside the namespace
            return prefix_range_end(self.namespace) if self.namespace else end
        return self.namespace + end

    def strip(self, key: bytes) -> bytes:
        """``key`` without the namespace."""
        if self.namespace and key.startswith(self.namespace):
            return key[len(self.namespace) :]
        return key

    def kv(self, pb_kv: Any) -> KeyValue:
        """A protobuf ``KeyValue`` as a typed one, its key namespace-stripped."""
        # The fields are read once each, positionally: protobuf already gives bytes and ints
        # (this runs for every key of every read and event).
        return KeyValue(
            self.strip(pb_kv.key),
            pb_kv.value,
            pb_kv.create_revision,
            pb_kv.mod_revision,
            pb_kv.version,
            pb_kv.lease,
        )

    # ------------------------------------------------------------------ KV

    def range_request(
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
    ) -> Any:
        """A ``RangeRequest`` (validated, namespaced)."""
        if (limit, revision, max_create_revision, min_mod_revision) != (0, 0, 0, 0):
            check_revision(limit, what="limit")
            check_revision(revision)
            check_revision(max_create_revision, what="max_create_revision")
            check_revision(min_mod_revision, what="min_mod_revision")
        k = self.namespace + key_bytes(key)
        return pb.RangeRequest(
            key=k,
            range_end=self.end(k, prefix, range_end),
            limit=limit,
            revision=revision,
            sort_target=int(check_choice(sort_target, SortTarget, what="sort_target")),
            sort_order=int(check_choice(sort_order, SortOrder, what="sort_order")),
            keys_only=keys_only,
            count_only=count_only,
            serializable=serializable,
            max_create_revision=max_create_revision,
            min_mod_revision=min_mod_revision,
        )

    def range_result(self, resp: Any) -> RangeResult:
        """A ``RangeResponse`` as a :class:`RangeResult`."""
        kv = self.kv
        return RangeResult([kv(x) for x in resp.kvs], resp.count, resp.more, resp.header.revision)

    def first_kv(self, resp: Any) -> KeyValue | None:
        """The first key of a ``RangeResponse`` (``get()``'s result), ``None`` when empty."""
        return self.kv(resp.kvs[0]) if resp.kvs else None

    @staticmethod
    def count(resp: Any) -> int:
        """The ``count`` of a count-only ``RangeResponse``."""
        return int(resp.count)

    def put_result(self, resp: Any) -> PutResult:
        """A ``PutResponse`` as a :class:`PutResult`."""
        prev = self.kv(resp.prev_kv) if resp.HasField("prev_kv") else None
        return PutResult(revision=int(resp.header.revision), prev_kv=prev)

    def delete_result(self, resp: Any) -> DeleteResult:
        """A ``DeleteRangeResponse`` as a :class:`DeleteResult`."""
        kv = self.kv
        return DeleteResult(resp.deleted, resp.header.revision, [kv(x) for x in resp.prev_kvs])

    # ------------------------------------------------------------------ transactions

    def compare_pb(self, c: Compare) -> Any:
        """A :class:`Compare` as a protobuf ``Compare``."""
        out = pb.Compare()
        self._fill_compare(out, c)
        return out

    def op_pb(self, op: AnyOp) -> Any:
        """An ``Op.put/get/delete/txn`` as a protobuf ``RequestOp``."""
        out = pb.RequestOp()
        self._fill_op(out, op)
        return out

    def txn_pb(
        self, compare: Sequence[Compare], success: Sequence[AnyOp], failure: Sequence[AnyOp]
    ) -> Any:
        """A protobuf ``TxnRequest``."""
        request = pb.TxnRequest()
        self._fill_txn(request, compare, success, failure)
        return request

    # The builders fill the request in place, setting only the fields that differ from the
    # defaults: building each sub-message with keyword arguments and then copying it into its
    # parent cost four times as much on the queues' transactions (a dozen operations each).

    def _fill_txn(
        self,
        request: Any,
        compare: Sequence[Compare],
        success: Sequence[AnyOp],
        failure: Sequence[AnyOp],
    ) -> None:
        add = request.compare.add
        for c in compare:
            if not isinstance(c, Compare):
                raise InvalidArgumentError(f"not a compare: {c!r} (build one with Cmp)")
            self._fill_compare(add(), c)
        add = request.success.add
        for op in success:
            self._fill_op(add(), op)
        add = request.failure.add
        for op in failure:
            self._fill_op(add(), op)

    def _fill_compare(self, out: Any, c: Compare) -> None:
        # Builders already validated their keys: only the namespace is added here.
        self._fill_span(out, c.key, c.prefix, c.range_end)
        out.target = c.target
        out.result = c.result
        setattr(out, _CMP_OPERAND[c.target], c.operand)

    def _fill_span(self, out: Any, key: bytes, prefix: bool, range_end: bytes | str | None) -> None:
        """Set ``out``'s ``key`` (namespaced) and, for a range, its ``range_end``."""
        k = out.key = self.namespace + key
        if prefix or range_end:
            out.range_end = self.end(k, prefix, range_end)

    def _fill_op(self, out: Any, op: AnyOp) -> None:
        if isinstance(op, PutOp):
            put = out.request_put
            put.key = self.namespace + op.key
            put.value = op.value
            if op.lease:
                put.lease = op.lease
            if op.prev_kv:
                put.prev_kv = True
        elif isinstance(op, DeleteOp):
            delete = out.request_delete_range
            self._fill_span(delete, op.key, op.prefix, op.range_end)
            if op.prev_kv:
                delete.prev_kv = True
        elif isinstance(op, GetOp):
            get = out.request_range
            self._fill_span(get, op.key, op.prefix, op.range_end)
            if op.limit:
                get.limit = op.limit
            if op.sort_target:
                get.sort_target = int(op.sort_target)
            if op.sort_order:
                get.sort_order = int(op.sort_order)
            if op.keys_only:
                get.keys_only = True
            if op.count_only:
                get.count_only = True
        elif isinstance(op, TxnOp):
            nested = out.request_txn
            nested.SetInParent()  # an empty nested transaction is still one
            self._fill_txn(nested, op.compare, op.success, op.failure)
        else:
            raise InvalidArgumentError(
                f"not a transaction operation: {op!r} (use Op.put/get/delete)"
            )

    def guarded_delete_pb(self, key: bytes | str, create_revision: int) -> Any:
        """``If(create_revision(key) == create_revision) Then(delete key)``, a ``TxnRequest``
        (a hold's release: deletes the key only while it is still that hold's). Copied from a
        template kept per key (a lock's key recurs with its pooled lease): a new message each
        call, since gRPC serializes it later, in the call's own task."""
        template = self._deletes.get(key)
        if template is None:
            if len(self._deletes) >= _DELETE_TEMPLATES:
                self._deletes.clear()
            k = self.namespace + key_bytes(key)
            template = self._deletes[key] = pb.TxnRequest(
                compare=[pb.Compare(key=k, target=pb.Compare.CREATE, result=pb.Compare.EQUAL)],
                success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k))],
            )
        request = pb.TxnRequest()
        request.CopyFrom(template)
        request.compare[0].create_revision = create_revision
        return request

    def txn_result(self, resp: Any) -> TxnResult:
        """A ``TxnResponse`` as a :class:`TxnResult` (nested transactions included)."""
        out: list[Any] = []
        for r in resp.responses:
            which = r.WhichOneof("response")
            if which == "response_range":
                out.append(self.range_result(r.response_range))
            elif which == "response_put":
                p = r.response_put
                prev = self.kv(p.prev_kv) if p.HasField("prev_kv") else None
                out.append(PutResult(int(p.header.revision), prev))
            elif which == "response_delete_range":
                out.append(self.delete_result(r.response_delete_range))
            else:
                out.append(self.txn_result(r.response_txn))
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), out)

    # ------------------------------------------------------------------ leases

    def lease_info(self, resp: Any) -> LeaseInfo:
        """A ``LeaseTimeToLiveResponse`` as a :class:`LeaseInfo`."""
        return LeaseInfo(
            id=int(resp.ID),
            ttl=int(resp.TTL),
            granted_ttl=int(resp.grantedTTL),
            keys=[self.strip(bytes(k)) for k in resp.keys],
        )


async def guarded_delete(
    client: ClientBase,
    key: bytes | str,
    fencing_token: int,
    *,
    timeout: float,
    settle: list[BaseException],
) -> bool:
    """Delete ``key`` if it is still the one created at ``fencing_token`` (a hold's release):
    ``True`` if it was, ``False`` if the compare failed (the hold was not current any more).
    One transaction, never retried, bounded by ``timeout`` (or the client's own per-attempt
    timeout when that is shorter). A cancellation while it is in flight waits for etcd's
    answer (shielded, bounded) and is appended to ``settle`` instead of raised, so the caller
    finishes its release first and re-raises it afterwards.

    Example::

        from etcd_recipes.client.convert import guarded_delete

        rev = (await client.put(prefix + "/held", b"me")).revision
        late: list[BaseException] = []
        assert not await guarded_delete(client, prefix + "/held", rev + 1, timeout=5, settle=late)
        assert await guarded_delete(client, prefix + "/held", rev, timeout=5, settle=late)
        assert await client.get(prefix + "/held") is None and not late
    """
    per_attempt = client._resilience.rpc.operation_timeout
    # The client's own per-attempt timeout when it is shorter (no need to pass it).
    deadline: Any = ... if per_attempt is not None and per_attempt <= timeout else timeout
    resp = await client._call(
        "txn",
        "Txn",
        pb.KVStub,
        client._conv.guarded_delete_pb(key, fencing_token),
        retry=False,
        timeout=deadline,
        settle=settle,
    )
    return bool(resp.succeeded)


class PreparedTxn:
    """A transaction encoded (validated, namespaced, size-checked) once, to run many times
    with the semantics of :meth:`~etcd_recipes.EtcdClient.txn` (never retried; a read-only one
    is never cancelled server-side).

    Example::

        from etcd_recipes import Cmp, Op
        from etcd_recipes.client.convert import PreparedTxn

        key = prefix + "/once"
        create = PreparedTxn(client, [Cmp.missing(key)], [Op.put(key, b"x")], [Op.get(key)])
        assert (await create.run()).succeeded
        assert not (await create.run()).succeeded  # the same request, sent again
    """

    __slots__ = ("_client", "_detached", "request")

    def __init__(
        self,
        client: ClientBase,
        compare: Sequence[Compare],
        success: Sequence[AnyOp] = (),
        failure: Sequence[AnyOp] = (),
    ) -> None:
        self._client = client
        self.request = client._conv.txn_pb(compare, success, failure)
        if (size := self.request.ByteSize()) > client._max_request:
            raise request_too_large("txn", size, client._max_request)
        self._detached = not writes(success) and not writes(failure)

    async def run(self, *, settle: bool = False) -> TxnResult:
        """Send it; the typed result. ``settle``: a cancellation while it is in flight waits
        for etcd's answer (shielded, bounded) before it propagates -- the write is then
        applied or not, never pending behind the caller's cleanup (as with
        :func:`~etcd_recipes._core.shield.settled`, without a task of its own)."""
        return self._client._conv.txn_result(await self._send(settle))

    async def _send(self, settle: bool) -> Any:
        deferred: list[BaseException] | None = [] if settle else None
        try:
            resp = await self._client._call(
                "txn",
                "Txn",
                pb.KVStub,
                self.request,
                retry=False,
                detached=self._detached,
                settle=deferred,
            )
        except BaseException:
            if deferred:
                raise deferred[0] from None
            raise
        if deferred:
            raise deferred[0]
        return resp


class EnqueueTxn(PreparedTxn):
    """The lock recipes' queueing transaction, prepared once per key and lease:
    ``If(create_revision(key) == 0) Then(put key with lease, get the newest keys under
    prefix) Else(get key)``, decoded to just what queueing needs (see :meth:`enqueue`).

    Example::

        from etcd_recipes.client.convert import EnqueueTxn

        async with client.lease(10) as lease:
            txn = EnqueueTxn(client, f"{prefix}/q/{lease.id:x}", b"", lease.id, f"{prefix}/q/")
            created, revision, mine, predecessor = await txn.enqueue()
            assert created and mine == revision and predecessor is None
    """

    __slots__ = ()

    def __init__(
        self, client: ClientBase, key: str, value: bytes, lease: int, prefix: str, newest: int = 2
    ) -> None:
        read = Op.get(
            prefix,
            prefix=True,
            limit=newest,
            sort_target=SortTarget.CREATE,
            sort_order=SortOrder.DESCEND,
            keys_only=True,
        )
        super().__init__(
            client,
            [Cmp.create_revision(key) == 0],
            [Op.put(key, value, lease=lease), read],
            [Op.get(key, keys_only=True)],
        )

    async def enqueue(self, *, settle: bool = True) -> tuple[bool, int, int, KeyValue | None]:
        """``(created, revision, mine, predecessor)``: whether the key was created by this
        call, the transaction's revision, the key's create revision, and -- when it was
        created -- the newest key under the prefix created before it (else ``None``; a key
        that existed already must look for its place with a read of its own). Settled
        (see :meth:`PreparedTxn.run`) unless ``settle=False``."""
        # PreparedTxn._send, inlined: one coroutine frame less on the locks' hottest path.
        deferred: list[BaseException] | None = [] if settle else None
        try:
            resp = await self._client._call(
                "txn", "Txn", pb.KVStub, self.request, retry=False, settle=deferred
            )
        except BaseException:
            if deferred:
                raise deferred[0] from None
            raise
        if deferred:
            raise deferred[0]
        revision = int(resp.header.revision)
        if not resp.succeeded:  # the key exists already (a leftover of this lease)
            kvs = resp.responses[0].response_range.kvs
            return False, revision, int(kvs[0].create_revision), None
        for kv in resp.responses[1].response_range.kvs:  # newest first
            if 0 < kv.create_revision < revision:
                return True, revision, revision, self._client._conv.kv(kv)
        return True, revision, revision, None


def writes(ops: Sequence[AnyOp]) -> bool:
    """Whether any operation (nested transactions included) writes."""
    for op in ops:
        if isinstance(op, (PutOp, DeleteOp)):
            return True
        if isinstance(op, TxnOp) and (writes(op.success) or writes(op.failure)):
            return True
    return False


def status(resp: Any) -> Status:
    """A ``StatusResponse`` as a :class:`Status`."""
    return Status(
        version=str(resp.version),
        db_size=int(resp.dbSize),
        leader=int(resp.leader),
        member_id=int(resp.header.member_id),
        raft_index=int(resp.raftIndex),
        raft_term=int(resp.raftTerm),
        revision=int(resp.header.revision),
        errors=[str(e) for e in resp.errors],
        cluster_id=int(resp.header.cluster_id),
        db_size_in_use=int(resp.dbSizeInUse),
        is_learner=bool(resp.isLearner),
    )


def members(resp: Any) -> list[Member]:
    """A ``MemberListResponse`` as :class:`Member` records."""
    return [
        Member(
            id=int(m.ID),
            name=str(m.name),
            peer_urls=list(m.peerURLs),
            client_urls=list(m.clientURLs),
            is_learner=bool(m.isLearner),
        )
        for m in resp.members
    ]
