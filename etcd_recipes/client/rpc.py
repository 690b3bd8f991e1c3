"""The single funnel every unary RPC goes through: per-attempt timeout, retries, auth refresh,
error mapping and metrics.

Transactions pass ``retry=False`` (a commit may have landed); everything else retries on
UNAVAILABLE, DEADLINE_EXCEEDED and INTERNAL per :class:`~etcd_recipes.resilience.RpcResilience`.
The caller's cancellation is never retried nor wrapped: it propagates unchanged.

Every call reports one ``rpc_finished(operation, duration, attempts, outcome)`` event
(``outcome``: ``"ok"``, the lower-case gRPC status of the last failure, or ``"cancelled"``)
through the sink's :class:`~etcd_recipes._core.metering.Meter`: queued, never inline, so a
slow or raising sink does not delay or fail an RPC. Not guaranteed: delivery (a full queue
drops events, counted in the meter's stats).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import EllipsisType
from typing import Any, Generic, TypeVar

import grpc
from aetcd import rpc as pb

from .._core.logctx import library_logger
from .._core.metering import meter_for
from .._core.shield import run_shielded
from .._core.validate import check_rpc_timeout
from ..errors import (
    AuthenticationError,
    CompactedError,
    ConnectionRetriesExhaustedError,
    DuplicateKeyError,
    EmptyKeyError,
    EtcdConnectionError,
    EtcdRecipeError,
    EtcdServerError,
    EtcdTimeoutError,
    FutureRevisionError,
    InvalidArgumentError,
    LeaseNotFoundError,
    NotLeaderError,
    PermissionDeniedError,
    QuotaExceededError,
    RetriesExhaustedError,
    TimeoutRetriesExhaustedError,
    TlsHandshakeError,
    TooManyOperationsError,
    ValueTooLargeError,
)
from ..metrics import EtcdMetrics
from ..resilience import RpcResilience

__all__ = [
    "AuthManager",
    "UNSET",
    "RpcRunner",
    "await_call",
    "await_stream_op",
    "DEFAULT_MAX_REQUEST_BYTES",
    "exhausted",
    "request_too_large",
    "is_auth_token_error",
    "is_retriable",
    "map_grpc_error",
    "status_name",
    "Unary",
]

log = library_logger("etcd_recipes.rpc")
T = TypeVar("T")

UNSET: Any = ...
"""The default of ``timeout=``: the client's per-attempt timeout (``None`` means unbounded)."""

_RETRIABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"}


class Unary(Generic[T]):
    """One unary call described once for both ways of sending it: awaited through the client's
    funnel (:class:`RpcRunner`: :meth:`send`), or sent from a blocking facade caller's own
    thread (:meth:`send_blocking`: :class:`~etcd_recipes.client.blocking.BlockingRunner`, no
    hand-off to the event-loop thread). ``convert`` turns the response into the public result;
    ``retry``/``detached`` are :meth:`RpcRunner.call`'s. A ``detached`` call (a read-only
    transaction, which must never be cancelled server-side) is never sent blocking."""

    __slots__ = (
        "client",
        "convert",
        "detached",
        "method",
        "op",
        "request",
        "retry",
        "stub",
        "timeout",
    )

    def __init__(
        self,
        client: Any,
        op: str,
        stub: Any,
        method: str,
        request: Any,
        convert: Callable[[Any], T],
        timeout: float | EllipsisType | None,
        *,
        retry: bool = True,
        detached: bool = False,
    ) -> None:
        self.client = client  # the EtcdClient it belongs to
        self.op = op
        self.stub = stub  # an aetcd stub class; ``method`` is one of its methods
        self.method = method
        self.request = request
        self.convert = convert
        self.timeout = timeout
        self.retry = retry
        self.detached = detached

    async def send(self) -> T:
        """Await it through the client's funnel (retries, error mapping, metrics)."""
        client = self.client
        resp = await client._call(
            self.op,
            self.method,
            self.stub,
            self.request,
            retry=self.retry,
            timeout=self.timeout,
            detached=self.detached,
        )
        result: T = self.convert(resp)
        return result

    def send_blocking(self, deadline: float | None) -> T:
        """Send it from this thread and wait (``deadline``: a ``time.monotonic()`` bound)."""
        result: T = self.convert(self.client._blocking.call(self, deadline))
        return result

    def __repr__(self) -> str:
        return f"<Unary {self.op} {self.method}{' detached' if self.detached else ''}>"


def _code_name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            return str(code().name)
        except Exception:  # pragma: no cover - defensive
            return "UNKNOWN"
    return "UNKNOWN"


def _details(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return str(details() or "")
        except Exception:  # pragma: no cover - defensive
            return ""
    return str(exc)


def _server_timeout(code: str, details: str) -> bool:
    """etcd's own deadline, passed to the client as UNKNOWN: a member that cannot reach its
    leader times out a lease grant or a linearizable read this way ("context deadline
    exceeded") -- transient, and another member may serve it."""
    return code == "UNKNOWN" and "context deadline exceeded" in details.lower()


def is_retriable(exc: BaseException) -> bool:
    """Whether a gRPC error (of ``grpc.aio`` or of a blocking stub) is transient
    (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, or etcd's own deadline reported as UNKNOWN).

    >>> class Err(grpc.RpcError):
    ...     def code(self): return grpc.StatusCode.UNKNOWN
    ...     def details(self): return "context deadline exceeded"
    >>> is_retriable(Err())
    True
    """
    if not isinstance(exc, grpc.RpcError):
        return False
    code = _code_name(exc)
    return code in _RETRIABLE or _server_timeout(code, _details(exc))


def is_auth_token_error(exc: BaseException) -> bool:
    """Whether a gRPC error says the auth token is missing, invalid or expired."""
    if not isinstance(exc, grpc.RpcError):
        return False
    details = _details(exc).lower()
    return _code_name(exc) == "UNAUTHENTICATED" or "invalid auth token" in details


def map_grpc_error(exc: BaseException, *, op: str, endpoints: str) -> EtcdRecipeError:
    """Translate a gRPC error into the library's hierarchy with an actionable message."""
    if isinstance(exc, EtcdRecipeError):
        return exc
    code = _code_name(exc)
    details = _details(exc)
    low = details.lower()
    where = f"{op} on [{endpoints}]"
    if code == "UNAVAILABLE":
        # Not gRPC's "tcp handshaker shutdown": the TCP connect itself was cut short (a slow
        # connect under load, a member restarting) -- transient, and nothing to do with TLS.
        handshake = "handshake" in low and "tcp handshaker" not in low
        if handshake or "tsi_" in low or "ssl" in low or "certificate" in low:
            return TlsHandshakeError(
                f"{where}: TLS handshake failed ({details}); check ca_cert, the client "
                "certificate (mutual TLS) and that the server speaks TLS"
            )
        if "not supported for learner" in low:
            return EtcdConnectionError(
                f"{where}: the member is a learner, which serves no writes and no "
                "linearizable reads: give the client the endpoints of voting members"
            )
        return EtcdConnectionError(f"{where}: no etcd endpoint reachable: {details}")
    if code == "DEADLINE_EXCEEDED":
        return EtcdTimeoutError(f"{where}: timed out ({details})")
    if _server_timeout(code, details):
        return EtcdTimeoutError(
            f"{where}: the member timed out serving it (is it cut off from its leader?): {details}"
        )
    if "database space exceeded" in low:
        return QuotaExceededError(
            f"{where}: etcd's database is over its space quota (--quota-backend-bytes) and "
            "refuses writes and lease grants until an operator compacts, defragments and runs "
            f"'etcdctl alarm disarm' ({details})",
            code=code,
            details=details,
        )
    if code == "RESOURCE_EXHAUSTED" and "larger than max" in low:
        return ValueTooLargeError(f"{where}: request too large for the server: {details}")
    if "request is too large" in low:
        return ValueTooLargeError(
            f"{where}: request too large (server --max-request-bytes, 1.5 MiB by default)"
        )
    if "key is not provided" in low:
        return EmptyKeyError(f"{where}: etcd keys must not be empty")
    if "too many operations in txn" in low:
        return TooManyOperationsError(
            f"{where}: too many operations in one transaction "
            "(server --max-txn-ops, 128 by default)"
        )
    if "duplicate key given in txn" in low:
        return DuplicateKeyError(f"{where}: the same key is written twice in one transaction")
    if "authentication failed" in low or "invalid user id or password" in low:
        return AuthenticationError(f"{where}: authentication failed: wrong user name or password")
    if "authentication is not enabled" in low:
        return AuthenticationError(f"{where}: user/password given but auth is not enabled")
    if code == "UNAUTHENTICATED" or "invalid auth token" in low or "user name is empty" in low:
        return AuthenticationError(f"{where}: not authenticated ({details})")
    if code == "PERMISSION_DENIED" or "permission denied" in low:
        return PermissionDeniedError(f"{where}: permission denied ({details})")
    if "compacted" in low:
        return CompactedError(f"{where}: the revision has been compacted ({details})")
    if "future revision" in low:
        return FutureRevisionError(f"{where}: the revision is in the future ({details})")
    if "lease not found" in low:
        return LeaseNotFoundError(f"{where}: lease not found (expired or revoked)")
    if "not leader" in low:
        return NotLeaderError(f"{where}: {details}")
    if code == "INVALID_ARGUMENT":
        return InvalidArgumentError(f"{where}: invalid argument: {details}")
    if code == "CANCELLED" and "channel closed" in low:
        return EtcdConnectionError(f"{where}: the client channel was closed")
    return EtcdServerError(f"{where}: {code}: {details}", code=code, details=details)


async def await_call(call: Any) -> Any:
    """Await a ``grpc.aio`` unary call so that cancellation stays the caller's own.

    Awaiting a call object directly, grpc.aio replaces the task's ``CancelledError`` with a
    fresh one, losing the marker anyio uses to recognise its own cancel scopes (so
    ``anyio.fail_after`` would leak a bare ``CancelledError`` instead of ``TimeoutError``).
    Here the task parks on a plain future completed by the call's done-callback; on
    cancellation the RPC is cancelled and the original exception propagates unchanged.
    """
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _finished(_: Any) -> None:
        if not done.done():
            done.set_result(None)

    call.add_done_callback(_finished)
    try:
        await done
    except asyncio.CancelledError:
        call.cancel()
        raise
    return await call


async def await_stream_op(aw: Awaitable[T], call: Any) -> T:
    """Await a ``grpc.aio`` stream operation (``write``/``read``) in a helper task, for the
    same reason as :func:`await_call`: the caller's cancellation must stay its own. On
    cancellation the whole stream call is cancelled."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task})
    except asyncio.CancelledError:
        call.cancel()
        task.cancel()
        raise
    return task.result()


DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024  # etcd's --max-request-bytes default (1.5 MiB)


def request_too_large(op: str, size: int, limit: int) -> ValueTooLargeError:
    """The client-side rejection of a request over the server's size limit (nothing sent)."""
    return ValueTooLargeError(
        f"{op}: the request is {size} bytes, over the server's limit of {limit} bytes "
        "(etcd's --max-request-bytes, 1.5 MiB by default); nothing was sent or written. "
        "Split the value, or, for a server started with a larger limit, pass "
        "connect(max_request_bytes=...)"
    )


def exhausted(op: str, attempts: int, last: EtcdRecipeError) -> RetriesExhaustedError:
    """The error of a call whose retries gave up: of the same kind as its last failure (a
    connection failure, a timeout), so that ``except`` does not depend on the retry policy."""
    kind: type[RetriesExhaustedError] = RetriesExhaustedError
    if isinstance(last, EtcdConnectionError):
        kind = ConnectionRetriesExhaustedError
    elif isinstance(last, EtcdTimeoutError):
        kind = TimeoutRetriesExhaustedError
    return kind(f"{op} failed after {attempts} attempts: {last}", attempts=attempts)


class AuthManager:
    """Holds the auth token and refreshes it (once, coalesced) when the server rejects it."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password
        self.token: str | None = None
        self._lock = asyncio.Lock()
        self._generation = 0
        self._channel: Any = None

    def bind(self, channel: Any) -> None:
        """Attach to the client's channel."""
        self._channel = channel

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The per-call metadata carrying the token, if any."""
        return (("token", self.token),) if self.token else None

    @property
    def generation(self) -> int:
        """Bumped on each successful refresh."""
        return self._generation

    async def refresh(
        self, seen_generation: int | None = None, timeout: float | None = 10.0
    ) -> None:
        """Authenticate again; concurrent callers that saw the same generation share one call."""
        async with self._lock:
            if seen_generation is not None and seen_generation != self._generation:
                return
            stub = pb.AuthStub(self._channel)
            req = pb.AuthenticateRequest(name=self.user, password=self.password)
            resp = await await_call(stub.Authenticate(req, timeout=timeout))
            self.token = str(resp.token)
            self._generation += 1


def status_name(exc: grpc.RpcError) -> str:
    """The lower-case gRPC status name of a failed call (``"unavailable"``...)."""
    code = exc.code()
    name = getattr(code, "name", None)
    return name.lower() if isinstance(name, str) else "unknown"


async def _answered(call: Any) -> None:
    """Wait (shielded, bounded) until ``call`` is done: a settling call's cancelled caller.
    (Not on the caller's own future: cancelling the caller cancelled that one.)"""
    if call.done():
        return
    answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: Any) -> None:
        if not answered.done():
            answered.set_result(None)

    call.add_done_callback(wake)

    async def wait() -> None:
        await asyncio.wait({answered})

    await run_shielded(wait, what="answering a cancelled write")


class RpcRunner:
    """Runs unary calls under a :class:`RpcResilience` policy."""

    def __init__(
        self,
        resilience: RpcResilience,
        metrics: EtcdMetrics,
        auth: AuthManager | None,
        endpoints: str,
    ) -> None:
        self.resilience = resilience
        self.metrics = metrics
        self._meter = self.meter = meter_for(metrics)
        self.auth = auth
        self.endpoints = endpoints

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The metadata to attach to calls and streams."""
        return self.auth.metadata() if self.auth else None

    async def call(
        self,
        op: str,
        fn: Callable[..., Any],
        request: Any,
        *,
        retry: bool = True,
        timeout: float | EllipsisType | None = ...,
        resilience: RpcResilience | None = None,
        detached: bool = False,
        settle: list[BaseException] | None = None,
        again: tuple[Callable[[Any], Any], Any, str] | None = None,
    ) -> T:
        """Call ``fn(request, timeout=..., metadata=...)`` with retries and error mapping.

        ``again`` (``(stub_of, stub_class, method)``): how a retry finds the method on the
        client's *current* channel -- its endpoints may have changed since the first attempt,
        and the old channel closes.

        ``timeout`` overrides the per-attempt timeout (``None``: unbounded); ``retry=False``
        makes exactly one attempt (transactions).

        ``detached=True`` (transactions) never cancels the RPC on the server: the timeout is
        enforced here and a cancelled caller leaves the call to finish on its own. etcd
        3.5.0-3.5.2 **crash** ("unexpected error during txn") when a read-only transaction's
        context is cancelled or times out server-side, which any caller cancellation did.

        ``settle`` (a write whose outcome a cleanup must not overtake, like
        :func:`~etcd_recipes._core.shield.settled` but without a task of its own): a
        cancellation that arrives while the call is in flight does not cancel the RPC; it is
        appended to ``settle`` and the call is awaited (shielded, bounded by
        :data:`~etcd_recipes._core.shield.CLEANUP_TIMEOUT`) until answered, and its outcome
        returned or raised as usual: **the caller must then re-raise** ``settle[0]``. Only if
        no answer comes within the bound is the RPC cancelled and the cancellation raised here.
        """
        res = resilience or self.resilience
        per_attempt = res.operation_timeout if timeout is ... else check_rpc_timeout(timeout)
        start = time.monotonic()
        attempt = 0
        auth_retried = False
        outcome = "unknown"
        try:
            while True:
                attempt += 1
                if attempt > 1 and again is not None:
                    stub_of, stub_class, method = again
                    fn = getattr(stub_of(stub_class), method)
                generation = self.auth.generation if self.auth else 0
                try:
                    if detached:
                        result: T = await self._detached_attempt(op, fn, request, per_attempt)
                        outcome = "ok"
                        return result
                    call = fn(request, timeout=per_attempt, metadata=self.metadata())
                    # await_call, inlined (this is the hottest path of the library).
                    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    call.add_done_callback(lambda _c, d=done: d.done() or d.set_result(None))
                    try:
                        await done
                    except asyncio.CancelledError as exc:
                        if settle is None:
                            call.cancel()
                            raise
                        settle.append(exc)
                        await _answered(call)
                        if not call.done():
                            call.cancel()
                            raise
                    result = await call
                    outcome = "ok"
                    return result
                except grpc.aio.AioRpcError as exc:
                    outcome = status_name(exc)
                    if self.auth is not None and not auth_retried and is_auth_token_error(exc):
                        auth_retried = True
                        attempt -= 1
                        log.debug("%s: auth token rejected, re-authenticating", op)
                        try:
                            await self.auth.refresh(generation)
                        except grpc.aio.AioRpcError as auth_exc:
                            raise map_grpc_error(
                                auth_exc, op="authenticate", endpoints=self.endpoints
                            ) from None
                        continue
                    delay = self.retry_delay(exc, op, attempt, start, retry, res)
                    await asyncio.sleep(delay)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except EtcdTimeoutError:
            if outcome == "unknown":  # a detached attempt's own deadline
                outcome = "deadline_exceeded"
            raise
        finally:
            # Queued for the sink's own thread: a slow or failing sink never delays this call.
            self._meter.emit("rpc_finished", op, time.monotonic() - start, attempt, outcome)

    def retry_delay(
        self,
        exc: grpc.RpcError,
        op: str,
        attempt: int,
        start: float,
        retry: bool,
        res: RpcResilience,
    ) -> float:
        """After failed attempt number ``attempt`` (the call started at ``start``): the seconds
        to wait before the next one, or raise what the caller sees -- the mapped error, or
        :func:`exhausted` once the policy gives up. The one decision the async funnel and the
        blocking one (:mod:`~etcd_recipes.client.blocking`) share."""
        mapped = map_grpc_error(exc, op=op, endpoints=self.endpoints)
        if not (retry and is_retriable(exc)):
            raise mapped from None
        delay = res.retry_policy.next_delay(attempt, time.monotonic() - start)
        if delay is None:
            if attempt == 1:
                raise mapped from None
            raise exhausted(op, attempt, mapped) from mapped
        log.debug("%s attempt %d failed (%s); retrying in %.3fs", op, attempt, exc.code(), delay)
        return delay

    async def _detached_attempt(
        self, op: str, fn: Callable[..., Any], request: Any, per_attempt: float | None
    ) -> Any:
        call = fn(request, timeout=None, metadata=self.metadata())
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def wake(*_: Any) -> None:
            if not done.done():
                done.set_result(None)

        call.add_done_callback(wake)
        timer = None if per_attempt is None else loop.call_later(per_attempt, wake)
        try:
            await done  # a cancelled caller leaves here; the call finishes (unobserved) alone
        finally:
            if timer is not None:
                timer.cancel()
        if not call.done():
            raise EtcdTimeoutError(
                f"{op} on [{self.endpoints}]: no answer within {per_attempt}s "
                "(the transaction may still commit)"
            )
        return await call
