"""The blocking funnel: plain KV calls sent from the blocking facade caller's own thread.

A call through :mod:`etcd_recipes.sync` normally runs as a coroutine on the client's event-loop
thread: two thread hand-offs (the caller wakes the loop, the loop wakes the caller), plus the
one inside grpc.aio (its completion thread wakes the loop). For the plain KV calls -- ``get``,
``range``, ``get_prefix``, ``count``, ``put``, ``delete``, ``txn``, ``get_value``,
``put_value``, each described once as a :class:`~etcd_recipes.client.rpc.Unary` by the async
client (``client/kv.py``) -- that is all overhead: nothing of them needs the loop.
:class:`BlockingRunner` sends them through grpc's *blocking* stubs on a second, plain channel
of the same client (same endpoints, TLS, keepalive and load-balancing options; opened at the
first such call), from the calling thread: no hand-off at all.

What it keeps from :class:`~etcd_recipes.client.rpc.RpcRunner`, the async funnel: the
per-attempt timeout, the retry decision (shared: :meth:`RpcRunner.retry_delay`), the error
mapping, the auth token and its refresh (the refresh itself runs on the loop: rare), and one
``rpc_finished`` metrics event per call. What the facade's runtime gives every call, it gives
too: a :func:`~etcd_recipes.sync.fail_after` deadline bounds the call (each attempt's gRPC
deadline is cut to it, and passing it raises
:class:`~etcd_recipes.errors.EtcdTimeoutError`), Ctrl-C interrupts it (grpc checks for
signals while it waits; the RPC is cancelled), and a client closed meanwhile raises
:class:`~etcd_recipes.errors.ClientClosedError`.

Not guaranteed: the connection-state listeners follow the loop's channel only; an interrupted
or timed-out ``put``/``delete`` may still have been applied (as for an async caller cancelled
mid-call). Read-only transactions never come here (``Unary.detached``): they must not be
cancelled server-side (etcd 3.5.0-3.5.2 crash), which a blocking caller's deadline or Ctrl-C
would do, so the facade awaits them on the loop, where a cancelled caller leaves the call to
finish alone. Transactions are never retried, here as there (a commit may have landed).

Example::

    from etcd_recipes.sync import connect

    with connect(endpoints) as blocking:
        blocking.put(prefix + "/k", "v")  # sent from this thread
        assert blocking.get(prefix + "/k").value == b"v"
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc

from .._core.logctx import library_logger
from .._core.validate import check_rpc_timeout
from ..errors import ClientClosedError, EtcdTimeoutError
from .endpoints import ChannelSpec, build_channel
from .rpc import UNSET, RpcRunner, Unary, is_auth_token_error, map_grpc_error, status_name

__all__ = ["FAIL_AFTER_EXPIRED", "BlockingRunner"]

log = library_logger("etcd_recipes.rpc")

FAIL_AFTER_EXPIRED = "the blocking call did not finish before its fail_after() deadline"
"""The message of the :class:`~etcd_recipes.errors.EtcdTimeoutError` a blocking call raises
when its :func:`~etcd_recipes.sync.fail_after` deadline passes (both ways of running it)."""

_REFRESH_WAIT = 30.0  # bound on waiting for the loop's token refresh (itself bounded at 10 s)


class BlockingRunner:
    """Sends :class:`Unary` calls from the calling thread; one per client, thread-safe."""

    def __init__(self, runner: RpcRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._spec: ChannelSpec | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: Any = None
        self._stubs: dict[Any, Any] = {}  # one per stub class, for the channel's lifetime
        self._closed = False

    def bind(self, spec: ChannelSpec, loop: asyncio.AbstractEventLoop) -> None:
        """The client opened: the channel settings it ended up with, and its loop."""
        with self._lock:
            self._spec, self._loop = spec, loop

    def rebind(self, spec: ChannelSpec, *, grace: float) -> None:
        """New channel settings (the client's endpoints changed): the next call dials them; the
        old channel is closed after ``grace`` seconds, so calls in flight on it can finish."""
        with self._lock:
            self._spec = spec
            channel, self._channel, self._stubs = self._channel, None, {}
        if channel is not None:
            timer = threading.Timer(grace, channel.close)
            timer.daemon = True
            timer.start()

    def close(self) -> None:
        """Close the channel (calls in flight fail with ``ClientClosedError``); idempotent."""
        with self._lock:
            self._closed = True
            channel, self._channel, self._stubs = self._channel, None, {}
        if channel is not None:
            channel.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._channel is not None else "idle"
        return f"<BlockingRunner {state} [{self._runner.endpoints}]>"

    def _stub(self, stub_class: Any) -> Any:
        stub = self._stubs.get(stub_class)
        if stub is not None:
            return stub
        with self._lock:
            if self._closed or self._spec is None:
                raise _closed()
            if self._channel is None:
                self._channel = build_channel(self._spec, blocking=True)
            stub = self._stubs[stub_class] = stub_class(self._channel)
            return stub

    def call(self, unary: Unary[Any], deadline: float | None) -> Any:
        """The response of ``unary``, sent under the client's retry policy (see module doc)."""
        if unary.detached:
            raise ValueError(f"{unary!r} must not be cancelled server-side: await it on the loop")
        runner = self._runner
        res = runner.resilience
        timeout = unary.timeout
        per_attempt = res.operation_timeout if timeout is UNSET else check_rpc_timeout(timeout)
        auth = runner.auth
        start = time.monotonic()
        attempt = 0
        auth_retried = False
        outcome = "unknown"
        try:
            fn = getattr(self._stub(unary.stub), unary.method)
            while True:
                attempt += 1
                limit, cut = per_attempt, False
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        outcome = "cancelled"  # what the loop's cancel scope would record
                        raise EtcdTimeoutError(FAIL_AFTER_EXPIRED)
                    if limit is None or left < limit:
                        limit, cut = left, True
                generation = auth.generation if auth is not None else 0
                try:
                    response = fn(unary.request, timeout=limit, metadata=runner.metadata())
                except grpc.RpcError as exc:
                    outcome = status_name(exc)
                    if self._closed:
                        raise _closed() from None
                    if cut and outcome == "deadline_exceeded":
                        outcome = "cancelled"
                        raise EtcdTimeoutError(FAIL_AFTER_EXPIRED) from None
                    if auth is not None and not auth_retried and is_auth_token_error(exc):
                        auth_retried = True
                        attempt -= 1
                        self._refresh(generation, deadline)
                        continue
                    delay = runner.retry_delay(exc, unary.op, attempt, start, unary.retry, res)
                    if deadline is not None and time.monotonic() + delay >= deadline:
                        time.sleep(max(0.0, deadline - time.monotonic()))  # then time is up
                    else:
                        time.sleep(delay)
                    continue
                except ValueError:  # grpc: "Cannot invoke RPC on closed channel!"
                    if self._closed:
                        raise _closed() from None
                    raise
                outcome = "ok"
                return response
        except BaseException as exc:
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit
                outcome = "cancelled"
            raise
        finally:
            runner.meter.emit("rpc_finished", unary.op, time.monotonic() - start, attempt, outcome)

    def _refresh(self, generation: int, deadline: float | None) -> None:
        """Re-authenticate on the client's loop (the token's lock lives there), and wait."""
        auth, loop = self._runner.auth, self._loop
        assert auth is not None
        assert loop is not None
        log.debug("auth token rejected, re-authenticating")
        wait = _REFRESH_WAIT if deadline is None else max(0.0, deadline - time.monotonic())
        future = asyncio.run_coroutine_threadsafe(auth.refresh(generation), loop)
        try:
            future.result(min(wait, _REFRESH_WAIT))
        except grpc.RpcError as exc:
            raise map_grpc_error(exc, op="authenticate", endpoints=self._runner.endpoints) from None
        except TimeoutError:  # the future's wait (the refresh itself raises only gRPC errors)
            future.cancel()
            if deadline is not None and time.monotonic() >= deadline:
                raise EtcdTimeoutError(FAIL_AFTER_EXPIRED) from None
            raise EtcdTimeoutError(
                f"authenticate on [{self._runner.endpoints}]: no answer within {_REFRESH_WAIT}s"
            ) from None
        except BaseException:
            future.cancel()
            raise


def _closed() -> ClientClosedError:
    return ClientClosedError("the sync client was closed")
