"""Dead letters of a work queue: :class:`DeadLetter` (public as ``etcd_recipes.DeadLetter``)
and the operator reads and writes behind ``dead_letters()``, ``requeue_dead_letter()`` and
``purge_dead_letter()``.

Guaranteed: a dead letter is only moved or deleted while it is unchanged since it was read
(a compare on its mod revision), so two operators cannot both requeue one item; its reason
(``<p>/reasons/<id>``) is written in the transaction that made it and deleted with it; a
payload that does not decode is listed (raw bytes and the decode error), never hidden. Not
guaranteed: nothing drains dead letters automatically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic

from .._core.txn import Cmp, Op
from ..codecs import Codec, ValueT
from ..errors import CodecError
from ..types import KeyValue, RangeResult
from ._layout import WorkKeys, attempts_in, item_name
from ._take import decode_at

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["DeadLetter"]


_NO_VALUE: Any = object()


class DeadLetter(Generic[ValueT]):
    """A dead-lettered item: its ``id``, decoded ``value``, the ``attempts`` made, the failure
    ``reason`` (``None`` for one written without a reason, e.g. by the Kotlin library) and the
    ``raw`` payload bytes.

    A value that does not decode through the queue's codec (reason ``"undecodable"``) is
    listed too: :attr:`error` is the :class:`~etcd_recipes.errors.CodecError`, :attr:`raw`
    the bytes, and reading :attr:`value` raises that error.

    Example::

        from etcd_recipes import DeadLetter

        dead = DeadLetter(id="0001700000000000-abc", value=b"job", attempts=3, reason="boom")
        assert (dead.id, dead.value, dead.attempts, dead.reason) == (
            "0001700000000000-abc", b"job", 3, "boom"
        )
        assert dead.error is None and dead.raw == b"job"
    """

    __slots__ = ("_value", "attempts", "error", "id", "raw", "reason")

    def __init__(
        self,
        id: str,
        value: ValueT,
        attempts: int,
        reason: str | None = None,
        *,
        raw: bytes | None = None,
        error: CodecError | None = None,
    ) -> None:
        self.id: str = id
        """The item's id."""
        self._value = value
        self.attempts: int = attempts
        """Deliveries made (0 when its count is missing)."""
        self.reason: str | None = reason
        """Why it was dead-lettered (``None``: no reason stored)."""
        self.raw: bytes = raw if raw is not None else value if isinstance(value, bytes) else b""
        """The payload as stored."""
        self.error: CodecError | None = error
        """The decode error of an undecodable payload (``None`` when it decoded)."""

    @property
    def value(self) -> ValueT:
        """The decoded payload; raises :attr:`error` for an undecodable one."""
        if self.error is not None:
            raise self.error
        return self._value

    def __eq__(self, other: object) -> bool:
        # Decoded letters compare by value (``raw`` follows from it), undecodable ones by bytes.
        if not isinstance(other, DeadLetter):
            return NotImplemented
        if (self.error is None) != (other.error is None):
            return False
        mine = self.raw if self.error is not None else self._value
        theirs = other.raw if other.error is not None else other._value
        same = (self.id, self.attempts, self.reason) == (other.id, other.attempts, other.reason)
        return same and bool(mine == theirs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = f"error={self.error}" if self.error is not None else f"value={self._value!r}"
        return (
            f"DeadLetter(id={self.id!r}, {shown}, attempts={self.attempts}, reason={self.reason!r})"
        )


def _letter(codec: Codec[Any] | None, kv: KeyValue, attempts: int, reason: str | None) -> Any:
    name = item_name(kv.key)
    try:
        value = decode_at(codec, kv, "dead_letters()", "listed with its raw bytes")
    except CodecError as exc:
        return DeadLetter(name, _NO_VALUE, attempts, reason, raw=kv.value, error=exc)
    return DeadLetter(name, value, attempts, reason, raw=kv.value)


async def _list_dead(client: EtcdClient, keys: WorkKeys, codec: Codec[Any] | None) -> list[Any]:
    """The dead letters, oldest id first, with their attempt counts and reasons (one read).

    A reason counts only when written with its dead letter (its mod revision is the dead
    letter's create revision): a stale one, left by a client that purged without knowing
    ``reasons/``, is ignored."""
    result = await client.txn(
        [],
        [
            Op.get(keys.dlq, prefix=True),
            Op.get(keys.attempts, prefix=True),
            Op.get(keys.reasons, prefix=True),
        ],
    )
    dead, counts, notes = result.responses
    assert isinstance(dead, RangeResult)
    assert isinstance(counts, RangeResult)
    assert isinstance(notes, RangeResult)
    attempts = {item_name(kv.key): attempts_in([kv]) for kv in counts.kvs}
    reasons = {item_name(kv.key): kv for kv in notes.kvs}
    letters = []
    for kv in dead.kvs:
        name = item_name(kv.key)
        note = reasons.get(name)
        reason = None
        if note is not None and note.mod_revision == kv.create_revision:
            reason = note.value.decode("utf-8", "replace")
        letters.append(_letter(codec, kv, attempts.get(name, 0), reason))
    return letters


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
            Op.delete(keys.reasons + name),
        ],
    )
    return result.succeeded


async def _purge_dead(client: EtcdClient, keys: WorkKeys, name: str) -> bool:
    """Delete dead letter ``name``, its attempt count, reason and trace context for good."""
    kv = await client.get(keys.dlq + name)
    if kv is None:
        return False
    result = await client.txn(
        [Cmp.mod_revision(kv.key) == kv.mod_revision],
        [
            Op.delete(kv.key),
            Op.delete(keys.attempts + name),
            Op.delete(keys.reasons + name),
            Op.delete(keys.trace + name),
        ],
    )
    return result.succeeded
