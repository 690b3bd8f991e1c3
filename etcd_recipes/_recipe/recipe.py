"""The base class of every stateful recipe: lifecycle, background failures, connection state.

Rules every recipe obeys (architecture §3.8):

* constructors do no I/O; ``await recipe.start()`` (or ``async with recipe:``) does;
* ``aclose()`` is idempotent; using a recipe after it raises :class:`RecipeClosedError`;
* failures in background tasks are recorded (``exceptions``, exception listeners) and never
  thrown into unrelated callers;
* ``connection_state`` follows watch-recovery and lease events (architecture §3.7); its
  listeners fire once per change;
* ``is_healthy()`` costs no I/O; ``await ping()`` does one count-only read.

Recipes never close the client they were given.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from typing_extensions import Self

from .._core.caller import CALLER, close_method
from .._core.keys import client_id as make_client_id
from .._core.listeners import ListenerSet
from .._core.logctx import library_logger, recipe_context
from .._core.metering import RecipeMeter, meter_for
from .._core.shield import CLEANUP_TIMEOUT, run_shielded
from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.validate import check_key_name, check_metrics_name, check_path
from ..client import check_client
from ..errors import AlreadyStartedError, NotStartedError, RecipeClosedError
from ..events import ConnectionState, LeaseEvent, WatchRecoveryEvent, state_after

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["BackgroundException", "Recipe"]

log = library_logger("etcd_recipes.recipe")

T = TypeVar("T")

ExceptionListener = Callable[[str, BaseException], Any]
StateListener = Callable[[ConnectionState, ConnectionState], Any]


@dataclass(frozen=True)
class BackgroundException:
    """A failure recorded from a recipe's background work: where (``context``) and what."""

    context: str
    exception: BaseException


_DYNAMIC_LOG_FIELDS = (
    ("lease_id", "etcd_lease_id"),
    ("revision", "etcd_revision"),
    ("fencing_token", "etcd_fencing_token"),
)


class Recipe:
    """Base class of stateful recipes. Subclasses implement ``_do_start`` / ``_do_close``.

    Example::

        from etcd_recipes import DistributedBarrier

        async with DistributedBarrier(client, prefix + "/deploy") as barrier:
            await barrier.set_barrier()
            assert barrier.is_healthy()
            print(barrier.connection_state)
    """

    one_shot: ClassVar[bool] = True
    """Whether ``start()`` may be called only once."""
    _path_arg: ClassVar[str] = "path"  # the constructor's name for it, in error messages
    _absolute_path: ClassVar[bool] = True  # False: any etcd key name (read-only views, Go naming)

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        *,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        self._client = check_client(client)
        self.metrics_name: str = check_metrics_name(metrics_name)
        """The low-cardinality ``name`` label of this recipe's metrics (``""``: none)."""
        self._meter_view: RecipeMeter | None = None
        check = check_path if self._absolute_path else check_key_name
        self.path: str = check(path, what=self._path_arg)
        """The recipe's key path."""
        self.client_id: str = client_id or make_client_id(type(self).__name__)
        """This instance's identity (``"<Class>:<7 random chars>"`` by default)."""
        self._lifecycle = "new"
        self._errors: list[BackgroundException] = []
        self._errors_lock = threading.Lock()
        self._exception_listeners = ListenerSet("exception")
        self._state = ConnectionState.CONNECTED
        self._state_listeners = ListenerSet("connection-state", self._record_listener_error)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._broadcasts: list[Broadcast[Any]] = []
        self._state_stream: Broadcast[ConnectionState] = self._broadcast(
            "connection-state", current=lambda: self._state
        )
        self._error_stream: Broadcast[BackgroundException] = self._broadcast(
            "background-exceptions"
        )

    # ------------------------------------------------------------------ identity

    @property
    def exception_context(self) -> str:
        """The recipe identity used in logs and exception contexts: ``"Kind[path]"``."""
        return f"{type(self).__name__}[{self.path}]"

    def __repr__(self) -> str:
        return f"<{self.exception_context} {self._lifecycle} {self._state.value}>"

    def _log_fields(self) -> dict[str, object]:
        """The structured log fields of this recipe now (see ``_core/logctx.py``).

        The identity, path and client id always; the lease id, revision and fencing token where the
        recipe has a ``lease_id``, ``revision`` or ``fencing_token`` property that reads as an
        ``int`` at this moment (one that raises or is ``None`` is left out).
        """
        fields: dict[str, object] = {
            "etcd_recipe": self.exception_context,
            "etcd_path": self.path,
            "etcd_client_id": self.client_id,
        }
        kind = type(self)
        for attr, field in _DYNAMIC_LOG_FIELDS:
            if isinstance(getattr(kind, attr, None), property):
                try:
                    value = getattr(self, attr)
                except Exception:
                    continue
                if isinstance(value, int) and not isinstance(value, bool):
                    fields[field] = value
        return fields

    # ------------------------------------------------------------------ lifecycle

    @property
    def is_started(self) -> bool:
        """Whether ``start()`` completed and ``aclose()`` has not been called."""
        return self._lifecycle == "started"

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose()`` was called."""
        return self._lifecycle == "closed"

    async def start(self) -> Self:
        """Start the recipe (I/O happens here, not in the constructor); returns ``self``."""
        self._check_open()
        if self._lifecycle in ("starting", "started"):
            if self.one_shot:
                raise AlreadyStartedError(f"{self.exception_context}: start() already called")
            return self
        self._lifecycle = "starting"
        try:
            with recipe_context(self.exception_context, self._log_fields):
                await self._do_start()
        except BaseException:
            if self._lifecycle == "starting":
                self._lifecycle = "new"
            raise
        if self._lifecycle == "starting":
            self._lifecycle = "started"
        return self

    async def aclose(self) -> None:
        """Release everything this recipe holds in etcd and stop its background work.

        Idempotent. Runs to completion even if the caller is being cancelled (shielded and
        bounded), so a cancelled ``async with`` still cleans up.
        """
        if self._lifecycle == "closed":
            return
        self._lifecycle = "closed"

        async def close() -> None:
            with recipe_context(self.exception_context, self._log_fields):
                try:
                    await self._do_close()
                except Exception as exc:
                    self._record_exception(exc, "close")
                finally:
                    await self._cancel_tasks()
                    for broadcast in self._broadcasts:
                        await broadcast.aclose()

        await run_shielded(
            close, what=f"closing {self.exception_context}", timeout=CLEANUP_TIMEOUT * 2
        )

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _do_start(self) -> None:
        """Subclass hook: the I/O of ``start()``."""

    async def _do_close(self) -> None:
        """Subclass hook: release held keys and leases."""

    @property
    def _meter(self) -> RecipeMeter:
        """This recipe's view of the client's metrics sink (labels filled in; never blocks or
        raises: see ``_core/metering.py``). The one way recipes report metrics."""
        view = self._meter_view
        if view is None:
            meter = meter_for(self._client.resilience.metrics)
            view = self._meter_view = meter.for_recipe(type(self).__name__, self.metrics_name)
        return view

    def _record_latency(self, name: str, started: float) -> None:
        """Report ``time.monotonic() - started`` seconds as the v1 latency ``name``."""
        self._meter.latency(name, time.monotonic() - started)

    def _check_open(self) -> None:
        if self._lifecycle == "closed":
            raise RecipeClosedError(f"{self.exception_context}: {close_method()} already called")

    def _check_started(self) -> None:
        self._check_open()
        if self._lifecycle != "started":
            raise NotStartedError(
                f"{self.exception_context}: call start() (or use 'async with') first"
            )

    # ------------------------------------------------------------------ background work

    def _broadcast(self, name: str, *, current: Callable[[], T] | None = None) -> Broadcast[T]:
        """A :class:`Broadcast` for one of the recipe's push surfaces; ``aclose()`` ends it
        (after the recipe's own close work, so events of that work still arrive)."""
        broadcast: Broadcast[T] = Broadcast(name, self._record_listener_error, current=current)
        self._broadcasts.append(broadcast)
        return broadcast

    def _spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Run ``coro`` in the background with the recipe's logging context; failures are
        recorded, never raised at a caller."""

        async def runner() -> T:
            CALLER.set(None)  # background work is its own caller, not the thread that began it
            with recipe_context(self.exception_context, self._log_fields):
                try:
                    return await coro
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._record_exception(exc, name)
                    raise

        task = asyncio.get_running_loop().create_task(
            runner(), name=f"{self.exception_context}:{name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: recorded already by the runner

    async def _cancel_tasks(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ------------------------------------------------------------------ failures

    @property
    def exceptions(self) -> list[BackgroundException]:
        """A snapshot of the failures recorded from background work (oldest first)."""
        with self._errors_lock:
            return list(self._errors)

    @property
    def has_exceptions(self) -> bool:
        """Whether any background failure was recorded."""
        return bool(self._errors)

    def clear_exceptions(self) -> None:
        """Forget the recorded background failures."""
        with self._errors_lock:
            self._errors.clear()

    def add_exception_listener(self, listener: ExceptionListener) -> None:
        """Call ``listener(context, exception)`` for each background failure.

        ``context`` is the recipe identity, e.g. ``"DistributedBarrier[/barriers/x]"``, plus
        where it happened. A listener that raises is logged, never re-recorded.
        """
        self._exception_listeners.add(listener)

    def remove_exception_listener(self, listener: ExceptionListener) -> None:
        """Stop calling ``listener``."""
        self._exception_listeners.remove(listener)

    def _record_exception(self, exc: BaseException, where: str | None = None) -> None:
        context = self.exception_context if not where else f"{self.exception_context}:{where}"
        with self._errors_lock:
            self._errors.append(BackgroundException(context, exc))
        log.warning("%s (%s): %s", context, self.client_id, exc, extra=self._log_fields())
        self._exception_listeners.emit(context, exc)
        self._error_stream.publish(BackgroundException(context, exc))

    def _record_listener_error(self, where: str, exc: BaseException) -> None:
        # A failing state listener is recorded; a failing exception listener only logged.
        self._record_exception(exc, where)

    # ------------------------------------------------------------------ connection state

    @property
    def connection_state(self) -> ConnectionState:
        """The recipe's view of its connection (CONNECTED, SUSPENDED, RECONNECTED or LOST)."""
        return self._state

    def add_connection_state_listener(self, listener: StateListener) -> None:
        """Call ``listener(new_state, previous_state)`` once per state change."""
        self._state_listeners.add(listener)

    def remove_connection_state_listener(self, listener: StateListener) -> None:
        """Stop calling ``listener``."""
        self._state_listeners.remove(listener)

    def connection_states(self) -> EventStream[ConnectionState]:
        """The connection state now, then each change, as an async iterator.

        Conflated: a consumer that falls behind skips to the newest state (it never
        overflows). Breaking out of the loop unregisters it.

        Example::

            from etcd_recipes import ConnectionState, DistributedBarrier

            barrier = DistributedBarrier(client, f"{prefix}/gate")
            async with barrier.connection_states() as states:
                assert await anext(states) is ConnectionState.CONNECTED
            await barrier.aclose()
        """
        return self._state_stream.stream(1, conflate=True)

    def background_exceptions(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[BackgroundException]:
        """Each background failure recorded from now on, as an async iterator (bounded by
        ``maxsize``; see :class:`~etcd_recipes.EventStream`).

        Example::

            from etcd_recipes import DistributedBarrier

            barrier = DistributedBarrier(client, f"{prefix}/gate")
            failures = barrier.background_exceptions()
            print(failures.buffered)  # 0: nothing has failed
            await failures.aclose()
            await barrier.aclose()
        """
        return self._error_stream.stream(maxsize)

    def _set_state(self, new: ConnectionState) -> None:
        old, self._state = self._state, new
        if old is new:
            return
        log.info(
            "%s: %s connection state %s -> %s",
            self.exception_context,
            self.client_id,
            old.value,
            new.value,
            extra=self._log_fields(),
        )
        self._state_listeners.emit(new, old)
        self._state_stream.publish(new)

    def _on_recovery_event(self, event: WatchRecoveryEvent | LeaseEvent) -> None:
        """Fold a watch-recovery or lease event into ``connection_state``."""
        self._set_state(state_after(event))

    def is_healthy(self) -> bool:
        """Not LOST and not closed. No I/O."""
        return self._state is not ConnectionState.LOST and self._lifecycle != "closed"

    async def ping(self, *, timeout: float = 2.0) -> bool:
        """Whether etcd answers one count-only read within ``timeout`` seconds (the client's
        :meth:`~etcd_recipes.EtcdClient.ping`); False instead of raising."""
        return await self._client.ping(timeout=timeout)
