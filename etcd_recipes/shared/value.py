"""SharedValue: a durable, versioned value that every process can read, watch and
compare-and-set (Apache Curator's ``SharedValue``), and its :class:`Versioned` reading.

Guarantees and layout: see :mod:`etcd_recipes.shared`. ``start()`` creates the key with
``seed`` if it is missing (whoever creates it decides the seed), reads it, and opens a watch
from that read's revision + 1, live before ``start()`` returns.

Metrics (labelled with ``SharedValue`` / ``SharedCount`` and the ``metrics_name`` given):
every ``set`` and ``try_set`` is one ``shared_value_written`` (``operation`` ``set`` or
``try_set``, ``outcome`` ``ok``, ``conflict`` -- a ``try_set`` whose version was not current
-- or ``error``).

Not guaranteed: a value its codec cannot decode is not reported (it is recorded as a
background exception; ``current`` keeps the last good value and ``get()`` raises the
:class:`~etcd_recipes.errors.CodecError`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from .._core.streams import DEFAULT_STREAM_BUFFER, Broadcast, EventStream
from .._core.txn import Cmp, Op
from .._core.validate import check_count, check_revision
from .._recipe.recipe import Recipe
from ..client.watch import Watch
from ..codecs import Codec, ValueT, as_codec
from ..errors import CodecError, EtcdRecipeError, WatchFailedError
from ..events import ConnectionState, WatchFailed, WatchRecoveryEvent, WatchResubscribed
from ..types import EventType, KeyValue, RangeResult, WatchEvent

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["SharedValue", "Versioned"]


@dataclass(frozen=True)
class Versioned(Generic[ValueT]):
    """A shared value and its ``version``: the key's mod revision (``0``: the key does not
    exist, and ``value`` is the recipe's seed). Pass ``version`` to ``try_set``.

    Example::

        from etcd_recipes import SharedValue, UTF8

        async with SharedValue(client, f"{prefix}/mode", "blue", codec=UTF8) as mode:
            reading = await mode.get()
            assert reading.value == "blue" and reading.version > 0 and reading.exists
    """

    value: ValueT
    version: int

    @property
    def exists(self) -> bool:
        """Whether the key existed (``version > 0``)."""
        return self.version > 0


class SharedValue(Recipe, Generic[ValueT]):
    """A value at ``path`` shared through etcd: read it with its version, set it, set it only
    if it is still at a version (compare-and-set), and watch it change.

    ``codec`` encodes values (bytes without one); ``seed`` is the value the key is created
    with by ``start()`` when it is missing, and what a missing key reads as (at version 0).

    Example::

        from etcd_recipes import JSON, SharedValue

        async with SharedValue(client, f"{prefix}/config", {"replicas": 1}, codec=JSON) as cfg:
            seen = await cfg.get()
            assert await cfg.try_set({"replicas": 3}, seen.version)      # nobody wrote since
            assert not await cfg.try_set({"replicas": 5}, seen.version)  # stale version
            assert (await cfg.get()).value == {"replicas": 3}

    ``metrics_name`` is the ``name`` label of its metrics (low-cardinality; ``""``: none).
    """

    def __init__(
        self,
        client: EtcdClient,
        path: str,
        seed: ValueT,
        *,
        codec: Codec[ValueT] | None = None,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        super().__init__(client, path, client_id=client_id, metrics_name=metrics_name)
        self._codec: Codec[ValueT] = as_codec(codec)
        self._seed_data = self._codec.encode(seed)  # a seed the codec refuses fails here
        self.seed: ValueT = seed
        """The value the key is created with, and what a missing key reads as."""
        self._current: Versioned[ValueT] | None = None
        self._revision = 0  # the revision ``_current`` reflects
        self._changes: Broadcast[Versioned[ValueT]] = Broadcast(
            "shared-value", self._record_listener_error, current=lambda: self._current
        )
        self._broadcasts.append(self._changes)  # aclose() ends it
        self._recovery: Broadcast[WatchRecoveryEvent] = self._broadcast("watch-recovery")

    def __repr__(self) -> str:
        current = self._current
        held = "-" if current is None else f"version={current.version}"
        return f"<{self.exception_context} {self._lifecycle} {held} {self._state.value}>"

    # ---------------------------------------------------------------- reads

    @property
    def current(self) -> Versioned[ValueT]:
        """The value as the watch last delivered it (no I/O). Raises
        :class:`~etcd_recipes.errors.NotStartedError` before ``start()``."""
        self._check_started()
        assert self._current is not None
        return self._current

    @property
    def revision(self) -> int:
        """The etcd revision ``current`` reflects (every change up to it is applied)."""
        return self._revision

    async def get(self) -> Versioned[ValueT]:
        """The value and its version, read from etcd now (linearizable). A missing key reads
        as the seed at version 0.

        Example::

            from etcd_recipes import SharedValue, Versioned

            value = SharedValue(client, f"{prefix}/v", b"seed")
            assert await value.get() == Versioned(b"seed", 0)  # not started: no key yet
            await value.start()
            assert (await value.get()).version > 0  # start() created it
            await value.aclose()
        """
        self._check_open()
        return self._versioned(await self._client.get(self.path))

    # ---------------------------------------------------------------- writes

    async def set(self, value: ValueT) -> Versioned[ValueT]:
        """Write ``value`` whatever the current version; returns it with its new version.

        Example::

            from etcd_recipes import SharedValue

            async with SharedValue(client, f"{prefix}/v", b"a") as shared:
                written = await shared.set(b"b")
                assert (await shared.get()) == written
        """
        self._check_open()
        data = self._codec.encode(value)
        try:
            result = await self._client.put(self.path, data)
        except BaseException:
            self._meter.shared_value_written("set", "error")
            raise
        self._meter.shared_value_written("set", "ok")
        return Versioned(value, result.revision)

    async def try_set(self, value: ValueT, expected_version: int) -> bool:
        """Write ``value`` only if the key is still at ``expected_version`` (one transaction
        comparing its mod revision; ``0``: only if the key does not exist). ``False``: someone
        wrote (or deleted) since -- read again and decide.

        Example::

            from etcd_recipes import SharedValue

            async with SharedValue(client, f"{prefix}/v", b"a") as shared:
                seen = await shared.get()
                assert await shared.try_set(b"b", seen.version)
                assert not await shared.try_set(b"c", seen.version)  # b"b" was written since
        """
        expected = check_revision(expected_version, what="expected_version")
        self._check_open()
        data = self._codec.encode(value)
        try:
            result = await self._client.txn(
                [Cmp.mod_revision(self.path) == expected], [Op.put(self.path, data)]
            )
        except BaseException:
            self._meter.shared_value_written("try_set", "error")
            raise
        self._meter.shared_value_written("try_set", "ok" if result.succeeded else "conflict")
        return result.succeeded

    # ---------------------------------------------------------------- push surfaces

    def changes(self, maxsize: int = DEFAULT_STREAM_BUFFER) -> EventStream[Versioned[ValueT]]:
        """The current value, then every change, as an async iterator that ends when the
        recipe is closed (bounded by ``maxsize``; see :class:`~etcd_recipes.EventStream`).
        Raises :class:`~etcd_recipes.errors.WatchFailedError` after the buffered items if the
        watch gave up. After a compaction it yields the value re-read (and
        :meth:`recovery_events` a :class:`~etcd_recipes.WatchResynced`).

        Example::

            from etcd_recipes import SharedValue

            async with SharedValue(client, f"{prefix}/v", b"a") as shared:
                changes = shared.changes()
                assert (await anext(changes)).value == b"a"  # the current value first
                await shared.set(b"b")
                assert (await anext(changes)).value == b"b"
        """
        check_count(maxsize, what="maxsize")
        self._check_started()
        return self._changes.stream(maxsize)

    def add_listener(self, listener: Callable[[Versioned[ValueT]], Any]) -> None:
        """Call ``listener(versioned)`` for every later change, in order, from its own task (a
        slow or ``async`` listener delays only itself; one that raises is recorded)."""
        self._changes.add_listener(listener)

    def remove_listener(self, listener: Callable[[Versioned[ValueT]], Any]) -> None:
        """Stop calling ``listener``."""
        self._changes.remove_listener(listener)

    def recovery_events(
        self, maxsize: int = DEFAULT_STREAM_BUFFER
    ) -> EventStream[WatchRecoveryEvent]:
        """Each later recovery of the recipe's watch -- :class:`~etcd_recipes.WatchSuspended`
        (the stream failed), :class:`~etcd_recipes.WatchResubscribed` (live again, changes
        made meanwhile replayed), :class:`~etcd_recipes.WatchResynced` (history was compacted:
        the value was re-read and reported), :class:`~etcd_recipes.WatchFailed` -- the events
        that drive ``connection_state``, as an async iterator ending when the recipe closes.

        Example::

            from etcd_recipes import SharedValue

            async with SharedValue(client, f"{prefix}/v", b"a") as shared:
                recoveries = shared.recovery_events()
                print(recoveries.buffered)  # 0: nothing to recover from yet
        """
        return self._recovery.stream(maxsize)

    # ---------------------------------------------------------------- lifecycle

    async def _do_start(self) -> None:
        result = await self._client.txn(
            [Cmp.missing(self.path)],
            [Op.put(self.path, self._seed_data), Op.get(self.path)],
            [Op.get(self.path)],
        )
        read = result.responses[-1]
        assert isinstance(read, RangeResult)
        self._apply_read(read, notify=False)
        if self._current is None:  # the key holds what the codec cannot decode
            self._current = Versioned(self.seed, 0)
        watch = self._client.watch(
            self.path, start_revision=self._revision + 1, resync=self._resync
        )
        await watch.start()  # live before start() returns
        self._spawn(self._follow(watch), "watch")

    async def _resync(self) -> int:
        """The watch's resync hook: the history since ``revision`` was compacted."""
        read = await self._client.range(self.path)
        self._apply_read(read)
        return read.revision + 1

    async def _follow(self, watch: Watch) -> None:
        failure: EtcdRecipeError
        try:
            async with watch:
                async for item in watch.items():
                    if isinstance(item, WatchEvent):
                        kv = item.kv if item.type is EventType.PUT else None
                        self._apply(kv, item.kv.mod_revision)
                        continue
                    self._on_recovery_event(item)
                    self._recovery.publish(item)
                    if isinstance(item, WatchResubscribed) and item.resume_revision == 0:
                        try:  # resumed from "now": what happened meanwhile is not replayed
                            self._apply_read(await self._client.range(self.path))
                        except EtcdRecipeError as exc:
                            self._record_exception(exc, "re-read")
                    elif isinstance(item, WatchFailed):
                        break
            failure = WatchFailedError(f"{self.exception_context}: the watch failed")
        except EtcdRecipeError as exc:  # the watch failed for good, or the client was closed
            failure = exc
        if self.is_closed:
            return
        self._record_exception(failure, "watch")
        self._set_state(ConnectionState.LOST)
        self._changes.fail(failure)

    def _apply_read(self, read: RangeResult, *, notify: bool = True) -> None:
        if read.revision < self._revision:
            return  # older than what was applied already
        self._apply(read.kvs[0] if read.kvs else None, read.revision, notify=notify)

    def _apply(self, kv: KeyValue | None, revision: int, *, notify: bool = True) -> None:
        if revision <= self._revision and self._current is not None:
            return  # replayed, or covered by a later read
        self._revision = revision
        try:
            new = self._versioned(kv)
        except CodecError as exc:
            self._record_exception(exc, "decode")
            return
        if self._current is not None and new.version == self._current.version:
            return  # unchanged (a re-read that found what the watch delivered)
        self._current = new
        if notify:
            self._changes.publish(new)

    def _versioned(self, kv: KeyValue | None) -> Versioned[ValueT]:
        if kv is None:
            return Versioned(self.seed, 0)
        try:
            return Versioned(self._codec.decode(kv.value), kv.mod_revision)
        except CodecError:
            raise
        except Exception as exc:
            raise CodecError(f"{self.exception_context}: cannot decode the value: {exc}") from exc
