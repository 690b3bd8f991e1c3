"""Pure unit tests of the retry policies and of the RpcRunner funnel (no server needed)."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from etcd_recipes import (
    EtcdConnectionError,
    EtcdMetrics,
    EtcdTimeoutError,
    InvalidArgumentError,
    LeaseResilience,
    ResilienceConfig,
    RetriesExhaustedError,
    RetryPolicy,
    RpcResilience,
    WatchResilience,
)
from etcd_recipes._core.metering import meter_for
from etcd_recipes.client.rpc import RpcRunner, is_retriable
from etcd_recipes.errors import EtcdServerError, TooManyOperationsError
from etcd_recipes.resilience import Bounded, ExponentialBackoff, Never

# --------------------------------------------------------------------------- policies


def test_exponential_growth_without_jitter():
    p = RetryPolicy.exponential_backoff(initial_delay=0.1, max_delay=100, factor=2, jitter=0)
    assert [p.next_delay(a, 0.0) for a in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    p3 = RetryPolicy.exponential_backoff(initial_delay=1, max_delay=1000, factor=3, jitter=0)
    assert [p3.next_delay(a, 0.0) for a in (1, 2, 3)] == pytest.approx([1, 3, 9])
    flat = RetryPolicy.exponential_backoff(initial_delay=0.5, max_delay=10, factor=1, jitter=0)
    assert {flat.next_delay(a, 0.0) for a in range(1, 10)} == {0.5}


def test_exponential_cap():
    p = RetryPolicy.exponential_backoff(initial_delay=0.25, max_delay=2.0, jitter=0)
    delays = [p.next_delay(a, 0.0) for a in range(1, 12)]
    assert delays[:4] == pytest.approx([0.25, 0.5, 1.0, 2.0])
    assert all(d == 2.0 for d in delays[3:])
    # Huge attempt numbers neither overflow nor exceed the cap.
    assert p.next_delay(10_000, 0.0) == 2.0
    # Jitter never pushes a delay above the cap.
    pj = RetryPolicy.exponential_backoff(initial_delay=1, max_delay=2, jitter=0.5)
    assert all(pj.next_delay(a, 0.0) <= 2.0 for a in range(1, 200))


def test_jitter_bounds():
    random.seed(1234)
    p = RetryPolicy.exponential_backoff(initial_delay=1.0, max_delay=100, factor=2, jitter=0.25)
    for attempt in (1, 2, 3, 4):
        base = 2.0 ** (attempt - 1)
        samples = [p.next_delay(attempt, 0.0) for _ in range(500)]
        assert all(base * 0.75 <= d <= base * 1.25 for d in samples)
        # Jitter actually varies, and spreads over most of its range.
        assert max(samples) - min(samples) > base * 0.35
        assert len(set(samples)) > 100
    full = RetryPolicy.exponential_backoff(initial_delay=1.0, max_delay=10, jitter=1.0)
    assert all(0.0 <= full.next_delay(1, 0.0) <= 2.0 for _ in range(200))


def test_attempt_limit():
    p = RetryPolicy.exponential_backoff(initial_delay=0.1, jitter=0, max_attempts=3)
    assert p.next_delay(1, 0.0) is not None
    assert p.next_delay(3, 0.0) is not None
    assert p.next_delay(4, 0.0) is None
    assert p.next_delay(100, 0.0) is None


def test_elapsed_limit():
    p = RetryPolicy.exponential_backoff(initial_delay=0.1, jitter=0, max_elapsed=5.0)
    assert p.next_delay(1, 0.0) == pytest.approx(0.1)
    assert p.next_delay(50, 4.99) is not None
    assert p.next_delay(1, 5.0) is None
    assert p.next_delay(2, 60.0) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_delay": 0},
        {"initial_delay": -1},
        {"initial_delay": 2, "max_delay": 1},
        {"factor": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"max_attempts": 0},
        {"max_elapsed": 0},
        {"max_elapsed": -3},
    ],
)
def test_exponential_validation(kwargs):
    with pytest.raises(InvalidArgumentError):
        RetryPolicy.exponential_backoff(**kwargs)


def test_attempt_numbers_are_one_based():
    for policy in (
        RetryPolicy.exponential_backoff(),
        RetryPolicy.bounded(3),
        RetryPolicy.never(),
    ):
        with pytest.raises(InvalidArgumentError):
            policy.next_delay(0, 0.0)


def test_bounded():
    p = RetryPolicy.bounded(3, delay=0.5)
    assert isinstance(p, Bounded)
    assert [p.next_delay(a, 0.0) for a in (1, 2, 3)] == [0.5, 0.5, 0.5]
    assert p.next_delay(4, 0.0) is None
    assert p.next_delay(1, 1e9) == 0.5  # elapsed time does not matter
    assert RetryPolicy.bounded(1, delay=0).next_delay(1, 0.0) == 0
    with pytest.raises(InvalidArgumentError):
        RetryPolicy.bounded(0)
    with pytest.raises(InvalidArgumentError):
        RetryPolicy.bounded(2, delay=-1)


def test_never():
    p = RetryPolicy.never()
    assert isinstance(p, Never)
    assert p.next_delay(1, 0.0) is None
    assert p.next_delay(5, 100.0) is None


def test_forever():
    p = RetryPolicy.forever()
    assert isinstance(p, ExponentialBackoff)
    assert p.max_attempts is None
    assert p.max_elapsed is None
    assert p.next_delay(1, 0.0) == pytest.approx(0.25, rel=0.25)
    assert p.next_delay(1_000_000, 1e9) is not None
    assert p.next_delay(1_000_000, 1e9) <= p.max_delay  # type: ignore[operator]


def test_policies_are_immutable_and_shareable():
    p = RetryPolicy.exponential_backoff()
    with pytest.raises(AttributeError):
        p.initial_delay = 5  # type: ignore[misc]
    assert p == RetryPolicy.exponential_backoff()


def test_resilience_configs():
    with pytest.raises(InvalidArgumentError):
        RpcResilience(operation_timeout=0)
    with pytest.raises(InvalidArgumentError):
        LeaseResilience(heal_operation_timeout=-1)
    assert RpcResilience(operation_timeout=None).operation_timeout is None
    off = ResilienceConfig.disabled()
    assert isinstance(off.rpc.retry_policy, Never)
    assert off.rpc.operation_timeout is None
    assert isinstance(off.watch.retry_policy, Never)
    assert off.watch.progress_notify is False
    assert isinstance(off.lease.retry_policy, Never)
    assert isinstance(WatchResilience.disabled().retry_policy, Never)
    metrics = EtcdMetrics()
    assert ResilienceConfig().with_metrics(metrics).metrics is metrics
    default = RpcResilience()
    assert default.operation_timeout == 10.0
    assert isinstance(default.retry_policy, Bounded)


# --------------------------------------------------------------------------- RpcRunner


def _rpc_error(code: grpc.StatusCode, details: str = "x") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class RecordingMetrics(EtcdMetrics):
    """Records ``record_rpc`` calls; reading ``rpcs`` first waits for the sink's thread to
    deliver what the runner reported (events reach a sink off the event loop)."""

    def __init__(self) -> None:
        self._rpcs: list[tuple[str, float, int, bool]] = []

    @property
    def rpcs(self) -> list[tuple[str, float, int, bool]]:
        assert meter_for(self).flush(5.0)
        return self._rpcs

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        self._rpcs.append((op, duration, attempts, failed))


class FakeRpc:
    """A fake unary stub method: raises ``errors`` in turn (the way a stub raises
    ``AioRpcError``), then returns ``result`` as an awaitable call object (an asyncio task, which
    has the call's ``add_done_callback``/``cancel``/``await`` surface)."""

    def __init__(self, errors: list[BaseException] | None = None, *, always=None, result="ok"):
        self.errors = list(errors or [])
        self.always = always
        self.result = result
        self.calls: list[dict] = []

    def __call__(self, request, *, timeout, metadata):
        self.calls.append({"request": request, "timeout": timeout, "metadata": metadata})
        if self.always is not None:
            raise self.always
        if self.errors:
            raise self.errors.pop(0)
        return asyncio.ensure_future(self._respond())

    async def _respond(self):
        await asyncio.sleep(0)
        return self.result


def _runner(policy: RetryPolicy, timeout: float | None = 2.0):
    metrics = RecordingMetrics()
    runner = RpcRunner(RpcResilience(policy, timeout), metrics, None, "127.0.0.1:1")
    return runner, metrics


async def test_runner_success_first_try():
    runner, metrics = _runner(RetryPolicy.bounded(3, 0.0), timeout=1.5)
    fn = FakeRpc(result="value")
    assert await runner.call("get", fn, "req") == "value"
    assert fn.calls == [{"request": "req", "timeout": 1.5, "metadata": None}]
    (rec,) = metrics.rpcs
    assert rec[0] == "get"
    assert rec[2] == 1
    assert rec[3] is False
    assert rec[1] >= 0


async def test_runner_retries_then_succeeds():
    runner, metrics = _runner(RetryPolicy.bounded(5, 0.01))
    fn = FakeRpc(
        [
            _rpc_error(grpc.StatusCode.UNAVAILABLE),
            _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED),
            _rpc_error(grpc.StatusCode.INTERNAL),
        ]
    )
    assert await runner.call("put", fn, "req") == "ok"
    assert len(fn.calls) == 4
    assert metrics.rpcs[-1][2:] == (4, False)


async def test_runner_retries_per_policy_then_exhausts():
    runner, metrics = _runner(RetryPolicy.bounded(3, 0.01))
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    with pytest.raises(RetriesExhaustedError) as info:
        await runner.call("get", fn, "req")
    assert len(fn.calls) == 4  # the first attempt plus three retries
    assert info.value.attempts == 4
    cause = info.value.__cause__
    assert isinstance(cause, EtcdConnectionError)
    assert "connection refused" in str(cause)
    assert "127.0.0.1:1" in str(cause)
    assert "get" in str(info.value)
    assert metrics.rpcs == [("get", metrics.rpcs[0][1], 4, True)]


async def test_runner_deadline_exceeded_chains_a_timeout():
    runner, _ = _runner(RetryPolicy.bounded(1, 0.0))
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    with pytest.raises(RetriesExhaustedError) as info:
        await runner.call("get", fn, "req")
    assert isinstance(info.value.__cause__, EtcdTimeoutError)
    assert isinstance(info.value.__cause__, TimeoutError)


async def test_runner_elapsed_limit_stops_retrying():
    policy = RetryPolicy.exponential_backoff(initial_delay=0.05, jitter=0, max_elapsed=0.2)
    runner, _ = _runner(policy)
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(RetriesExhaustedError):
        await runner.call("get", fn, "req")
    assert loop.time() - t0 < 1.0
    # 0.05 + 0.1 + 0.2 of sleeping: the elapsed check ends it after 3 or 4 attempts.
    assert 2 <= len(fn.calls) <= 4


async def test_runner_non_retriable_raised_at_once():
    runner, metrics = _runner(RetryPolicy.bounded(5, 0.01))
    fn = FakeRpc(
        always=_rpc_error(
            grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request"
        )
    )
    with pytest.raises(TooManyOperationsError):
        await runner.call("txn", fn, "req")
    assert len(fn.calls) == 1
    assert metrics.rpcs[-1][2:] == (1, True)

    other = FakeRpc(always=_rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "odd"))
    with pytest.raises(EtcdServerError) as info:
        await runner.call("get", other, "req")
    assert len(other.calls) == 1
    assert info.value.code == "FAILED_PRECONDITION"
    assert info.value.details == "odd"


async def test_runner_plain_exceptions_are_not_retried():
    runner, _ = _runner(RetryPolicy.bounded(5, 0.01))
    fn = FakeRpc(always=ValueError("bug in caller"))
    with pytest.raises(ValueError, match="bug in caller"):
        await runner.call("get", fn, "req")
    assert len(fn.calls) == 1


async def test_runner_retry_false_single_attempt():
    runner, metrics = _runner(RetryPolicy.bounded(5, 0.01))
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(EtcdConnectionError) as info:
        await runner.call("txn", fn, "req", retry=False)
    assert not isinstance(info.value, RetriesExhaustedError)
    assert len(fn.calls) == 1
    assert metrics.rpcs[-1][2:] == (1, True)


async def test_runner_never_policy_raises_the_mapped_error():
    runner, _ = _runner(RetryPolicy.never())
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(EtcdConnectionError):
        await runner.call("get", fn, "req")
    assert len(fn.calls) == 1


async def test_runner_timeout_override_and_per_call_resilience():
    runner, _ = _runner(RetryPolicy.never(), timeout=3.0)
    fn = FakeRpc()
    await runner.call("get", fn, "r", timeout=0.25)
    await runner.call("get", fn, "r", timeout=None)
    await runner.call("get", fn, "r")
    assert [c["timeout"] for c in fn.calls] == [0.25, None, 3.0]

    failing = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(RetriesExhaustedError):
        await runner.call(
            "get", failing, "r", resilience=RpcResilience(RetryPolicy.bounded(2, 0.0), 0.5)
        )
    assert len(failing.calls) == 3
    assert {c["timeout"] for c in failing.calls} == {0.5}


async def test_runner_cancellation_propagates_unchanged():
    runner, metrics = _runner(RetryPolicy.bounded(5, 30.0))  # a long sleep between attempts
    fn = FakeRpc(always=_rpc_error(grpc.StatusCode.UNAVAILABLE))
    task = asyncio.create_task(runner.call("get", fn, "req"))
    while not fn.calls:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # now sleeping before attempt 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    await asyncio.sleep(0.1)
    assert len(fn.calls) == 1  # no further attempt after the cancellation
    assert metrics.rpcs[-1][2:] == (1, True)


async def test_runner_cancellation_during_the_attempt():
    runner, metrics = _runner(RetryPolicy.bounded(5, 0.0))
    calls: list[asyncio.Future] = []

    def slow(request, *, timeout, metadata):
        calls.append(asyncio.ensure_future(asyncio.sleep(30)))
        return calls[-1]

    task = asyncio.create_task(runner.call("get", slow, "req"))
    while not calls:
        await asyncio.sleep(0.01)
    task.cancel("caller's own")
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert info.value.args == ("caller's own",)  # the caller's exception, not a fresh one
    await asyncio.sleep(0)
    assert calls[0].cancelled()  # the in-flight call was cancelled too
    assert len(calls) == 1
    assert metrics.rpcs[-1][2:] == (1, True)


def test_is_retriable():
    assert is_retriable(_rpc_error(grpc.StatusCode.UNAVAILABLE))
    assert is_retriable(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert is_retriable(_rpc_error(grpc.StatusCode.INTERNAL))
    assert not is_retriable(_rpc_error(grpc.StatusCode.INVALID_ARGUMENT))
    assert not is_retriable(_rpc_error(grpc.StatusCode.CANCELLED))
    assert not is_retriable(ValueError())
