"""The sweeps of a work queue (not public): orphans back to the queue, matured delayed items
promoted. Every consumer runs them -- when a receive notices work for them, and from its
sweeper every ``sweep_interval``.

Guaranteed: an orphan (a payload in flight with no claim marker) returns to its **original**
key, or to the dead letters (with its reason) once its attempts reached ``max_deliveries``,
only while it is still an orphan and unchanged (compares on the marker's absence and the
payload's mod revision), so consumers sweeping at once move it once; a matured delayed item
is promoted under its ready-time name (an item requeued with a delay: under its own id), or
under a fresh suffix if another producer's item took that name.
The metrics hook hears of each sweep's returns (``queue_redelivered``) and dead letters (a
``dead_letter`` operation each, timed from its read to its move).
Not guaranteed: promptness (a sweep may fail and is retried at the next pass).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .._core.keys import pad, random_token
from .._core.logctx import library_logger
from .._core.txn import AnyOp, Cmp, Op
from ..errors import EtcdRecipeError
from ..types import RangeResult
from ._layout import Snapshot, WorkKeys, attempts_in, item_name, promoted_name, ready_millis
from ._produce import now_millis

if TYPE_CHECKING:
    from .._core.metering import RecipeMeter
    from ..client import EtcdClient
    from .config import WorkQueueConfig

log = library_logger("etcd_recipes.work_queue")


async def reclaim_orphans(
    client: EtcdClient,
    keys: WorkKeys,
    max_deliveries: int,
    context: str,
    report: Callable[[bool, float], None] | None = None,
) -> int:
    """Return every orphaned in-flight item to its original key (or the dead letters);
    ``report(dead, seconds)`` is told of each item moved (``dead``: to the dead letters) and
    how long its move took."""
    listing = await client.txn(
        [],
        [
            Op.get(keys.claimed, prefix=True, keys_only=True),
            Op.get(keys.claims, prefix=True, keys_only=True),
        ],
    )
    claimed, claims = listing.responses
    assert isinstance(claimed, RangeResult)
    assert isinstance(claims, RangeResult)
    live = {item_name(kv.key) for kv in claims.kvs}
    returned = 0
    for kv in claimed.kvs:
        name = item_name(kv.key)
        if name not in live and await reclaim(
            client, keys, name, kv.mod_revision, max_deliveries, context, report
        ):
            returned += 1
    return returned


async def reclaim(
    client: EtcdClient,
    keys: WorkKeys,
    name: str,
    mod_revision: int,
    max_deliveries: int,
    context: str,
    report: Callable[[bool, float], None] | None = None,
) -> bool:
    started = time.monotonic()
    claimed_key = keys.claimed + name
    read = await client.txn([], [Op.get(claimed_key), Op.get(keys.attempts + name)])
    payload, counts = read.responses
    assert isinstance(payload, RangeResult)
    assert isinstance(counts, RangeResult)
    if not payload.kvs or payload.kvs[0].mod_revision != mod_revision:
        return False
    attempts = attempts_in(counts.kvs)
    dead = attempts >= max_deliveries
    ops = return_ops(keys, name, payload.kvs[0].value, dead=dead, attempts=attempts)
    result = await client.txn(
        [Cmp.missing(keys.claims + name), Cmp.mod_revision(claimed_key) == mod_revision],
        [Op.delete(claimed_key), *ops],
    )
    if result.succeeded and report is not None:
        report(dead, time.monotonic() - started)
    if result.succeeded and dead:
        log.warning("%s: %s dead-lettered after %d deliveries", context, name, attempts)
    elif result.succeeded:
        log.info("%s: orphaned %s returned to the queue", context, name)
    return result.succeeded


def exhausted(attempts: int) -> str:
    """The failure reason of an item orphaned on its last allowed delivery."""
    return f"max_deliveries: orphaned on delivery {attempts}, the last allowed"


def return_ops(keys: WorkKeys, name: str, data: bytes, *, dead: bool, attempts: int) -> list[AnyOp]:
    """The writes returning an orphan's payload: to its original key, or -- ``dead`` -- to the
    dead letters with its reason beside it (same revision: see ``dead_letters``)."""
    if not dead:
        return [Op.put(keys.items + name, data)]
    return [Op.put(keys.dlq + name, data), Op.put(keys.reasons + name, exhausted(attempts))]


class Sweeps:
    """The sweeps of one work-queue consumer: when a receive notices work for them, and every
    ``sweep_interval`` from its sweeper (:meth:`forever`). ``touched`` runs before each (a
    snapshot kept from a claim is stale once items move)."""

    __slots__ = ("client", "config", "context", "keys", "meter", "on_error", "snapshot", "touched")

    def __init__(
        self,
        client: EtcdClient,
        keys: WorkKeys,
        config: WorkQueueConfig,
        context: str,
        *,
        touched: Callable[[], None],
        snapshot: Callable[[], Awaitable[Snapshot]],
        on_error: Callable[[Exception], None],
        meter: Callable[[], RecipeMeter],
    ) -> None:
        self.client, self.keys, self.config, self.context = client, keys, config, context
        self.touched, self.snapshot, self.on_error = touched, snapshot, on_error
        self.meter = meter

    async def reclaim(self) -> int:
        """Return the orphans; the metrics hook hears of them: one ``queue_redelivered`` per
        sweep that returned any, one ``dead_letter`` operation per orphan dead-lettered."""
        self.touched()
        meter, redelivered = self.meter(), 0

        def report(dead: bool, seconds: float) -> None:
            nonlocal redelivered
            if dead:
                meter.queue_op("dead_letter", seconds, "ok")
            else:
                redelivered += 1

        max_deliveries = self.config.max_deliveries
        try:
            return await reclaim_orphans(
                self.client, self.keys, max_deliveries, self.context, report
            )
        finally:
            if redelivered:
                meter.redelivered(redelivered)

    async def promote(self) -> int:
        self.touched()
        return await promote_matured(self.client, self.keys)

    async def forever(self) -> None:
        """Sweep every ``sweep_interval``, the first pass jittered (fleets do not sweep in
        step); transport failures are logged (the next pass retries), others reported."""
        period = self.config.sweep_interval
        await asyncio.sleep(period + random.uniform(0, period / 2))
        while True:
            try:
                snap = await self.snapshot()
                if snap.delayed is not None and ready_millis(snap.delayed) <= now_millis():
                    await self.promote()
                if snap.orphans:
                    await self.reclaim()
            except EtcdRecipeError as exc:
                log.debug("%s: sweep failed: %s", self.context, exc)
            except Exception as exc:
                self.on_error(exc)
            await asyncio.sleep(period)


async def promote_matured(client: EtcdClient, keys: WorkKeys) -> int:
    """Move every matured delayed item to ``items/`` under its ready-time name."""
    promoted = 0
    rename: str | None = None
    while True:
        # Only what is due: a read bounded at now costs what has matured, not every delayed item.
        due = keys.delayed + pad(now_millis() + 1, 19)
        read = await client.range(keys.delayed, range_end=due, limit=1)
        if not read.kvs:
            return promoted
        head = read.kvs[0]
        if ready_millis(head) > now_millis():
            return promoted
        target = keys.items + (rename or promoted_name(head))
        result = await client.txn(
            [Cmp.mod_revision(head.key) == head.mod_revision, Cmp.missing(target)],
            [Op.delete(head.key), Op.put(target, head.value)],
            [Op.get(head.key, keys_only=True), Op.get(target, keys_only=True)],
        )
        if result.succeeded:
            promoted, rename = promoted + 1, None
            continue
        source, clash = result.responses
        assert isinstance(source, RangeResult)
        assert isinstance(clash, RangeResult)
        unchanged = source.kvs and source.kvs[0].mod_revision == head.mod_revision
        # Another producer's item took the name (same millisecond, same suffix): promote
        # under a fresh suffix. Otherwise another consumer promoted it: re-read.
        rename = (
            f"{pad(ready_millis(head), 19)}-{random_token(3)}" if unchanged and clash.kvs else None
        )
