"""The assignment of a partitioner: rendezvous (highest-random-weight) hashing.

Each (member, item) pair gets a score, the first 8 bytes of ``blake2b(member NUL item)``
read big-endian; an item belongs to the member with the highest score (ties, practically
impossible, go to the greater member id). Why this one:

* **deterministic everywhere**: every process computes the same owner from the same member
  ids, whatever its Python version (``blake2b``, never ``hash()``, which is salted);
* **stable**: a member joining takes only the items it now wins (about ``1/(n+1)`` of them,
  from whoever held each); a member leaving gives away only its own items, spread over the
  rest. No other item moves -- sorted round-robin would move most items on every change.

Not guaranteed: an even split. With few items per member the counts vary (10 items over 5
members may give one member 4 and another 0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

__all__ = ["assignment", "owner_of"]


def _score(member: str, item: str) -> int:
    digest = hashlib.blake2b(f"{member}\0{item}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(item: str, members: Sequence[str]) -> str | None:
    """The member that owns ``item`` among ``members`` (``None`` without members).

    >>> owner_of("shard-1", ["a"])
    'a'
    """
    if not members:
        return None
    return max(members, key=lambda member: (_score(member, item), member))


def assignment(items: Iterable[str], members: Sequence[str], member: str) -> set[str]:
    """The items ``member`` owns among ``members`` (none if it is not one of them).

    >>> sorted(assignment(["x", "y"], ["a"], "a"))
    ['x', 'y']
    """
    if member not in members:
        return set()
    return {item for item in items if owner_of(item, members) == member}
