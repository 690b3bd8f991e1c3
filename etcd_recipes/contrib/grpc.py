"""A ``grpc.aio`` channel that follows a service's instance list from a discovery provider.

gRPC Python has no name-resolver plugin API (grpc/grpc#11685), so this module does what a
resolver would, one level up: :func:`discovery_channel` returns a :class:`DiscoveryChannel`
that reads ``provider.instance_lists()`` and keeps one real ``grpc.aio`` channel to the
current instances, a static target (``ipv4:10.0.0.1:50051,10.0.0.2:50051``) balanced
``round_robin``. When the membership changes it builds a channel to the new list, swaps it in
(new calls go to the new channel from that moment) and closes the old one with a grace
period, so the calls already on it finish. Generated stubs take it like any channel::

    async with discovery_channel(provider) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest())

Guaranteed:

* every call goes to the channel current when it is made; a swap never fails a call: the
  old channel stops taking calls and is closed after its in-flight calls finish, or after
  ``grace`` seconds (then the leftovers are cancelled, as ``grpc.aio.Channel.close(grace)``
  does);
* the target lists each instance once (``address:port``, or ``ssl_port`` when
  ``credentials`` are given), sorted, so a reordered list does not rebuild the channel; IPv4
  literals give an ``ipv4:`` target, anything else (IPv6 literals, host names -- resolved
  when the list changes) an ``ipv6:`` target with IPv4 addresses mapped; instances without a
  usable port or address are left out (and logged);
* :meth:`DiscoveryChannel.start` waits until the provider has at least one instance (up to
  ``ready_timeout`` seconds, then :class:`~etcd_recipes.errors.NoInstancesError`).

Not guaranteed: an **empty** list keeps the last channel (its calls then fail ``UNAVAILABLE``
once those servers are gone, as gRPC's own resolver would leave it; the provider's
empty-snapshot protection has already absorbed spurious empties); a server removed from the
list should keep serving a moment after it unregisters (clients see the change a few
milliseconds later) and then stop with a grace of its own; ``wait_for_ready`` calls still
waiting on a swapped-out channel when its grace ends are cancelled. Errors are not reported
to ``provider.note_error`` (round-robin already skips a member whose connection fails), and
only the provider's list decides membership, not health checks. The channel does not start
or close the provider; if the provider's list ends (it was closed) or fails, the channel keeps
its last inner channel and logs why.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from etcd_recipes import (
    AlreadyStartedError,
    InvalidArgumentError,
    NoInstancesError,
    NotStartedError,
    RecipeClosedError,
    ServiceInstance,
)

if TYPE_CHECKING:
    from etcd_recipes import ServiceProvider

__all__ = ["DiscoveryChannel", "discovery_channel"]

log = logging.getLogger("etcd_recipes.contrib.grpc")


async def _resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


async def build_target(
    instances: Iterable[ServiceInstance[Any]], *, secure: bool = False
) -> str | None:
    """The static gRPC target for ``instances``, or ``None`` when none of them is dialable.

    Each instance contributes ``address:port`` (``ssl_port`` when ``secure``); duplicates are
    dropped and the result is sorted. All-IPv4 gives ``ipv4:a:p,b:p``; otherwise every address
    is written as IPv6 (IPv4 ones mapped, ``[::ffff:a.b.c.d]``) under ``ipv6:``. Host names
    are resolved here, through the event loop.

    Example::

        from etcd_recipes import ServiceInstance
        from etcd_recipes.contrib.grpc import build_target

        a = ServiceInstance("who", "", address="127.0.0.2", port=50051)
        b = ServiceInstance("who", "", address="127.0.0.1", port=50052)
        assert await build_target([a, b]) == "ipv4:127.0.0.1:50052,127.0.0.2:50051"
        c = ServiceInstance("who", "", address="::1", port=7)
        assert await build_target([a, c]) == "ipv6:[::1]:7,[::ffff:7f00:2]:50051"
        assert await build_target([a], secure=True) is None  # a has no ssl_port
    """
    endpoints: set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = set()
    for instance in instances:
        port = instance.ssl_port if secure else instance.port
        address = str(instance.address)
        if not 0 < port < 65536 or not address:
            log.warning("instance %r has no usable address and port; left out", instance)
            continue
        try:
            endpoints.add((ipaddress.ip_address(address.strip("[]")), port))
            continue
        except ValueError:
            pass
        try:
            resolved = await _resolve(address, port)
        except OSError as exc:
            log.warning("instance %r: %s does not resolve (%s); left out", instance, address, exc)
            continue
        endpoints.update((ipaddress.ip_address(a.split("%", 1)[0]), port) for a in resolved)
    if not endpoints:
        return None
    if all(a.version == 4 for a, _ in endpoints):
        return "ipv4:" + ",".join(f"{a}:{p}" for a, p in sorted(endpoints, key=_order))
    v6 = sorted(
        ((a if a.version == 6 else ipaddress.IPv6Address(f"::ffff:{a}"), p) for a, p in endpoints),
        key=_order,
    )
    return "ipv6:" + ",".join(f"[{a}]:{p}" for a, p in v6)


def _order(item: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]) -> tuple[int, int]:
    return (int(item[0]), item[1])


class _Proxy:
    """A multicallable that makes each call on the channel current at that moment."""

    _kind = ""

    def __init__(
        self,
        owner: DiscoveryChannel,
        method: str,
        request_serializer: Any,
        response_deserializer: Any,
        registered: bool | None,
    ) -> None:
        self._owner = owner
        self._args = (method, request_serializer, response_deserializer, registered)
        self._channel: Any = None
        self._inner: Any = None

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        channel = self._owner._current()
        if channel is not self._channel:
            method, ser, deser, registered = self._args
            self._inner = getattr(channel, self._kind)(
                method, ser, deser, _registered_method=registered
            )
            self._channel = channel
        return self._inner(request, **kwargs)


class _UnaryUnary(_Proxy, grpc.aio.UnaryUnaryMultiCallable):  # type: ignore[misc]
    _kind = "unary_unary"


class _UnaryStream(_Proxy, grpc.aio.UnaryStreamMultiCallable):  # type: ignore[misc]
    _kind = "unary_stream"


class _StreamUnary(_Proxy, grpc.aio.StreamUnaryMultiCallable):  # type: ignore[misc]
    _kind = "stream_unary"


class _StreamStream(_Proxy, grpc.aio.StreamStreamMultiCallable):  # type: ignore[misc]
    _kind = "stream_stream"


class DiscoveryChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A ``grpc.aio.Channel`` over the current instances of one service (see the module).

    Build it with :func:`discovery_channel`; :meth:`start` (or ``async with``) before the
    first call. ``target`` is the current inner channel's target and ``generation`` counts
    the channels built so far (1 after start). :meth:`aclose` (or leaving ``async with``)
    stops following the list and closes every inner channel, letting their calls finish for
    up to ``grace`` seconds; :meth:`close` is ``grpc.aio.Channel.close`` (``grace=None``
    cancels the calls in flight).

    Example::

        import asyncio
        from etcd_recipes import ServiceInstance, ServiceProvider, ServiceRegistry
        from etcd_recipes.contrib.grpc import discovery_channel

        path = f"{prefix}/services"
        async with ServiceRegistry(client, path) as registry:
            await registry.register(ServiceInstance("who", "", address="10.0.0.2", port=50051))
            async with ServiceProvider(client, path, "who") as provider:
                async with discovery_channel(provider) as channel:  # connects lazily
                    assert channel.target == "ipv4:10.0.0.2:50051" and channel.generation == 1
                    other = ServiceInstance("who", "", address="10.0.0.1", port=50051)
                    await registry.register(other)
                    while channel.generation < 2:  # the swap follows within milliseconds
                        await asyncio.sleep(0.01)
                    assert channel.target == "ipv4:10.0.0.1:50051,10.0.0.2:50051"
    """

    def __init__(
        self,
        provider: ServiceProvider[Any],
        *,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        compression: grpc.Compression | None = None,
        interceptors: Sequence[Any] | None = None,
        grace: float = 5.0,
        ready_timeout: float | None = 10.0,
    ) -> None:
        if grace < 0:
            raise InvalidArgumentError(f"grace must be >= 0 seconds, got {grace!r}")
        if ready_timeout is not None and ready_timeout <= 0:
            raise InvalidArgumentError(f"ready_timeout must be > 0 or None, got {ready_timeout!r}")
        self.provider = provider
        self.grace = grace
        self.ready_timeout = ready_timeout
        self._credentials = credentials
        self._options = [
            *((k, v) for k, v in options if k != "grpc.lb_policy_name"),
            ("grpc.lb_policy_name", dict(options).get("grpc.lb_policy_name", "round_robin")),
        ]
        self._compression = compression
        self._interceptors = interceptors
        self._channel: Any = None
        self._target: str | None = None
        self._generation = 0
        self._state = "new"
        self._stream: Any = None
        self._follower: asyncio.Task[None] | None = None
        self._draining: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return (
            f"DiscoveryChannel({self._state}, target={self._target!r}, "
            f"generation={self._generation}, draining={len(self._draining)})"
        )

    @property
    def target(self) -> str | None:
        """The current inner channel's target (``None`` before :meth:`start`)."""
        return self._target

    @property
    def generation(self) -> int:
        """How many inner channels have been built (each membership change adds one)."""
        return self._generation

    async def start(self) -> None:
        """Wait for the first non-empty instance list and open the first inner channel.

        Raises :class:`~etcd_recipes.errors.NoInstancesError` if none came within
        ``ready_timeout`` seconds, or the provider's list ended (it was closed, or never
        started); nothing is left running then, nor after a cancelled start. The channel is
        one-shot: a second start raises :class:`~etcd_recipes.errors.AlreadyStartedError`.
        """
        if self._state != "new":
            raise AlreadyStartedError(f"{self!r} was already started")
        self._state = "starting"
        stream = self.provider.instance_lists(maxsize=1)
        iterator = stream.__aiter__()
        try:
            target = await asyncio.wait_for(self._first(iterator), self.ready_timeout)
        except BaseException as exc:
            self._state = "closed"
            await stream.aclose()
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                raise NoInstancesError(
                    f"no dialable instance within {self.ready_timeout} s "
                    f"(is the provider started?): {self.provider!r}"
                ) from None
            if isinstance(exc, StopAsyncIteration):
                raise NoInstancesError(
                    f"the provider's instance list ended (is it closed?): {self.provider!r}"
                ) from None
            raise
        if self._state == "closed":  # closed while starting
            await stream.aclose()
            raise RecipeClosedError(f"{self!r} was closed while it started")
        self._stream = stream
        self._swap(target)
        self._state = "open"
        self._follower = asyncio.get_running_loop().create_task(
            self._follow(iterator), name="discovery-channel-follower"
        )

    async def _first(self, iterator: Any) -> str:
        while True:
            target = await build_target(await iterator.__anext__(), secure=self._secure)
            if target is not None:
                return target

    @property
    def _secure(self) -> bool:
        return self._credentials is not None

    def _swap(self, target: str) -> None:
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(
                target, self._credentials, self._options, self._compression, self._interceptors
            )
        else:
            channel = grpc.aio.insecure_channel(
                target, self._options, self._compression, self._interceptors
            )
        old, self._channel, self._target = self._channel, channel, target
        self._generation += 1
        log.info("channel %d -> %s", self._generation, target)
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.close(self.grace))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)

    async def _follow(self, iterator: Any) -> None:
        try:
            async for instances in iterator:
                target = await build_target(instances, secure=self._secure)
                if target is None:
                    log.warning("no dialable instance; keeping %s", self._target)
                elif target != self._target:
                    self._swap(target)
        except Exception:  # the provider failed: keep the channel we have, say so
            log.exception("%r stopped following its provider's instance list", self)
        else:
            log.info("%r: the provider's instance list ended; keeping the channel", self)

    def _current(self) -> Any:
        if self._channel is None or self._state != "open":
            if self._state == "closed":
                raise RecipeClosedError(f"{self!r} is closed")
            raise NotStartedError(f"{self!r} needs start() (or async with) before a call")
        return self._channel

    async def close(self, grace: float | None = None) -> None:
        """Stop following the list and close every inner channel (``grpc.aio`` semantics:
        ``grace=None`` cancels the calls in flight, else they get ``grace`` seconds)."""
        if self._state == "closed":
            return
        self._state = "closed"
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        if self._stream is not None:
            await self._stream.aclose()
        closing = [*self._draining]
        if self._channel is not None:
            closing.append(asyncio.ensure_future(self._channel.close(grace)))
        await asyncio.gather(*closing, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop following the list; close the inner channels after their calls finish (up to
        ``grace`` seconds). Idempotent."""
        await self.close(self.grace)

    async def __aenter__(self) -> DiscoveryChannel:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """The current inner channel's connectivity (``grpc.aio.Channel.get_state``)."""
        return self._current().get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        """Wait for the current inner channel's state to change from ``last_observed_state``."""
        await self._current().wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        """Wait until the current inner channel is ``READY``."""
        await self._current().channel_ready()

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-unary multicallable whose every call uses the then-current channel."""
        return _UnaryUnary(
            self, method, request_serializer, response_deserializer, _registered_method
        )

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A unary-stream multicallable whose every call uses the then-current channel."""
        return _UnaryStream(
            self, method, request_serializer, response_deserializer, _registered_method
        )

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-unary multicallable whose every call uses the then-current channel."""
        return _StreamUnary(
            self, method, request_serializer, response_deserializer, _registered_method
        )

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> Any:
        """A stream-stream multicallable whose every call uses the then-current channel."""
        return _StreamStream(
            self, method, request_serializer, response_deserializer, _registered_method
        )


def discovery_channel(
    provider: ServiceProvider[Any],
    *,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
    compression: grpc.Compression | None = None,
    interceptors: Sequence[Any] | None = None,
    grace: float = 5.0,
    ready_timeout: float | None = 10.0,
) -> DiscoveryChannel:
    """A :class:`DiscoveryChannel` (unstarted) over ``provider``'s instances.

    ``credentials`` makes the inner channels secure (and dials ``ssl_port``); ``options``,
    ``compression`` and ``interceptors`` go to every inner channel (``grpc.lb_policy_name``
    defaults to ``round_robin``); ``grace`` is how long a swapped-out channel's calls may
    take to finish; ``ready_timeout`` bounds :meth:`DiscoveryChannel.start`.

    Example::

        from etcd_recipes import ServiceProvider
        from etcd_recipes.contrib.grpc import discovery_channel

        async with ServiceProvider(client, f"{prefix}/services", "nobody") as provider:
            channel = discovery_channel(provider, grace=1.0)
            assert repr(channel) == (
                "DiscoveryChannel(new, target=None, generation=0, draining=0)"
            )
    """
    return DiscoveryChannel(
        provider,
        credentials=credentials,
        options=options,
        compression=compression,
        interceptors=interceptors,
        grace=grace,
        ready_timeout=ready_timeout,
    )
