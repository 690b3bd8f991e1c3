"""The transport: :func:`connect` and :class:`EtcdClient`.

One ``grpc.aio`` channel per client (stubs from ``aetcd.rpc``), several endpoints with
failover, TLS and mutual TLS, user/password auth with token refresh, an optional key
namespace, keepalive pings so a dead or blackholed peer is noticed in seconds, and one retry
funnel for unary calls. Watches share one multiplexed stream, leases one keep-alive stream.

Example::

    from etcd_recipes import connect

    async with connect(endpoints) as client:
        await client.put(prefix + "/greeting", "hello")
        kv = await client.get(prefix + "/greeting")
        assert kv is not None and kv.text == "hello"

A client belongs to the event loop that opened it and to the process that created it: using it
from another loop, or in a child after ``fork()``, raises
:class:`~etcd_recipes.errors.WrongEventLoopError` / :class:`~etcd_recipes.errors.ForkedProcessError`
instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from aetcd import rpc as pb

from ._core import validate
from ._core.blocking import BlockingRunner
from ._core.connectivity import ChannelState, ConnectionStateCalls
from ._core.convert import Convert
from ._core.convert import members as members_result
from ._core.convert import status as status_result
from ._core.endpoints import ChannelSpec, build_channel
from ._core.keys import key_bytes
from ._core.kv import KVPlans
from ._core.lease import LeaseKeeper
from ._core.lifecycle import close_lease_pools, misuse_error, verify, without_learners
from ._core.logctx import library_logger
from ._core.metering import meter_for
from ._core.rpc import DEFAULT_MAX_REQUEST_BYTES, AuthManager, RpcRunner
from ._core.rpc import UNSET as _UNSET
from ._core.services import ServiceCalls
from ._core.settings import resolve_settings
from ._core.txn import AnyOp, Compare
from ._core.validate import check_count, check_timeout
from ._core.watch import ResyncHook, Watch
from ._core.watch_hub import WatchHub
from ._core.wire import Wire
from .errors import ClientClosedError
from .resilience import ResilienceConfig, RpcResilience, WatchResilience
from .types import (
    DeleteResult,
    KeyValue,
    Member,
    PutResult,
    RangeResult,
    SortOrder,
    SortTarget,
    Status,
    TxnResult,
)

__all__ = ["EtcdClient", "connect"]

log = library_logger("etcd_recipes.client")
_loop = asyncio._get_running_loop  # None outside a loop (get_running_loop raises)

CLOSE_FLUSH_TIMEOUT = 1.0
"""Seconds ``aclose()`` waits at most for the metrics sink to get the events queued so far."""


class EtcdClient(KVPlans, ServiceCalls, ConnectionStateCalls):
    """An async etcd v3 client. Create it with :func:`connect` and use it as ``async with``.

    Keys and values are ``str`` (UTF-8) or ``bytes``; results are small dataclasses from
    :mod:`etcd_recipes.types`. Unary calls take ``timeout=`` (seconds per attempt).

    Example::

        from etcd_recipes import connect

        async with connect(endpoints, namespace=prefix) as app:
            rev = (await app.put("/k", b"v")).revision
            async with app.watch("/k", start_revision=rev) as watch:
                async for event in watch:
                    assert event.kv.key == b"/k" and event.kv.value == b"v"
                    break
        assert (await client.get(prefix + "/k")).value == b"v"  # the namespace is a prefix
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
        max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self._spec = spec
        self._max_request = sys.maxsize if max_request_bytes is None else max_request_bytes
        self._resilience = resilience
        self._namespace = namespace
        self._connect_timeout = connect_timeout
        self._auth = AuthManager(user, password or "") if user is not None else None
        self._runner = RpcRunner(resilience.rpc, resilience.metrics, self._auth, spec.description)
        self._blocking = BlockingRunner(self._runner)  # the sync facade's plain KV calls
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._state = "new"
        self._watches: WatchHub | None = None
        self._lease_keeper: LeaseKeeper | None = None
        self._stubs: dict[Any, Any] = {}  # one stub per service for the channel's lifetime
        self._conn = ChannelState(spec.description)
        # Conversions are Convert's bound methods, stored here: no extra frame per call.
        conv = Convert(namespace)
        self._k = conv.k
        self._strip = conv.strip
        self._kv = conv.kv
        self._range_request = conv.range_request
        self._range_result = conv.range_result
        self._conv = conv

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
        wire = Wire(
            channel=self._channel_or_raise,
            metadata=self._runner.metadata,
            auth=self._auth,
            endpoints=self._spec.description,
            namespace=self._namespace,
            metrics=self._resilience.metrics,
        )
        self._wire = wire
        self._watches = WatchHub(wire)
        self._lease_keeper = LeaseKeeper(wire)
        try:
            await verify(wire, self._connect_timeout, secure=self._spec.secure)
            voting = await without_learners(self)
        except BaseException:
            await self.aclose()
            raise
        if voting is not None:  # the same channel settings, minus the learners
            old, self._channel = self._channel, build_channel(voting)
            self._stubs.clear()
            if self._auth is not None:
                self._auth.bind(self._channel)
            with contextlib.suppress(Exception):
                await old.close()
        self._conn.start(self._channel)
        self._blocking.bind(voting or self._spec, self._loop)
        return self

    async def aclose(self) -> None:
        """Revoke the lock recipes' pooled leases, stop watches and keep-alives, close the
        channel, and wait (up to 1 s) until the metrics sink got every event reported so far;
        idempotent. Other leases are not revoked: a bare one dies at its TTL."""
        if self._state == "closed":
            return
        with anyio.CancelScope(shield=True):
            await close_lease_pools(self)  # before "closed": revoking needs the client
            self._state = "closed"
            self._blocking.close()
            await self._conn.aclose()
            if self._watches is not None:
                await self._watches.aclose()
            if self._lease_keeper is not None:
                await self._lease_keeper.aclose()
            if self._channel is not None:
                with contextlib.suppress(Exception):
                    await self._channel.close()
            # What the recipes reported reaches the sink before aclose() returns (bounded:
            # a stuck sink delays the close by at most CLOSE_FLUSH_TIMEOUT seconds).
            meter = meter_for(self._resilience.metrics)
            await anyio.to_thread.run_sync(meter.flush, CLOSE_FLUSH_TIMEOUT)

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
        if self._state != "open" or os.getpid() != self._pid or _loop() is not self._loop:
            raise misuse_error(self._state, self._pid, self._loop)

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
        settle: list[BaseException] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        # A plain function returning the funnel's coroutine: one frame less per call.
        channel = self._channel_or_raise()
        stub = self._stubs.get(stub_cls)
        if stub is None:
            stub = self._stubs[stub_cls] = stub_cls(channel)
        fn = getattr(stub, method)
        return self._runner.call(
            op,
            fn,
            request,
            retry=retry,
            timeout=timeout,
            resilience=resilience,
            detached=detached,
            settle=settle,
        )

    # ------------------------------------------------------------------ KV
    # Each plain KV call is described once by its ``_unary_<name>`` plan (``_core/kv.py``):
    # awaited here, sent from the caller's own thread by the blocking facade.

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
        timeout: float | None = _UNSET,
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
        self, prefix: bytes | str, *, timeout: float | None = _UNSET, **kwargs: Any
    ) -> RangeResult:
        """Shorthand for ``range(prefix, prefix=True, ...)``."""
        return await self._unary_get_prefix(prefix, timeout=timeout, **kwargs).send()

    async def count(self, prefix: bytes | str, *, timeout: float | None = _UNSET) -> int:
        """How many keys start with ``prefix`` (one count-only RPC)."""
        return await self._unary_count(prefix, timeout=timeout).send()

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
        timeout: float | None = _UNSET,
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
        timeout: float | None = _UNSET,
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

    async def compact(
        self, revision: int, *, physical: bool = False, timeout: float | None = _UNSET
    ) -> None:
        """Discard history older than ``revision`` (watches below it get a compaction error)."""
        req = pb.CompactionRequest(revision=validate.check_revision(revision), physical=physical)
        await self._call("compact", "Compact", pb.KVStub, req, timeout=timeout)

    # ------------------------------------------------------------------ cluster

    async def status(self, *, timeout: float | None = _UNSET) -> Status:
        """The status of the member that answers (version, leader, revision, ...)."""
        resp = await self._call(
            "status", "Status", pb.MaintenanceStub, pb.StatusRequest(), timeout=timeout
        )
        return status_result(resp)

    async def member_list(self, *, timeout: float | None = _UNSET) -> list[Member]:
        """The members of the cluster."""
        resp = await self._call(
            "member_list", "MemberList", pb.ClusterStub, pb.MemberListRequest(), timeout=timeout
        )
        return members_result(resp)

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

        ``start_revision`` replays history from that revision (``0``: from now); anchor at a
        read's ``revision + 1`` to miss nothing in between. ``resync`` is called when the
        needed history was compacted: re-read the state, return the revision to continue
        from; without it a compaction raises :class:`~etcd_recipes.errors.CompactedError`.

        Example::

            rev = (await client.put(prefix + "/jobs/1", b"a")).revision
            async with client.watch(prefix + "/jobs/", prefix=True, start_revision=rev) as watch:
                async for event in watch:
                    assert event.kv.value == b"a"
                    break
        """
        validate.check_revision(start_revision, what="start_revision")
        k = self._k(key)
        return Watch(
            self._watch_hub,
            k,
            self._conv.end(k, prefix, range_end) or None,
            start_revision=start_revision,
            prev_kv=prev_kv,
            no_put=no_put,
            no_delete=no_delete,
            resync=resync,
            resilience=resilience or self._resilience.watch,
            display_key=key_bytes(key),
        )

    def request_progress(self) -> None:
        """Ask the server for a progress notification on the watch stream: every watch known
        to be caught up then yields a :class:`~etcd_recipes.types.WatchProgress` from
        :meth:`Watch.items_and_progress`. Only etcd 3.5.8 or later (3.4.25 on the 3.4 line)
        orders its answer after the events it covers; an older server's answer is ignored
        (trusting it loses events, etcd-io/etcd#15220), so there this has no effect."""
        self._watch_hub.request_progress()


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
    max_request_bytes: int | None = DEFAULT_MAX_REQUEST_BYTES,
) -> EtcdClient:
    """Configure a client (no I/O); ``async with`` (or ``await client.open()``) connects.

    :param endpoints: ``"host:port"``, ``"http://host:port"``, ``"https://host:port"``, a list
        of those, or a comma-separated string. ``https://`` (or ``ca_cert=``) turns TLS on.
        ``None`` reads the environment: ``$ETCD_ENDPOINTS``, else etcdctl's
        ``$ETCDCTL_ENDPOINTS``; then every argument below that is not given comes from
        etcdctl's variables too: ``$ETCDCTL_CACERT``, ``$ETCDCTL_CERT``, ``$ETCDCTL_KEY``, and
        ``$ETCDCTL_USER`` (``user:password``, or ``user`` with ``$ETCDCTL_PASSWORD``).
        Explicit arguments win; explicit endpoints read nothing from the environment.
    :param user: user name for etcd auth (``password`` with it); tokens are refreshed on expiry.
    :param ca_cert: CA bundle (path or PEM) to verify servers; ``cert``/``key`` add a client
        certificate (mutual TLS).
    :param namespace: a prefix transparently added to every key and removed from results.
    :param resilience: retry, watch-recovery and lease-healing settings, plus metrics.
    :param connect_timeout: seconds to wait for a first answer on ``open()``.
    :param keepalive_time: seconds between gRPC keepalive pings. etcd rejects pings more
        frequent than its ``--grpc-keepalive-min-time`` (5 s by default) with ``too_many_pings``.
    :param keepalive_timeout: seconds to wait for a ping ack before declaring the peer dead.
    :param max_request_bytes: the server's ``--max-request-bytes`` (1.5 MiB by default): a put
        or transaction over it is refused before it is sent
        (:class:`~etcd_recipes.errors.ValueTooLargeError`); ``None``: no client-side check.

    Example::

        from etcd_recipes import connect

        async with connect(endpoints, namespace=prefix, connect_timeout=5) as app:
            await app.put("/k", b"v")  # stored at prefix + "/k"
    """
    got = resolve_settings(
        endpoints, ca_cert=ca_cert, cert=cert, key=key, user=user, password=password
    )
    check_timeout(connect_timeout, what="connect_timeout", optional=False)
    if max_request_bytes is not None:
        check_count(max_request_bytes, what="max_request_bytes")
    spec = ChannelSpec.create(
        got.endpoints,
        ca_cert=got.ca_cert,
        cert=got.cert,
        key=got.key,
        keepalive_time=keepalive_time,
        keepalive_timeout=keepalive_timeout,
    )
    ns = b"" if namespace is None else key_bytes(namespace, allow_empty=True)
    return EtcdClient(
        spec,
        user=got.user,
        password=got.password,
        namespace=ns,
        resilience=resilience or ResilienceConfig(),
        connect_timeout=connect_timeout,
        max_request_bytes=max_request_bytes,
    )
