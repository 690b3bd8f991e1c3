"""How a :class:`~etcd_recipes.ServiceProvider` picks one instance of the available ones.

A strategy is any object with ``select(instances) -> instance | None`` (``None`` only for an
empty list). It is called on every ``get_instance()``, synchronously, so it must be fast and
do no I/O. Stateful strategies (round-robin, sticky) belong to one provider: do not share one
instance between providers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .instance import ServiceInstance

__all__ = [
    "InstanceFilter",
    "ProviderStrategy",
    "RandomStrategy",
    "RoundRobinStrategy",
    "StickyStrategy",
]

InstanceFilter = Callable[[ServiceInstance[Any]], bool]
"""Which instances a provider may pick: a pure, fast function (it runs on every change)."""


@runtime_checkable
class ProviderStrategy(Protocol):
    """Picks one of ``instances`` (never empty unless nothing is available; then return
    ``None``).

    Example::

        from etcd_recipes import ProviderStrategy

        class First:
            def select(self, instances):
                return instances[0] if instances else None

        assert isinstance(First(), ProviderStrategy)
    """

    def select(self, instances: Sequence[ServiceInstance[Any]]) -> ServiceInstance[Any] | None:
        """One of ``instances``, or ``None`` when it is empty."""
        ...


class RoundRobinStrategy:
    """Each instance in turn (the default); stays valid when the list changes size.

    Example::

        from etcd_recipes import RoundRobinStrategy, ServiceInstance

        a, b = ServiceInstance("s", "", id="a"), ServiceInstance("s", "", id="b")
        rr = RoundRobinStrategy()
        assert [rr.select([a, b]).id for _ in range(3)] == ["a", "b", "a"]
    """

    __slots__ = ("_cursor",)

    def __init__(self) -> None:
        self._cursor = 0

    def select(self, instances: Sequence[ServiceInstance[Any]]) -> ServiceInstance[Any] | None:
        """The next instance in turn."""
        if not instances:
            return None
        cursor = self._cursor
        self._cursor = cursor + 1
        return instances[cursor % len(instances)]

    def __repr__(self) -> str:
        return f"RoundRobinStrategy(cursor={self._cursor})"


class RandomStrategy:
    """A uniformly random instance (stateless; may be shared).

    Example::

        from etcd_recipes import RandomStrategy, ServiceInstance

        a = ServiceInstance("s", "", id="a")
        assert RandomStrategy().select([a]) is a and RandomStrategy().select([]) is None
    """

    __slots__ = ()

    def select(self, instances: Sequence[ServiceInstance[Any]]) -> ServiceInstance[Any] | None:
        """A random instance."""
        return random.choice(instances) if instances else None

    def __repr__(self) -> str:
        return "RandomStrategy()"


class StickyStrategy:
    """The same instance (by **id**) while it is available, else ``delegate``'s pick, which
    is then remembered. Returns the instance's *current* version (an update of its payload
    does not move the traffic).

    Example::

        from etcd_recipes import RoundRobinStrategy, ServiceInstance, StickyStrategy

        a, b = ServiceInstance("s", "", id="a"), ServiceInstance("s", "", id="b")
        sticky = StickyStrategy(RoundRobinStrategy())
        assert [sticky.select([a, b]).id for _ in range(3)] == ["a", "a", "a"]
        assert sticky.select([b]).id == "b"  # a went away: moved, and stays on b
    """

    __slots__ = ("_delegate", "_id")

    def __init__(self, delegate: ProviderStrategy | None = None) -> None:
        self._delegate: ProviderStrategy = delegate if delegate is not None else RandomStrategy()
        self._id: str | None = None

    def select(self, instances: Sequence[ServiceInstance[Any]]) -> ServiceInstance[Any] | None:
        """The remembered instance if still listed, else a new one from the delegate."""
        if not instances:
            self._id = None
            return None
        if self._id is not None:
            for instance in instances:
                if instance.id == self._id:
                    return instance
        picked = self._delegate.select(instances)
        self._id = picked.id if picked is not None else None
        return picked

    def __repr__(self) -> str:
        return f"StickyStrategy({self._delegate!r}, current={self._id!r})"
