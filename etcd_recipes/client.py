"""The transport: :func:`connect` and :class:`EtcdClient`.

One ``grpc.aio`` channel per client (stubs from ``aetcd.rpc``), several endpoints with
failover, TLS and mutual TLS, user/password auth with token refresh, an optional key
namespace, keepalive pings so a dead or blackholed peer is noticed in seconds, and one retry
funnel for unary calls. Watches share one multiplexed stream, leases one keep-alive stream.

Example::

    async with connect("127.0.0.1:2379") as client:
        await client.put("/greeting", "hello")
        kv = await client.get("/greeting")
        print(kv.text)

A client belongs to the event loop that opened it and to the process that created it: using it
from another loop, or in a child after ``fork()``, raises
:class:`~etcd_recipes.errors.WrongEventLoopError` / :class:`~etcd_recipes.errors.ForkedProcessError`
instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import grpc
from aetcd import rpc as pb

from . import _proto_election as election_pb
from ._core.endpoints import ChannelSpec, build_channel
from ._core.keys import key_bytes, prefix_range_end
from ._core.lease import (
    AcquisitionLease,
    EstablishHook,
    LeaseKeeper,
    SelfHealingLease,
    validate_ttl,
)
from ._core.rpc import AuthManager, RpcRunner, await_call, await_stream_op, map_grpc_error
from ._core.txn import AnyOp, Cmp, Compare, DeleteOp, GetOp, Op, PutOp, TxnOp
from ._core.validate import check_lease_id, check_timeout
from ._core.waiting import abort_guard
from ._core.watch import ResyncHook, Watch, WatchHub
from ._proto import v3lock
from .codecs import Codec, to_bytes
from .errors import (
    ClientClosedError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdServerError,
    EtcdTimeoutError,
    ForkedProcessError,
    InvalidArgumentError,
    LockTimeoutError,
    TlsHandshakeError,
    WrongEventLoopError,
)
from .resilience import LeaseResilience, ResilienceConfig, RpcResilience, WatchResilience
from .types import (
    DeleteResult,
    ElectionLeaderKey,
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
)

__all__ = ["EtcdClient", "connect"]

log = logging.getLogger("etcd_recipes.client")

_UNSET: Any = ...
_CMP_OPERAND = ("version", "create_revision", "mod_revision", "value", "lease")  # by CmpTarget


class EtcdClient:
    """An async etcd v3 client. Create it with :func:`connect` and use it as ``async with``.

    Keys accept ``str`` (UTF-8) or ``bytes``; values too. Results are small dataclasses from
    :mod:`etcd_recipes.types`. Every unary call takes ``timeout=`` (seconds per attempt,
    overriding the resilience config).

    Example::

        async with connect(["10.0.0.1:2379", "10.0.0.2:2379"], namespace="/app") as client:
            rev = (await client.put("/k", b"v")).revision
            async with client.watch("/k", start_revision=rev + 1) as watch:
                ...
    """

    def __init__(
        self,
        spec: ChannelSpec,
        *,
        user: str | None,
        password: str | None,
        namespace: bytes,
        resilience: ResilienceConfig,
        connect_timeout: float,
    ) -> None:
        self._spec = spec
        self._resilience = resilience
        self._namespace = namespace
        self._connect_timeout = connect_timeout
        self._auth = AuthManager(user, password or "") if user is not None else None
        self._runner = RpcRunner(resilience.rpc, resilience.metrics, self._auth, spec.description)
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._state = "new"
        self._watches: WatchHub | None = None
        self._lease_keeper: LeaseKeeper | None = None
        self._stubs: dict[Any, Any] = {}  # one stub per service for the channel's lifetime

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoints(self) -> str:
        """The configured endpoints, comma-separated."""
        return self._spec.description

    @property
    def namespace(self) -> bytes:
        """The key prefix applied to every key (``b""`` for none)."""
        return self._namespace

    @property
    def resilience(self) -> ResilienceConfig:
        """The resilience settings of this client."""
        return self._resilience

    @property
    def is_open(self) -> bool:
        """Whether the client is open (between :meth:`open` and :meth:`aclose`)."""
        return self._state == "open"

    async def open(self) -> EtcdClient:
        """Open the channel, authenticate if configured, and check that a server answers.

        Raises :class:`~etcd_recipes.errors.EtcdConnectionError` (or a subclass) when no
        endpoint answers within ``connect_timeout``.
        """
        if self._state == "open":
            return self
        if self._state == "closed":
            raise ClientClosedError("this client was closed; create a new one with connect()")
        self._loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        self._channel = build_channel(self._spec)
        if self._auth is not None:
            self._auth.bind(self._channel)
        self._state = "open"
        self._watches = WatchHub(self)
        self._lease_keeper = LeaseKeeper(self)
        try:
            await self._verify()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def _verify(self) -> None:
        # Deadlines are gRPC's own: grpc.aio turns an outer cancel scope's cancellation into
        # a fresh CancelledError that anyio would not recognise as its timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        last: EtcdRecipeError | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EtcdConnectionError(
                    f"no etcd endpoint answered within {self._connect_timeout}s: "
                    f"[{self.endpoints}]" + (f"; last error: {last}" if last else "")
                ) from last
            try:
                if self._auth is not None:
                    await self._auth.refresh(timeout=remaining)
                await await_call(
                    pb.MaintenanceStub(self._channel).Status(
                        pb.StatusRequest(), timeout=remaining, metadata=self._runner.metadata()
                    )
                )
                return
            except grpc.aio.AioRpcError as exc:
                mapped = map_grpc_error(exc, op="connect", endpoints=self.endpoints)
                retriable = isinstance(mapped, (EtcdConnectionError, EtcdTimeoutError))
                if not retriable or isinstance(mapped, TlsHandshakeError):
                    raise mapped from None
                last = mapped
                await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))

    async def aclose(self) -> None:
        """Stop watches and keep-alives and close the channel; idempotent.

        Leases are not revoked here: recipes revoke their own; a bare lease dies at its TTL.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        with anyio.CancelScope(shield=True):
            if self._watches is not None:
                await self._watches.aclose()
            if self._lease_keeper is not None:
                await self._lease_keeper.aclose()
            if self._channel is not None:
                with contextlib.suppress(Exception):
                    await self._channel.close()

    async def __aenter__(self) -> EtcdClient:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _check(self) -> None:
        if self._state != "open":
            raise ClientClosedError(
                "the client is not open: use 'async with connect(...)' or 'await client.open()'"
                if self._state == "new"
                else "the client was closed"
            )
        if os.getpid() != self._pid:
            raise ForkedProcessError(
                "this client was created in another process (before fork()); gRPC channels "
                "cannot cross fork: create a new client in the child"
            )
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise WrongEventLoopError(
                "EtcdClient methods must be awaited in its event loop"
            ) from None
        if loop is not self._loop:
            raise WrongEventLoopError(
                "this client belongs to another event loop; create one client per loop "
                "(or use etcd_recipes.sync from threads)"
            )

    def _channel_or_raise(self) -> Any:
        self._check()
        return self._channel

    @property
    def _leases(self) -> LeaseKeeper:
        self._check()
        assert self._lease_keeper is not None
        return self._lease_keeper

    @property
    def _watch_hub(self) -> WatchHub:
        self._check()
        assert self._watches is not None
        return self._watches

    # ------------------------------------------------------------------ namespacing

    def _k(self, key: bytes | str) -> bytes:
        return self._namespace + key_bytes(key)

    def _end(self, key: bytes, prefix: bool, range_end: bytes | str | None) -> bytes:
        """The namespaced ``range_end`` for a prefix/range request (``key`` already namespaced)."""
        if prefix:
            if range_end is not None:
                raise InvalidArgumentError("give either prefix=True or range_end=, not both")
            return prefix_range_end(key)
        if range_end is None:
            return b""
        end = key_bytes(range_end, allow_empty=True)
        if end == b"\x00":  # "every key from key on": stay inside the namespace
            return prefix_range_end(self._namespace) if self._namespace else end
        return self._namespace + end

    def _strip(self, key: bytes) -> bytes:
        if self._namespace and key.startswith(self._namespace):
            return key[len(self._namespace) :]
        return key

    def _kv(self, pb_kv: Any) -> KeyValue:
        kv = KeyValue._from_pb(pb_kv)
        if not self._namespace:
            return kv
        return KeyValue(
            self._strip(kv.key), kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease
        )

    # ------------------------------------------------------------------ calls

    def _call(
        self,
        op: str,
        method: str,
        stub_cls: Any,
        request: Any,
        *,
        retry: bool = True,
        timeout: float | None = _UNSET,
        resilience: RpcResilience | None = None,
        detached: bool = False,
    ) -> Coroutine[Any, Any, Any]:
        # A plain function returning the funnel's coroutine: one frame less per call.
        channel = self._channel_or_raise()
        stub = self._stubs.get(stub_cls)
        if stub is None:
            stub = self._stubs[stub_cls] = stub_cls(channel)
        fn = getattr(stub, method)
        return self._runner.call(
            op, fn, request, retry=retry, timeout=timeout, resilience=resilience, detached=detached
        )

    # ------------------------------------------------------------------ KV

    def _range_request(
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
    ) -> Any:
        if limit < 0 or revision < 0 or max_create_revision < 0:
            raise InvalidArgumentError("limit, revision and max_create_revision must be >= 0")
        k = self._k(key)
        return pb.RangeRequest(
            key=k,
            range_end=self._end(k, prefix, range_end),
            limit=limit,
            revision=revision,
            sort_target=int(sort_target),
            sort_order=int(sort_order),
            keys_only=keys_only,
            count_only=count_only,
            serializable=serializable,
            max_create_revision=max_create_revision,
        )

    def _range_result(self, resp: Any) -> RangeResult:
        return RangeResult(
            kvs=[self._kv(kv) for kv in resp.kvs],
            count=int(resp.count),
            more=bool(resp.more),
            revision=int(resp.header.revision),
        )

    async def get(
        self,
        key: bytes | str,
        *,
        revision: int = 0,
        serializable: bool = False,
        timeout: float | None = _UNSET,
    ) -> KeyValue | None:
        """Read one key; ``None`` when it does not exist.

        Example::

            kv = await client.get("/config/mode")
        """
        req = self._range_request(key, revision=revision, serializable=serializable)
        resp = await self._call("get", "Range", pb.KVStub, req, timeout=timeout)
        return self._kv(resp.kvs[0]) if resp.kvs else None

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
        timeout: float | None = _UNSET,
    ) -> RangeResult:
        """Read a key, a prefix (``prefix=True``) or the range ``[key, range_end)``.

        ``max_create_revision`` keeps only keys created at or before that revision (``0``: no
        filter). Always one plain ``Range`` RPC, never a read-only transaction (etcd 3.5.0 and
        3.5.1 panic when a read-only ``Txn`` is cancelled in flight).

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
        """
        req = self._range_request(
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
        )
        resp = await self._call("range", "Range", pb.KVStub, req, timeout=timeout)
        return self._range_result(resp)

    async def get_prefix(
        self, prefix: bytes | str, *, timeout: float | None = _UNSET, **kwargs: Any
    ) -> RangeResult:
        """Shorthand for ``range(prefix, prefix=True, ...)``."""
        return await self.range(prefix, prefix=True, timeout=timeout, **kwargs)

    async def count(self, prefix: bytes | str, *, timeout: float | None = _UNSET) -> int:
        """How many keys start with ``prefix`` (one count-only RPC)."""
        return (await self.range(prefix, prefix=True, count_only=True, timeout=timeout)).count

    async def put(
        self,
        key: bytes | str,
        value: bytes | str,
        *,
        lease: int = 0,
        prev_kv: bool = False,
        timeout: float | None = _UNSET,
    ) -> PutResult:
        """Write ``value`` at ``key`` (optionally attached to ``lease``).

        Example::

            rev = (await client.put("/k", "v")).revision
        """
        req = pb.PutRequest(key=self._k(key), value=to_bytes(value), lease=lease, prev_kv=prev_kv)
        resp = await self._call("put", "Put", pb.KVStub, req, timeout=timeout)
        prev = self._kv(resp.prev_kv) if resp.HasField("prev_kv") else None
        return PutResult(revision=int(resp.header.revision), prev_kv=prev)

    async def delete(
        self,
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        prev_kv: bool = False,
        timeout: float | None = _UNSET,
    ) -> DeleteResult:
        """Delete a key, a prefix (``prefix=True``) or the range ``[key, range_end)``.

        Example::

            n = (await client.delete("/jobs/", prefix=True)).deleted
        """
        k = self._k(key)
        req = pb.DeleteRangeRequest(
            key=k, range_end=self._end(k, prefix, range_end), prev_kv=prev_kv
        )
        resp = await self._call("delete", "DeleteRange", pb.KVStub, req, timeout=timeout)
        return self._delete_result(resp)

    def _delete_result(self, resp: Any) -> DeleteResult:
        return DeleteResult(
            deleted=int(resp.deleted),
            revision=int(resp.header.revision),
            prev_kvs=[self._kv(kv) for kv in resp.prev_kvs],
        )

    # ------------------------------------------------------------------ transactions

    def _compare_pb(self, c: Compare) -> Any:
        # Builders already validated their keys: only the namespace is added here.
        k = self._namespace + c.key
        operand = {_CMP_OPERAND[c.target]: c.operand}
        end = self._end(k, c.prefix, c.range_end) if c.prefix or c.range_end else b""
        return pb.Compare(key=k, target=c.target, result=c.result, range_end=end, **operand)

    def _op_pb(self, op: AnyOp) -> Any:
        if isinstance(op, PutOp):
            return pb.RequestOp(
                request_put=pb.PutRequest(
                    key=self._namespace + op.key, value=op.value, lease=op.lease, prev_kv=op.prev_kv
                )
            )
        if isinstance(op, DeleteOp):
            k = self._namespace + op.key
            end = self._end(k, op.prefix, op.range_end) if op.prefix or op.range_end else b""
            return pb.RequestOp(
                request_delete_range=pb.DeleteRangeRequest(key=k, range_end=end, prev_kv=op.prev_kv)
            )
        if isinstance(op, GetOp):
            return pb.RequestOp(
                request_range=self._range_request(
                    op.key,
                    prefix=op.prefix,
                    range_end=op.range_end,
                    limit=op.limit,
                    sort_target=op.sort_target,
                    sort_order=op.sort_order,
                    keys_only=op.keys_only,
                    count_only=op.count_only,
                )
            )
        if isinstance(op, TxnOp):
            return pb.RequestOp(request_txn=self._txn_pb(op.compare, op.success, op.failure))
        raise InvalidArgumentError(f"not a transaction operation: {op!r} (use Op.put/get/delete)")

    def _txn_pb(
        self, compare: Sequence[Compare], success: Sequence[AnyOp], failure: Sequence[AnyOp]
    ) -> Any:
        for c in compare:
            if not isinstance(c, Compare):
                raise InvalidArgumentError(f"not a compare: {c!r} (build one with Cmp)")
        return pb.TxnRequest(
            compare=[self._compare_pb(c) for c in compare],
            success=[self._op_pb(o) for o in success],
            failure=[self._op_pb(o) for o in failure],
        )

    def _txn_result(self, resp: Any) -> TxnResult:
        out: list[Any] = []
        for r in resp.responses:
            which = r.WhichOneof("response")
            if which == "response_range":
                out.append(self._range_result(r.response_range))
            elif which == "response_put":
                p = r.response_put
                prev = self._kv(p.prev_kv) if p.HasField("prev_kv") else None
                out.append(PutResult(int(p.header.revision), prev))
            elif which == "response_delete_range":
                out.append(self._delete_result(r.response_delete_range))
            else:
                out.append(self._txn_result(r.response_txn))
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), out)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[AnyOp] = (),
        failure: Sequence[AnyOp] = (),
        *,
        timeout: float | None = _UNSET,
    ) -> TxnResult:
        """Run a transaction: if every compare holds, the ``success`` ops, else ``failure``.

        Never retried (a timed-out commit may have landed): the caller decides.

        Example::

            r = await client.txn([Cmp.missing("/leader")], [Op.put("/leader", b"me")])
            print("won" if r.succeeded else "lost")
        """
        req = self._txn_pb(compare, success, failure)
        # etcd 3.5.0-3.5.2 panic when a *read-only* transaction is cancelled server-side:
        # those are never cancelled there (see RpcRunner.call). Writes are applied through
        # raft without the request's context, so they keep the normal, cancellable path.
        detached = not _writes(success) and not _writes(failure)
        resp = await self._call(
            "txn", "Txn", pb.KVStub, req, retry=False, timeout=timeout, detached=detached
        )
        return self._txn_result(resp)

    async def compact(
        self, revision: int, *, physical: bool = False, timeout: float | None = _UNSET
    ) -> None:
        """Discard history older than ``revision`` (watches below it get a compaction error)."""
        req = pb.CompactionRequest(revision=revision, physical=physical)
        await self._call("compact", "Compact", pb.KVStub, req, timeout=timeout)

    # ------------------------------------------------------------------ lock service

    def _service_call(
        self,
        op: str,
        factory: Callable[[Any], Any],
        request: Any,
        *,
        retry: bool = True,
        timeout: float | None = _UNSET,
    ) -> Coroutine[Any, Any, Any]:
        """A unary call of a vendored service (``_proto``) through the funnel; ``factory``
        makes the multicallable from the channel, once per client."""
        channel = self._channel_or_raise()
        fn = self._stubs.get(factory)
        if fn is None:
            fn = self._stubs[factory] = factory(channel)
        return self._runner.call(op, fn, request, retry=retry, timeout=timeout)

    async def lock(
        self, name: bytes | str, lease_id: int, *, timeout: float | None = None
    ) -> bytes:
        """Acquire ``name`` through etcd's own lock service (the v3lock ``Lock`` RPC).

        The server queues ``<name>/<lease id in hex>`` and answers once it owns the lock; the
        key returned lives while the lease does. Keep ``lease_id`` alive yourself (for example
        with :meth:`lease`) and give the key to :meth:`unlock`. Never retried. On timeout (or
        cancellation) the waiter key is removed; a timeout raises
        :class:`~etcd_recipes.errors.LockTimeoutError`.

        Prefer :class:`~etcd_recipes.DistributedMutex` (same key layout): the server-side wait
        hands a contended lock over at most about every 100 ms, and loss is not reported.

        Example::

            async with client.lease(10) as lease:
                key = await client.lock(prefix + "/job", lease.id, timeout=5)
                try:
                    assert (await client.get(key)) is not None
                finally:
                    await client.unlock(key)
        """
        check_lease_id(lease_id, what="server_lock()")
        timeout = check_timeout(timeout)
        name_bytes = key_bytes(name)
        key = name_bytes + b"/" + f"{lease_id:x}".encode()
        request = v3lock.LockRequest(name=self._k(name_bytes), lease=lease_id)

        async def cleanup() -> None:  # the lock may have been granted in the last instant
            await self.delete(key)

        async with abort_guard(cleanup, what=f"server_lock({name_bytes!r}): removing the waiter"):
            response: Any = None
            with anyio.move_on_after(timeout):
                # No gRPC deadline: the wait is bounded here, and the waiter key removed.
                response = await self._service_call(
                    "lock", v3lock.lock_method, request, retry=False, timeout=None
                )
            if response is None:
                raise LockTimeoutError(
                    f"server_lock({name_bytes!r}): not acquired within {timeout}s"
                )
        return self._strip(bytes(response.key))

    async def unlock(self, key: bytes | str) -> None:
        """Release a lock taken with :meth:`lock` (the v3lock ``Unlock`` RPC: it deletes
        ``key``). Idempotent.

        Example::

            async with client.lease(10) as lease:
                key = await client.lock(prefix + "/job", lease.id)
                await client.unlock(key)
                await client.unlock(key)  # already released: nothing happens
                assert (await client.get(key)) is None
        """
        request = v3lock.UnlockRequest(key=self._k(key_bytes(key)))
        await self._service_call("unlock", v3lock.unlock_method, request)

    # ------------------------------------------------------------------ election service

    def _leader_key_pb(self, leader: ElectionLeaderKey) -> Any:
        return election_pb.MESSAGES["LeaderKey"](
            name=self._k(leader.name),
            key=self._k(leader.key),
            rev=leader.revision,
            lease=leader.lease,
        )

    def _election_call(
        self, rpc: str, request: Any, *, retry: bool = True, timeout: float | None = _UNSET
    ) -> Coroutine[Any, Any, Any]:
        factory = _ELECTION_METHODS[rpc]
        return self._service_call(
            _ELECTION_OPS[rpc], factory, request, retry=retry, timeout=timeout
        )

    async def election_campaign(
        self,
        name: bytes | str,
        value: bytes | str,
        *,
        lease: int,
        timeout: float | None = None,
    ) -> ElectionLeaderKey:
        """Campaign in etcd's election service (``etcdctl elect``, Go's
        ``concurrency.Election``): blocks until this campaign leads ``name``, with ``value``
        proclaimed.

        ``lease`` must be a live lease you keep alive (:meth:`lease`); leadership ends when it
        does. ``timeout`` bounds the wait (:class:`~etcd_recipes.errors.EtcdTimeoutError`).
        Never retried. Cancelled or timed out, the campaign's key ``<name>/<lease hex>`` is
        deleted. Prefer :class:`~etcd_recipes.LeaderSelector` /
        :class:`~etcd_recipes.LeaderLatch`, which manage leases, loss and fencing.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix + "/jobs", "node-1",
                                                        lease=lease.id, timeout=5)
                assert leader.key == f"{prefix}/jobs/{lease.id:x}".encode()
                await client.election_resign(leader)
        """
        check_lease_id(lease, what="election_campaign()")
        timeout = check_timeout(timeout)
        raw_name = key_bytes(name)
        own_key = raw_name + b"/" + f"{lease:x}".encode()
        request = election_pb.MESSAGES["CampaignRequest"](
            name=self._k(raw_name), lease=lease, value=to_bytes(value)
        )

        async def withdraw() -> None:
            await self.txn([Cmp.lease(own_key) == lease], [Op.delete(own_key)])

        async with abort_guard(withdraw, what=f"election_campaign({raw_name!r}): withdraw"):
            try:
                resp = await self._election_call(
                    "Campaign",
                    request,
                    retry=False,
                    timeout=None if timeout == math.inf else timeout,
                )
            except EtcdServerError as exc:
                if "deadline exceeded" in exc.details.lower():
                    raise EtcdTimeoutError(
                        f"election_campaign({raw_name!r}): not elected within {timeout}s"
                    ) from exc
                raise
        leader = resp.leader
        return ElectionLeaderKey(
            self._strip(bytes(leader.name)),
            self._strip(bytes(leader.key)),
            int(leader.rev),
            int(leader.lease),
        )

    async def election_proclaim(self, leader: ElectionLeaderKey, value: bytes | str) -> None:
        """Publish a new ``value`` for a leadership won with :meth:`election_campaign`.

        Raises :class:`~etcd_recipes.errors.NotLeaderError` if that leadership is over.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                await client.election_proclaim(leader, "node-1 (draining)")
                assert (await client.election_leader(prefix)).text == "node-1 (draining)"
                await client.election_resign(leader)
        """
        request = election_pb.MESSAGES["ProclaimRequest"](
            leader=self._leader_key_pb(leader), value=to_bytes(value)
        )
        await self._election_call("Proclaim", request)

    async def election_leader(self, name: bytes | str) -> KeyValue | None:
        """The current leader's key and proclaimed value for ``name``, or ``None`` without one.

        Example::

            assert await client.election_leader(prefix) is None
            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                kv = await client.election_leader(prefix)
                assert kv is not None and kv.key == leader.key and kv.text == "node-1"
                await client.election_resign(leader)
        """
        request = election_pb.MESSAGES["LeaderRequest"](name=self._k(key_bytes(name)))
        try:
            resp = await self._election_call("Leader", request)
        except EtcdServerError as exc:
            if "election: no leader" in exc.details:
                return None
            raise
        return self._kv(resp.kv)

    async def election_observe(self, name: bytes | str) -> AsyncIterator[KeyValue]:
        """The leader of ``name`` (when there is one) and every later proclamation or new
        leader.

        etcd's ``Observe`` never reports that an election became vacant -- use
        :class:`~etcd_recipes.LeaderObserver` for that. The stream is cancelled when the
        iteration stops (close the iterator, e.g. with ``contextlib.aclosing``, to stop early).

        Example::

            import contextlib

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "v1", lease=lease.id)
                async with contextlib.aclosing(client.election_observe(prefix)) as seen:
                    async for kv in seen:
                        if kv.text == "v1":
                            await client.election_proclaim(leader, "v2")
                        else:
                            assert kv.text == "v2"
                            break
                await client.election_resign(leader)
        """
        request = election_pb.MESSAGES["LeaderRequest"](name=self._k(key_bytes(name)))
        call = election_pb.stream_method(self._channel_or_raise(), "Observe")(
            request, metadata=self._runner.metadata()
        )
        try:
            while True:
                try:
                    msg = await await_stream_op(call.read(), call)
                except grpc.aio.AioRpcError as exc:
                    raise map_grpc_error(
                        exc, op="election_observe", endpoints=self.endpoints
                    ) from None
                if msg is grpc.aio.EOF:
                    return
                yield self._kv(msg.kv)
        finally:
            call.cancel()

    async def election_resign(self, leader: ElectionLeaderKey) -> None:
        """Give up a leadership won with :meth:`election_campaign` (deletes its key; the next
        campaigner, if any, is elected). Resigning an ended leadership is a no-op.

        Example::

            async with client.lease(10) as lease:
                leader = await client.election_campaign(prefix, "node-1", lease=lease.id)
                await client.election_resign(leader)
                await client.election_resign(leader)  # over already: nothing happens
                assert await client.election_leader(prefix) is None
        """
        request = election_pb.MESSAGES["ResignRequest"](leader=self._leader_key_pb(leader))
        await self._election_call("Resign", request)

    # ------------------------------------------------------------------ typed helpers

    async def get_value(self, key: bytes | str, codec: Codec[Any], *, default: Any = None) -> Any:
        """Read ``key`` and decode it with ``codec``; ``default`` when absent.

        A decode failure raises :class:`~etcd_recipes.errors.CodecError`.

        Example::

            n = await client.get_value("/counters/x", INT64, default=0)
        """
        kv = await self.get(key)
        return default if kv is None else codec.decode(kv.value)

    async def put_value(
        self, key: bytes | str, value: Any, codec: Codec[Any], *, lease: int = 0
    ) -> PutResult:
        """Encode ``value`` with ``codec`` and write it at ``key``.

        Example::

            await client.put_value("/config", {"mode": "on"}, JSON)
        """
        return await self.put(key, codec.encode(value), lease=lease)

    # ------------------------------------------------------------------ cluster

    async def status(self, *, timeout: float | None = _UNSET) -> Status:
        """The status of the member that answers (version, leader, revision, ...)."""
        resp = await self._call(
            "status", "Status", pb.MaintenanceStub, pb.StatusRequest(), timeout=timeout
        )
        return Status(
            version=str(resp.version),
            db_size=int(resp.dbSize),
            leader=int(resp.leader),
            member_id=int(resp.header.member_id),
            raft_index=int(resp.raftIndex),
            raft_term=int(resp.raftTerm),
            revision=int(resp.header.revision),
            errors=[str(e) for e in resp.errors],
        )

    async def member_list(self, *, timeout: float | None = _UNSET) -> list[Member]:
        """The members of the cluster."""
        resp = await self._call(
            "member_list", "MemberList", pb.ClusterStub, pb.MemberListRequest(), timeout=timeout
        )
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

    async def ping(self) -> bool:
        """True if a count-only read of ``health-check-probe`` succeeds (never raises)."""
        try:
            await self.range("health-check-probe", count_only=True)
        except EtcdRecipeError:
            return False
        return True

    # ------------------------------------------------------------------ leases

    async def lease_grant(self, ttl: float, *, timeout: float | None = _UNSET) -> LeaseGrant:
        """Grant a lease of ``ttl`` whole seconds (the server may grant more).

        Prefer :meth:`lease` (kept alive, revoked on exit) for anything but one-off keys.
        """
        req = pb.LeaseGrantRequest(TTL=validate_ttl(ttl))
        resp = await self._call("lease_grant", "LeaseGrant", pb.LeaseStub, req, timeout=timeout)
        return LeaseGrant(id=int(resp.ID), ttl=int(resp.TTL))

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = _UNSET) -> bool:
        """Revoke a lease, deleting its keys. Best-effort: False (logged) instead of raising."""
        try:
            await self._call(
                "lease_revoke",
                "LeaseRevoke",
                pb.LeaseStub,
                pb.LeaseRevokeRequest(ID=lease_id),
                retry=False,
                timeout=timeout,
            )
            return True
        except EtcdRecipeError as exc:
            log.info("revoking lease %x failed (it will expire at its TTL): %s", lease_id, exc)
            return False

    async def lease_time_to_live(
        self, lease_id: int, *, keys: bool = False, timeout: float | None = _UNSET
    ) -> LeaseInfo:
        """A lease's remaining TTL (``-1`` when it does not exist) and, optionally, its keys."""
        req = pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys)
        resp = await self._call(
            "lease_time_to_live", "LeaseTimeToLive", pb.LeaseStub, req, timeout=timeout
        )
        return LeaseInfo(
            id=int(resp.ID),
            ttl=int(resp.TTL),
            granted_ttl=int(resp.grantedTTL),
            keys=[self._strip(bytes(k)) for k in resp.keys],
        )

    async def lease_keep_alive_once(self, lease_id: int) -> int:
        """Renew a lease once on the shared stream's schedule-free path; returns the new TTL
        (``0`` when the lease no longer exists)."""
        stub = pb.LeaseStub(self._channel_or_raise())
        call = stub.LeaseKeepAlive(metadata=self._runner.metadata())

        async def exchange() -> Any:
            await call.write(pb.LeaseKeepAliveRequest(ID=lease_id))
            return await call.read()

        try:
            msg = await await_stream_op(exchange(), call)
        except grpc.aio.AioRpcError as exc:
            raise map_grpc_error(exc, op="lease_keep_alive", endpoints=self.endpoints) from None
        finally:
            call.cancel()
        return 0 if msg is grpc.aio.EOF else int(msg.TTL)

    def lease(self, ttl: float) -> AcquisitionLease:
        """A lease kept alive in the background, revoked on exit, **never re-granted**.

        Example::

            async with client.lease(5) as lease:
                await client.put("/presence/me", b"1", lease=lease.id)
                await lease.wait_lost()  # returns only if the lease is lost
        """
        return AcquisitionLease(self, ttl)

    def self_healing_lease(
        self, ttl: float, establish: EstablishHook, *, resilience: LeaseResilience | None = None
    ) -> SelfHealingLease:
        """A presence lease that is re-granted after loss, re-running ``establish``.

        See :class:`~etcd_recipes._core.lease.SelfHealingLease`.
        """
        return SelfHealingLease(self, ttl, establish, resilience=resilience)

    # ------------------------------------------------------------------ watches

    def watch(
        self,
        key: bytes | str,
        *,
        prefix: bool = False,
        range_end: bytes | str | None = None,
        start_revision: int = 0,
        prev_kv: bool = False,
        no_put: bool = False,
        no_delete: bool = False,
        resync: ResyncHook | None = None,
        resilience: WatchResilience | None = None,
    ) -> Watch:
        """Watch a key, a prefix or a range; use as ``async with`` and iterate.

        ``start_revision`` replays history from that revision (``0``: from now). Anchor at a
        read's ``revision + 1`` to miss nothing between the read and the watch. ``resync`` is
        called when the needed history was compacted: re-read the state and return the
        revision to continue from; without it, a compaction raises
        :class:`~etcd_recipes.errors.CompactedError`.

        Example::

            async with client.watch("/jobs/", prefix=True) as watch:
                async for item in watch:
                    print(item)
        """
        if start_revision < 0:
            raise InvalidArgumentError("start_revision must be >= 0")
        display = key_bytes(key)
        k = self._k(key)
        return Watch(
            self._watch_hub,
            k,
            self._end(k, prefix, range_end) or None,
            start_revision=start_revision,
            prev_kv=prev_kv,
            no_put=no_put,
            no_delete=no_delete,
            resync=resync,
            resilience=resilience or self._resilience.watch,
            display_key=display,
        )

    def request_progress(self) -> None:
        """Ask the server for a progress notification on the watch stream."""
        self._watch_hub.request_progress()


_ELECTION_METHODS: dict[str, Callable[[Any], Any]] = {
    rpc: functools.partial(election_pb.method, rpc=rpc)
    for rpc in ("Campaign", "Proclaim", "Leader", "Resign")
}
_ELECTION_OPS = {rpc: f"election_{rpc.lower()}" for rpc in _ELECTION_METHODS}


def _writes(ops: Sequence[AnyOp]) -> bool:
    """Whether any operation (nested transactions included) writes."""
    for op in ops:
        if isinstance(op, (PutOp, DeleteOp)):
            return True
        if isinstance(op, TxnOp) and (_writes(op.success) or _writes(op.failure)):
            return True
    return False


def connect(
    endpoints: str | Sequence[str] | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    ca_cert: str | bytes | Path | None = None,
    cert: str | bytes | Path | None = None,
    key: str | bytes | Path | None = None,
    namespace: str | bytes | None = None,
    resilience: ResilienceConfig | None = None,
    connect_timeout: float = 5.0,
    keepalive_time: float = 5.0,
    keepalive_timeout: float = 2.0,
) -> EtcdClient:
    """Configure a client (no I/O); ``async with`` (or ``await client.open()``) connects.

    :param endpoints: ``"host:port"``, ``"http://host:port"``, ``"https://host:port"``, a list
        of those, or a comma-separated string; ``None`` reads ``$ETCD_ENDPOINTS``.
        ``https://`` (or ``ca_cert=``) turns TLS on.
    :param user: user name for etcd auth (``password`` with it); tokens are refreshed on expiry.
    :param ca_cert: CA bundle (path or PEM) to verify servers; ``cert``/``key`` add a client
        certificate (mutual TLS).
    :param namespace: a prefix transparently added to every key and removed from results.
    :param resilience: retry, watch-recovery and lease-healing settings, plus metrics.
    :param connect_timeout: seconds to wait for a first answer on ``open()``.
    :param keepalive_time: seconds between gRPC keepalive pings. etcd rejects pings more
        frequent than its ``--grpc-keepalive-min-time`` (5 s by default) with ``too_many_pings``.
    :param keepalive_timeout: seconds to wait for a ping ack before declaring the peer dead.

    Example::

        async with connect("https://etcd.example:2379", ca_cert="ca.pem",
                           user="app", password=secret) as client:
            ...
    """
    if (user is None) != (password is None):
        raise InvalidArgumentError("give both user= and password=, or neither")
    if not connect_timeout > 0:
        raise InvalidArgumentError("connect_timeout must be > 0")
    spec = ChannelSpec.create(
        endpoints,
        ca_cert=ca_cert,
        cert=cert,
        key=key,
        keepalive_time=keepalive_time,
        keepalive_timeout=keepalive_timeout,
    )
    ns = b"" if namespace is None else key_bytes(namespace, allow_empty=True)
    return EtcdClient(
        spec,
        user=user,
        password=password,
        namespace=ns,
        resilience=resilience or ResilienceConfig(),
        connect_timeout=connect_timeout,
    )
