"""The produce side shared by the queues of this family (not public): the producer's key
clock, value encoding, and the create-only write.

* :func:`key_millis` is a clock strictly increasing within this process, so that two enqueues
  in one millisecond keep their order where keys sort by their text; :func:`pace` keeps it
  within a second of the wall clock, and delayed items read their ready time from it
  (:func:`clock_millis`), so they sort among the producer's other items by time;
* :func:`create` writes new keys with a create-only compare, so two producers that draw the
  same key cannot overwrite each other; a transport failure retries the same keys and counts
  an earlier attempt that landed as done; a batch over the server's ``--max-txn-ops`` is
  refused whole, naming the limit.

Not guaranteed here: order across producers (keys sort by each producer's clock), or that a
value was written when the call raises after its retries ran out (it may have landed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._core.txn import AnyOp, Cmp, Compare, Op
from .._core.validate import check_values
from ..codecs import Codec, to_bytes
from ..errors import (
    EtcdConnectionError,
    EtcdTimeoutError,
    RetriesExhaustedError,
    TooManyOperationsError,
)
from ..types import RangeResult

if TYPE_CHECKING:
    from ..client import EtcdClient

MAX_KEY_CLASHES = 10  # fresh random suffixes tried when a new key already exists


class GuardFailed(Exception):
    """A guarded :func:`create`'s extra compare failed (nothing was written)."""


_last_millis = 0


def now_millis() -> int:
    return time.time_ns() // 1_000_000


MAX_DRIFT = 1000  # milliseconds the key clock may run ahead of the wall clock


async def pace() -> None:
    """Let the wall clock catch up when bursts of keys drew the key clock more than
    ``MAX_DRIFT`` ahead of it. Without it a producer enqueuing faster than one item per
    millisecond stamps its items ever further into the future: other producers' items would
    sort ahead of its for as long, and its delayed items would mature late by as much. A
    burst of up to ``MAX_DRIFT`` single enqueues passes at once; a sustained rate above 1,000
    single enqueues per second per process waits (``enqueue_all`` stamps a batch once)."""
    ahead = _last_millis - now_millis() - MAX_DRIFT
    if ahead > 0:
        await asyncio.sleep(ahead / 1000)


def clock_millis() -> int:
    """The producer clock now, without drawing from it: the wall clock, or -- after a burst
    of enqueues drew keys faster than one per millisecond -- the key clock ahead of it. A
    delayed item's ready time is read from it, so it sorts among this producer's items by
    time whatever the burst."""
    return max(now_millis(), _last_millis)


def key_millis() -> int:
    """The producer clock for a new key, strictly increasing within this process, so that two
    enqueues in one millisecond keep their order where keys are sorted by their text."""
    global _last_millis
    _last_millis = max(now_millis(), _last_millis + 1)
    return _last_millis


def encode(codec: Codec[Any] | None, value: object) -> bytes:
    """Bytes for ``value``: through ``codec``, or as bytes / UTF-8 text without one."""
    if codec is None:
        return to_bytes(value)  # type: ignore[arg-type]
    return codec.encode(value)


def check_batch(values: Iterable[object]) -> list[object]:
    return check_values(values)  # validate.py's rule (kept here: the queues' one import)


async def create(
    client: EtcdClient,
    make_keys: Callable[[], Sequence[str]],
    values: Sequence[bytes],
    *,
    guard: tuple[Sequence[Compare], Sequence[AnyOp]] = ((), ()),
) -> list[str]:
    """Write ``values`` under fresh keys in one transaction, each guarded "does not exist"
    (with ``guard``'s compares and writes too: :class:`GuardFailed` when those fail).

    A clash (another producer drew the same key) draws new keys. A transport failure retries
    the same keys under the client's RPC retry policy; if the retry then finds the first key
    holding our value, the earlier attempt had landed and counts as done.
    """
    policy = client.resilience.rpc.retry_policy
    await pace()
    keys = list(make_keys())
    uncertain = False
    failures = clashes = 0
    start = time.monotonic()
    while True:
        try:
            result = await client.txn(
                [*guard[0], *(Cmp.missing(k) for k in keys)],
                [*guard[1], *(Op.put(k, v) for k, v in zip(keys, values))],
                [Op.get(keys[0])],
            )
        except TooManyOperationsError as exc:
            if len(keys) < 2:
                raise
            limit = await server_txn_limit(client, keys[0], len(keys))
            raise TooManyOperationsError(
                f"an atomic batch is limited to {limit} values by the server; split it "
                f"(got {len(keys)}, nothing was written; etcd's --max-txn-ops)"
            ) from exc
        except (EtcdConnectionError, EtcdTimeoutError):
            failures += 1
            delay = policy.next_delay(failures, time.monotonic() - start)
            if delay is None:
                raise
            uncertain = True
            await asyncio.sleep(delay)
            continue
        if result.succeeded:
            return keys
        existing = result.responses[0]
        if (
            uncertain
            and isinstance(existing, RangeResult)
            and existing.kvs
            and existing.kvs[0].value == values[0]
        ):
            return keys  # our attempt that timed out had been committed
        if guard[0] and isinstance(existing, RangeResult) and not existing.kvs:
            raise GuardFailed  # no clash: the guard's compare failed
        clashes += 1
        if clashes >= MAX_KEY_CLASHES:
            raise RetriesExhaustedError(
                f"could not find a free key after {clashes} attempts (last: {keys[0]})",
                attempts=clashes,
            )
        keys, uncertain = list(make_keys()), False


async def server_txn_limit(client: EtcdClient, key: str, failing: int) -> int:
    """The server's ``--max-txn-ops``: the most operations one transaction branch may hold,
    found by a binary search below ``failing`` with read-only transactions (nothing written)."""
    ok, bad = 0, failing
    while bad - ok > 1:
        mid = (ok + bad) // 2
        try:
            await client.txn([], [Op.get(key, keys_only=True)] * mid)
        except TooManyOperationsError:
            bad = mid
        else:
            ok = mid
    return ok
