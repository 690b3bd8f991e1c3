"""Dead letters of a work queue: :class:`DeadLetter` (public as ``etcd_recipes.DeadLetter``)
and the operator reads and writes behind ``dead_letters()``, ``requeue_dead_letter()`` and
``purge_dead_letter()``.

Guaranteed: a dead letter is only moved or deleted while it is unchanged since it was read
(a compare on its mod revision), so two operators cannot both requeue one item. Not
guaranteed: nothing drains dead letters automatically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from .._core.txn import Cmp, Op
from ..codecs import Codec, ValueT
from ..types import RangeResult
from ._layout import WorkKeys, attempts_in, item_name
from ._take import decode

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DeadLetter"]


@dataclass(frozen=True)
class DeadLetter(Generic[ValueT]):
    """An item that exhausted ``max_deliveries``: its ``id``, decoded ``value`` and the number
    of ``attempts`` made.

    Example::

        from etcd_recipes import DeadLetter

        dead = DeadLetter(id="0001700000000000-abc", value=b"job", attempts=3)
        assert (dead.id, dead.value, dead.attempts) == ("0001700000000000-abc", b"job", 3)
    """

    id: str
    value: ValueT
    attempts: int


async def _list_dead(client: EtcdClient, keys: WorkKeys, codec: Codec[Any] | None) -> list[Any]:
    """The dead letters, oldest id first, with their attempt counts (one read)."""
    result = await client.txn(
        [], [Op.get(keys.dlq, prefix=True), Op.get(keys.attempts, prefix=True)]
    )
    dead, counts = result.responses
    assert isinstance(dead, RangeResult)
    assert isinstance(counts, RangeResult)
    attempts = {item_name(kv.key): attempts_in([kv]) for kv in counts.kvs}
    return [
        DeadLetter(item_name(kv.key), decode(codec, kv.value), attempts.get(item_name(kv.key), 0))
        for kv in dead.kvs
    ]


async def _requeue_dead(client: EtcdClient, keys: WorkKeys, name: str) -> bool:
    """Move dead letter ``name`` back to ``items/`` with a fresh attempt count."""
    kv = await client.get(keys.dlq + name)
    if kv is None:
        return False
    result = await client.txn(
        [Cmp.mod_revision(kv.key) == kv.mod_revision],
        [
            Op.put(keys.items + name, kv.value),
            Op.delete(kv.key),
            Op.delete(keys.attempts + name),
        ],
    )
    return result.succeeded


async def _purge_dead(client: EtcdClient, keys: WorkKeys, name: str) -> bool:
    """Delete dead letter ``name`` and its attempt count for good."""
    kv = await client.get(keys.dlq + name)
    if kv is None:
        return False
    result = await client.txn(
        [Cmp.mod_revision(kv.key) == kv.mod_revision],
        [Op.delete(kv.key), Op.delete(keys.attempts + name)],
    )
    return result.succeeded
