"""The values of an election: :class:`LeadershipTerm` (what a winner holds),
:class:`Participant`, the :class:`Elected` / :class:`Vacated` / :class:`LeadershipGap` events
an observer reports, and :func:`get_participants`.

A term's guarantees (fencing token, lost means lost) are the family's: see
:mod:`etcd_recipes.election`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from .._core.txn import Compare, Op
from .._core.validate import check_path
from .._recipe.hold import Hold
from ..client import check_client
from ..types import RangeResult, SortOrder, SortTarget
from ._keys import leader_key, leader_name, participants_prefix

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = [
    "DEFAULT_TTL",
    "Elected",
    "LeadershipEvent",
    "LeadershipGap",
    "LeadershipTerm",
    "Participant",
    "Vacated",
    "get_participants",
]

DEFAULT_TTL = 2
"""Default lease TTL (seconds) of leadership terms and participation keys."""


@dataclass(frozen=True)
class Participant:
    """One candidate of an election: its ``client_id`` and whether it currently leads.

    Example::

        from etcd_recipes import LeaderLatch, get_participants

        async with LeaderLatch(client, f"{prefix}/election", client_id="node-1") as latch:
            await latch.await_leadership(timeout=10)
            for p in await get_participants(client, f"{prefix}/election"):
                print(p.client_id, "(leader)" if p.is_leader else "")
    """

    client_id: str
    is_leader: bool


@dataclass(frozen=True)
class Elected:
    """``leader`` (a client id) holds the term whose fencing token is ``fencing_token``;
    ``value`` is what the leader proclaimed in this term (``proclaim()``), or ``None``.

    An ``Elected`` with the fencing token of the one before is not a new term: the leader
    proclaimed a new value.

    Example::

        from etcd_recipes import Elected, LeaderLatch, LeaderObserver

        async with LeaderLatch(client, f"{prefix}/election", client_id="node-1") as latch:
            await latch.await_leadership(timeout=10)
            async with LeaderObserver(client, f"{prefix}/election") as observer:
                event = observer.current
                assert isinstance(event, Elected) and event.leader == "node-1"
                print(event.leader, event.fencing_token)
    """

    leader: str
    fencing_token: int
    value: bytes | None = None


@dataclass(frozen=True)
class Vacated:
    """Nobody leads (the LEADER key does not exist).

    Example::

        from etcd_recipes import LeaderObserver, Vacated

        async with LeaderObserver(client, f"{prefix}/election") as observer:
            assert observer.current == Vacated()  # nobody runs for this election
    """


@dataclass(frozen=True)
class LeadershipGap:
    """Terms may have been missed: the observer could not see the election's history between
    ``after_revision`` and ``revision`` (it was compacted while the observer's watch was cut
    off, or the watch resumed from "now"). Terms may have begun and ended in between, unseen,
    with their fencing tokens. The next event is the state at ``revision``.

    Example::

        from etcd_recipes import LeadershipGap

        gap = LeadershipGap(after_revision=10, revision=42)
        print(f"terms between revisions {gap.after_revision} and {gap.revision} unseen")
    """

    after_revision: int
    revision: int


LeadershipEvent = Union[Elected, Vacated, LeadershipGap]
"""What a :class:`LeaderObserver` reports: :class:`Elected` or :class:`Vacated` (the state), or
:class:`LeadershipGap` (terms may have been missed; the state follows)."""


class LeadershipTerm:
    """One leadership term won by a :class:`LeaderSelector` or :class:`LeaderLatch`.

    A plain object (no I/O), usable from any thread: ``take_leadership`` receives it.

    Example::

        from etcd_recipes import LeaderSelector, LeadershipTerm, Op

        async def take_leadership(term: LeadershipTerm) -> None:
            fenced = [term.compare()]  # commits only while this term is current
            result = await client.txn(fenced, [Op.put(f"{prefix}/owner", term.leader_id)])
            assert result.succeeded  # False would mean: the term already ended

        async with LeaderSelector(client, f"{prefix}/election", take_leadership) as selector:
            term = await selector.run()
            print(term)  # <LeadershipTerm LeaderSelector:... token=... ended>
    """

    def __init__(self, hold: Hold, leader_id: str, value: str, key: str) -> None:
        self._hold = hold
        self.leader_id = leader_id
        """The client id of the leader (this instance)."""
        self.value = value
        """The LEADER key's value, ``"<client_id>:<7 random chars>"``."""
        self.key = key
        """The LEADER key, ``<path>/LEADER``."""
        self.fencing_token = hold.fencing_token
        """The LEADER key's create revision: strictly greater for every later term."""
        self.lease_id = hold.lease.id
        """The id of the term's lease (never re-granted)."""
        self._ended = False
        self._notified = False

    @property
    def is_current(self) -> bool:
        """True until the term ends (its body returned, the recipe closed) or is lost.

        A blocking ``take_leadership`` (sync facade, run in a thread) cannot be cancelled:
        poll this instead.
        """
        return not self._ended and not self._hold.is_lost

    @property
    def is_lost(self) -> bool:
        """Whether the term was lost (lease expired or LEADER key deleted) rather than ended."""
        return self._hold.is_lost

    @property
    def lost_cause(self) -> BaseException | None:
        """Why the term was lost (``None`` if it was not)."""
        return self._hold.lost_cause

    def compare(self) -> Compare:
        """A compare true only while this term's LEADER key exists: include it in a transaction
        to fence writes (``create_revision(LEADER) == fencing_token``)."""
        return self._hold.compare()

    def __repr__(self) -> str:
        state = "current" if self.is_current else ("lost" if self.is_lost else "ended")
        return f"<LeadershipTerm {self.leader_id} token={self.fencing_token} {state}>"


async def get_participants(client: EtcdClient, path: str) -> list[Participant]:
    """The candidates of the election at ``path``, in the order they joined (one consistent
    read of ``<path>/LEADER`` and ``<path>/participants/``; advisory).

    Example::

        from etcd_recipes import LeaderLatch, get_participants

        async with LeaderLatch(client, f"{prefix}/election", client_id="node-1"):
            names = [p.client_id for p in await get_participants(client, f"{prefix}/election")]
            assert names == ["node-1"]
    """
    client, path = check_client(client), check_path(path)
    result = await client.txn(
        [],
        [
            Op.get(leader_key(path)),
            Op.get(
                participants_prefix(path),
                prefix=True,
                sort_target=SortTarget.CREATE,
                sort_order=SortOrder.ASCEND,
            ),
        ],
    )
    leader_read, members = result.responses
    assert isinstance(leader_read, RangeResult)
    assert isinstance(members, RangeResult)
    leader = leader_name(leader_read.kvs[0].value) if leader_read.kvs else None
    out = []
    for kv in members.kvs:
        cid = kv.value.decode("utf-8", errors="replace")
        out.append(Participant(cid, cid == leader))
    return out
