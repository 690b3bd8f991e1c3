"""The state every part of the client shares, and the check that an argument is a client.

:class:`ClientBase` is the one base class of the client's parts (psycopg 3's
``BaseConnection`` pattern): it owns the channel, the funnel (:class:`~.rpc.RpcRunner`), the
namespace conversions, the watch hub and the lease keeper, and the checks every call makes
(open, same process, same event loop). Each part -- :class:`~.kv.KVCalls`,
:class:`~.lease_calls.LeaseCalls`, :class:`~.services.ServiceCalls`,
:class:`~.connectivity.ConnectionStateCalls` -- subclasses it (or a part below it), so no part
casts ``self`` and none names :class:`~etcd_recipes.EtcdClient`; the client is their union
plus its lifecycle (``open``/``aclose``) and watches. Not public: what users see is
:class:`~etcd_recipes.EtcdClient`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..errors import InvalidArgumentTypeError
from ..resilience import ResilienceConfig, RpcResilience
from .blocking import BlockingRunner
from .channel_state import ChannelState
from .convert import Convert
from .endpoints import ChannelSpec
from .lifecycle import misuse_error
from .rpc import DEFAULT_MAX_REQUEST_BYTES, AuthManager, RpcRunner
from .rpc import UNSET as _UNSET

if TYPE_CHECKING:
    from .lease_keeper import LeaseKeeper
    from .watch_hub import WatchHub
    from .wire import Wire

__all__ = ["ClientBase", "check_client_part"]

_loop = asyncio._get_running_loop  # None outside a loop (get_running_loop raises)

C = TypeVar("C", bound="ClientBase")


class ClientBase:
    """The state and checks shared by the client's parts (see the module doc). Not public."""

    _wire: Wire

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
        endpoint_sync_interval: float | None = None,
    ) -> None:
        self._sync_interval = endpoint_sync_interval
        self._sync_task: asyncio.Task[None] | None = None
        self._retiring: dict[asyncio.Task[None], Any] = {}  # old channels, closing with grace
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
        fn = getattr(self._stub(stub_cls), method)
        return self._runner.call(
            op,
            fn,
            request,
            retry=retry,
            timeout=timeout,
            resilience=resilience,
            detached=detached,
            settle=settle,
            again=(self._stub, stub_cls, method),
        )

    def _stub(self, stub_cls: Any) -> Any:
        """The stub of ``stub_cls`` on the current channel (one per channel)."""
        channel = self._channel_or_raise()
        stub = self._stubs.get(stub_cls)
        if stub is None:
            stub = self._stubs[stub_cls] = stub_cls(channel)
        return stub


@overload
def check_client_part(client: Any, *, what: str = ...) -> ClientBase: ...
@overload
def check_client_part(client: Any, *, what: str = ..., kind: type[C]) -> C: ...
def check_client_part(client: Any, *, what: str = "client", kind: type[Any] = ClientBase) -> Any:
    """An open-able :class:`~etcd_recipes.EtcdClient` (a blocking facade client is refused
    with a pointer to the facade's own recipes), typed as ``kind`` (one of its parts, or
    :class:`~etcd_recipes.EtcdClient` itself).

    >>> check_client_part(client) is client
    True
    """
    if not isinstance(client, kind):
        hint = ""
        if type(client).__module__.startswith("etcd_recipes.sync"):
            hint = " (a blocking client: use the recipes of etcd_recipes.sync with it)"
        raise InvalidArgumentTypeError(
            f"{what} must be an EtcdClient from connect(), not {type(client).__name__}{hint}"
        )
    return client
