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
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from aetcd import rpc as pb

from .._core import validate
from .._core.keys import key_bytes
from .._core.logctx import library_logger
from .._core.metering import meter_for
from .._core.validate import check_count, check_timeout
from ..errors import ClientClosedError, EtcdRecipeError, InvalidArgumentTypeError, UsageError
from ..resilience import LeaseResilience, ResilienceConfig, WatchResilience
from ..types import Member, Status
from .base import check_client_part
from .connectivity import ConnectionStateCalls
from .convert import members as members_result
from .convert import status as status_result
from .endpoints import ChannelSpec, build_channel
from .lease import AcquisitionLease, EstablishHook, SelfHealingLease
from .lease_keeper import LeaseKeeper
from .lease_pool import close_lease_pools
from .lifecycle import verify, without_learners
from .membership import CHANNEL_GRACE, synced_spec
from .rpc import DEFAULT_MAX_REQUEST_BYTES
from .rpc import UNSET as _UNSET
from .services import ServiceCalls
from .settings import resolve_settings
from .watch import ResyncHook, Watch
from .watch_hub import WatchHub
from .wire import Wire

__all__ = ["EtcdClient", "connect"]

log = library_logger("etcd_recipes.client")

CLOSE_FLUSH_TIMEOUT = 1.0
"""Seconds ``aclose()`` waits at most for the metrics sink to get the events queued so far."""


class EtcdClient(ServiceCalls, ConnectionStateCalls):
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

    async def open(self) -> EtcdClient:
        """Open the channel, authenticate if configured, and check that a server answers.

        Raises :class:`~etcd_recipes.errors.EtcdConnectionError` (or a subclass) when no
        endpoint answers within ``connect_timeout``.
        """
        if self._state == "open":
            return self
        if self._state == "closed":
            raise ClientClosedError("this client was closed; create a new one with connect()")
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # no asyncio loop: trio, curio, or a bare coroutine.send()
            raise UsageError(
                "etcd-recipes runs on asyncio only (grpc.aio has no other event loop): under "
                "trio, use the blocking facade etcd_recipes.sync from a worker thread, e.g. "
                "await trio.to_thread.run_sync(work) where work() calls etcd_recipes.sync.connect"
            ) from None
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
        self._watches = WatchHub(wire, stall_timeout=self._resilience.watch.stall_timeout)
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
        if self._sync_interval is not None:
            self._sync_task = self._loop.create_task(
                self._sync_forever(self._sync_interval), name="etcd-recipes-endpoint-sync"
            )
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
            if self._sync_task is not None:
                self._sync_task.cancel()
            for task, old in list(self._retiring.items()):  # no grace once closing
                task.cancel()
                with contextlib.suppress(Exception):
                    await old.close()
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

    def lease(self, ttl: float) -> AcquisitionLease:
        """A lease kept alive in the background, revoked on exit, **never re-granted**.

        Example::

            async with client.lease(5) as lease:
                await client.put(prefix + "/presence/me", b"1", lease=lease.id)
                assert (await client.lease_time_to_live(lease.id)).ttl > 0
            assert await client.get(prefix + "/presence/me") is None  # revoked on exit
        """
        return AcquisitionLease(self, ttl)

    def self_healing_lease(
        self, ttl: float, establish: EstablishHook, *, resilience: LeaseResilience | None = None
    ) -> SelfHealingLease:
        """A presence lease that is re-granted after loss, re-running ``establish``.

        See :class:`~etcd_recipes.client.lease.SelfHealingLease`.
        """
        return SelfHealingLease(self, ttl, establish, resilience=resilience)

    async def sync_endpoints(self) -> bool:
        """Refresh the endpoints from the cluster's member list now: the voting members'
        client URLs replace the endpoints when they differ (``True``), learners left out.

        Calls made afterwards dial the new endpoints; calls in flight finish on the old ones
        (up to 5 s); watches and leases move to the new channel then, losing nothing (a watch
        resumes at its last revision + 1). ``connect(endpoint_sync_interval=...)`` does this
        in the background. See :mod:`etcd_recipes.client.membership` for what it assumes.

        Example::

            assert await client.sync_endpoints() is False  # the endpoints are the members
            assert client.endpoints == endpoints
        """
        spec = await synced_spec(self)
        if spec is None:
            return False
        self._use(spec)
        return True

    def _use(self, spec: ChannelSpec) -> None:
        old, self._spec = self._channel, spec
        self._channel = build_channel(spec)
        self._stubs.clear()
        if self._auth is not None:
            self._auth.bind(self._channel)
        self._conn.switch(self._channel)
        self._blocking.rebind(spec, grace=CHANNEL_GRACE)
        # The streams move now, before the old channel closes (closing cancels its calls).
        if self._watches is not None:
            self._watches.move()
        if self._lease_keeper is not None:
            self._lease_keeper.move()
        log.info("endpoints synced from the member list: %s", spec.description)
        if old is not None:
            task = asyncio.get_running_loop().create_task(
                old.close(grace=CHANNEL_GRACE), name="etcd-recipes-old-channel"
            )
            self._retiring[task] = old
            task.add_done_callback(lambda t: self._retiring.pop(t, None))

    async def _sync_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync_endpoints()
            except EtcdRecipeError as exc:  # the next round tries again
                log.info("endpoint sync failed: %s", exc)

    def request_progress(self) -> None:
        """Ask the server for a progress notification on the watch stream: every watch known
        to be caught up then yields a :class:`~etcd_recipes.types.WatchProgress` from
        :meth:`Watch.items_and_progress`. Only etcd 3.5.8 or later (3.4.25 on the 3.4 line)
        orders its answer after the events it covers; an older server's answer is ignored
        (trusting it loses events, etcd-io/etcd#15220), so there this has no effect."""
        self._watch_hub.request_progress()


def _check_connect_types(endpoints: Any, resilience: Any) -> None:
    ok = endpoints is None or isinstance(endpoints, str)
    if not ok and isinstance(endpoints, Sequence) and not isinstance(endpoints, (bytes, bytearray)):
        ok = all(isinstance(e, str) for e in endpoints)
    if not ok:
        raise InvalidArgumentTypeError(
            "endpoints must be a str ('host:port', URLs, comma-separated) or a list of str, "
            f"not {type(endpoints).__name__} {endpoints!r}"
        )
    if resilience is not None and not isinstance(resilience, ResilienceConfig):
        raise InvalidArgumentTypeError(
            f"resilience must be a ResilienceConfig, not {type(resilience).__name__} {resilience!r}"
        )


def check_client(client: Any, *, what: str = "client") -> EtcdClient:
    """``client`` if it is an :class:`EtcdClient` from :func:`connect` (the recipes' argument
    check; a blocking facade client is refused with a pointer to the facade's own recipes).

    >>> check_client(client) is client
    True
    """
    return check_client_part(client, what=what, kind=EtcdClient)


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
    endpoint_sync_interval: float | None = None,
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
    :param endpoint_sync_interval: seconds between refreshes of the endpoints from the
        cluster's member list (:meth:`EtcdClient.sync_endpoints`); ``None`` (the default, as
        Go's ``AutoSyncInterval``): never -- members' advertised URLs are not always reachable
        from clients (proxies, container networks).

    Example::

        from etcd_recipes import connect

        async with connect(endpoints, namespace=prefix, connect_timeout=5) as app:
            await app.put("/k", b"v")  # stored at prefix + "/k"
    """
    _check_connect_types(endpoints, resilience)
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
        endpoint_sync_interval=check_timeout(endpoint_sync_interval, what="endpoint_sync_interval"),
    )
