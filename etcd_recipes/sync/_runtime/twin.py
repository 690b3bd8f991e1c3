"""Base class and helpers of the generated blocking twins (hand-written, not generated).

A twin holds the async object it mirrors (``_a``), the :class:`~.runtime.Runtime` whose loop
owns that object (``_rt``) and, for objects derived from a client, the client's twin
(``_root``), which keeps the client -- and so the loop -- alive while the object is in use.
Twins are registered per async class so :meth:`Runtime.twin` can wrap results generically.

Example::

    import etcd_recipes
    from etcd_recipes.sync._runtime.twin import SyncTwin, twin_class_for

    assert isinstance(client, SyncTwin)  # so is every object the facade hands out
    assert twin_class_for(etcd_recipes.EtcdClient) is type(client)
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Generic, TypeVar

from ...errors import InvalidArgumentTypeError
from .calls import running_loop_here
from .runtime import Runtime, register_twin_class, twin_class_for

__all__ = ["SyncContextManager", "SyncIterator", "SyncTwin", "check_twin", "twin_class_for"]

T = TypeVar("T")


def check_twin(value: object, what: str) -> None:
    """The first line of every generated constructor and function taking a facade object
    (a client): anything else is refused with the typed argument error naming ``what``, not
    an ``AttributeError`` from inside (validate.py's rule for the async API's ``client``)."""
    if not isinstance(value, SyncTwin):
        hint = ""
        if type(value).__module__.startswith("etcd_recipes"):
            hint = " (an async object: use it with the async recipes of etcd_recipes)"
        raise InvalidArgumentTypeError(
            f"{what} must be an EtcdClient from etcd_recipes.sync.connect(), "
            f"not {type(value).__name__}{hint}"
        )


class SyncTwin:
    """Base of every generated blocking twin."""

    _a: Any
    _rt: Runtime
    _root: SyncTwin | None
    _finalizer: Callable[[], object] | None

    def __init_subclass__(cls, /, twin_of: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if twin_of is not None:
            register_twin_class(twin_of, cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            f"{type(self).__name__} objects are created by the facade (connect(), "
            "client.watch(), client.lease(), ...), not directly"
        )

    def _bind(self, rt: Runtime, obj: Any, root: SyncTwin | None) -> None:
        """Attach the async ``obj``; ``root=None`` makes this twin the runtime's owner."""
        self._rt = rt
        self._a = obj
        self._root = root
        self._finalizer = None
        if root is None:
            rt.root = obj
            # Also runs at interpreter exit if the user never closed the client.
            self._finalizer = weakref.finalize(self, rt.stop)
        rt.register(self)

    def _owner(self) -> SyncTwin:
        return self._root if self._root is not None else self

    def _twin(self, obj: Any) -> Any:
        return self._rt.twin(obj, self._owner())

    def _release(self) -> None:
        """Stop the runtime if this twin owns it (the client); a no-op for other objects.

        Also a no-op in a thread with a running event loop: the close that led here was
        refused there (``UsageError``), and the client stays usable.
        """
        if self._finalizer is None or running_loop_here():
            return
        self._finalizer()

    def __repr__(self) -> str:
        return f"<blocking {self._a!r}>"


def _same(value: Any) -> Any:
    return value


class SyncIterator(Generic[T]):
    """A blocking iterator over an async iterator that lives on a runtime's loop."""

    def __init__(
        self, rt: Runtime, ait: AsyncIterator[Any], convert: Callable[[Any], T] = _same
    ) -> None:
        self._rt = rt
        self._ait = ait
        self._convert = convert

    def __iter__(self) -> SyncIterator[T]:
        return self

    def __next__(self) -> T:
        return self._convert(self._rt.next(self._ait.__anext__))

    def close(self) -> None:
        """Close the async iterator (``aclose()``) if it has one."""
        aclose = getattr(self._ait, "aclose", None)
        if aclose is not None:
            self._rt.call_closing(aclose)

    def __enter__(self) -> SyncIterator[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncContextManager(Generic[T]):
    """A blocking ``with`` over an async context manager (entered and exited in one task)."""

    def __init__(
        self,
        rt: Runtime,
        acm: AbstractAsyncContextManager[Any],
        convert: Callable[[Any], T] = _same,
    ) -> None:
        self._rt = rt
        self._acm = acm
        self._convert = convert

    def __enter__(self) -> T:
        return self._convert(self._rt.enter(self, self._acm))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = self._rt.exit(self, exc_type, exc, tb)
        return result
