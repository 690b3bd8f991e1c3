"""Read-only inspection of a semaphore at a path, for operators: :func:`semaphore_state` (the
``etcd-recipes semaphore show`` command uses it).

It reads the semaphore's own keys (``<path>/permits``, the 4-byte big-endian permit count,
and ``<path>/holders/``, one key per acquisition, waiters included -- see
:mod:`etcd_recipes.locks.semaphore`), with the key names the semaphore itself builds.

Guaranteed: one read transaction (permit count and holder keys at one revision); nothing is
written and no lease is taken; holders and waiters are told apart by the semaphore's own rule
(the first ``permits`` keys by create revision hold a permit).

Not guaranteed: the answer is stale once returned (advisory); a waiter that is being admitted
right now may still show as a waiter.

Example::

    from etcd_recipes import DistributedSemaphore
    from etcd_recipes.locks.inspection import semaphore_state

    semaphore = DistributedSemaphore(client, f"{prefix}/uploads", permits=2)
    async with semaphore:
        state = await semaphore_state(client, f"{prefix}/uploads")
        assert state is not None and state.permits == 2 and len(state.holders) == 1
    await semaphore.aclose()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.txn import Op
from .._core.validate import check_client, check_path
from ..codecs import INT32
from ..errors import CodecError, InvalidArgumentError
from ..types import RangeResult, SortOrder, SortTarget
from .hold import LockParticipant
from .semaphore import DistributedSemaphore

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["SemaphoreState", "semaphore_state"]


@dataclass(frozen=True)
class SemaphoreState:
    """A semaphore as of one read at ``revision``: its ``permits`` (``None`` when the count key
    is missing: no instance has used the path yet, or it was deleted), the ``holders`` (at most
    ``permits``) and the ``waiters`` in line order.

    Example::

        from etcd_recipes.locks.inspection import semaphore_state

        state = await semaphore_state(client, f"{prefix}/uploads")
        if state is not None:
            print(state.permits, [h.value for h in state.holders], len(state.waiters))
    """

    path: str
    permits: int | None
    holders: list[LockParticipant]
    waiters: list[LockParticipant]
    revision: int


async def semaphore_state(client: EtcdClient, path: str) -> SemaphoreState | None:
    """The semaphore at ``path`` (one read), or ``None`` when it has neither a permit count
    nor holder keys. Raises :class:`~etcd_recipes.errors.InvalidArgumentError` when the
    ``permits`` key is not a 4-byte count (``path`` is not a semaphore).

    Example::

        from etcd_recipes.locks.inspection import semaphore_state

        assert await semaphore_state(client, f"{prefix}/nothing-here") is None
    """
    client, path = check_client(client), check_path(path)
    probe = DistributedSemaphore(client, path, 1)  # for its key names only: never used
    try:
        permits_key, holders = probe._permits_key, probe._holders
    finally:
        await probe.aclose()
    count, keys = (
        await client.txn(
            [],
            [
                Op.get(permits_key),
                Op.get(
                    holders,
                    prefix=True,
                    sort_target=SortTarget.CREATE,
                    sort_order=SortOrder.ASCEND,
                ),
            ],
        )
    ).responses
    assert isinstance(count, RangeResult)
    assert isinstance(keys, RangeResult)
    if not count.kvs and not keys.kvs:
        return None
    permits = None
    if count.kvs:
        try:
            permits = INT32.decode(count.kvs[0].value)
        except CodecError:
            raise InvalidArgumentError(
                f"{path} is not a semaphore: {permits_key} holds {count.kvs[0].value[:16]!r}, "
                "not a 4-byte permit count"
            ) from None
    line = [
        LockParticipant(
            kv.key,
            kv.lease,
            kv.create_revision,
            permits is not None and rank < permits,
            kv.value,
        )
        for rank, kv in enumerate(keys.kvs)
    ]
    return SemaphoreState(
        path,
        permits,
        [p for p in line if p.is_holder],
        [p for p in line if not p.is_holder],
        count.revision,
    )
