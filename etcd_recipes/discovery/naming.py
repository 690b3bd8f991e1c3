"""Interop with etcd's Go gRPC naming (``go.etcd.io/etcd/client/v3/naming/endpoints``).

Go services register endpoints as keys ``<target>/<key>`` whose value is Go's
``json.Marshal`` of ``{"Op":0,"Addr":"host:port","Metadata":...}``, and Go clients dial
``etcd:///<target>``. Here, :class:`NamingEndpoints` is a live view of a target's endpoints
(what Go's resolver sees), and :func:`naming_registration` publishes a Python service as an
endpoint a Go client can dial.

Guaranteed: the record encoding is byte-identical to Go's for string, number, boolean, list
and string-keyed object metadata (keys sorted, ``<``, ``>``, ``&``, U+2028 and U+2029
escaped as Go does); the view follows the prefix ``<target>/`` (with the slash, unlike Go's
manager, so ``svc`` never sees ``svc2``'s endpoints) and -- **unlike the Go watcher, which
stops on its first watch error** -- survives restarts and compaction (a resync re-reads the
prefix). A record that does not parse is skipped and recorded as a background exception.

Not guaranteed: Go's float formatting for metadata numbers (``1e+21`` vs ``1e21``); records
with ``"Op":1`` (the old grpc-naming delete) are skipped, as Go's resolver treats every put
as an add.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.streams import Broadcast, EventStream
from .._core.validate import check_key_name, check_ttl
from .._recipe.recipe import Recipe
from ..caches.prefix import PrefixCache
from ..errors import CodecError, EmptyPathError, EventStreamOverflowError, InvalidArgumentError
from ..keyvalue import TransientKeyValue

if TYPE_CHECKING:
    from ..client import EtcdClient

__all__ = ["NamingEndpoint", "NamingEndpoints", "encode_naming_record", "naming_registration"]

_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def encode_naming_record(addr: str, metadata: Any = None) -> bytes:
    """The value Go's ``endpoints.Manager.AddEndpoint`` writes for ``addr``.

    Example::

        from etcd_recipes import encode_naming_record

        assert encode_naming_record("10.0.0.7:50051") == (
            b'{"Op":0,"Addr":"10.0.0.7:50051","Metadata":null}'
        )
        assert encode_naming_record("h:1", {"b": 1, "a": "<x>"}) == (
            b'{"Op":0,"Addr":"h:1","Metadata":{"a":"\\\\u003cx\\\\u003e","b":1}}'
        )
    """
    if not isinstance(addr, str) or not addr:
        raise InvalidArgumentError(f"addr must be a non-empty str, got {addr!r}")
    try:
        meta = json.dumps(
            metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise CodecError(f"metadata is not JSON: {exc}") from exc
    head = json.dumps(addr, ensure_ascii=False)
    return f'{{"Op":0,"Addr":{head},"Metadata":{meta}}}'.translate(_GO_ESCAPES).encode("utf-8")


@dataclass(frozen=True, slots=True)
class NamingEndpoint:
    """One endpoint of a Go naming target: its ``key`` (``<target>/<key>``), ``addr``
    (``host:port``) and ``metadata`` (any JSON value, ``None`` when absent).

    Example::

        from etcd_recipes import NamingEndpoint

        e = NamingEndpoint.from_record("svc/a", b'{"Op":0,"Addr":"h:1","Metadata":{"w":2}}')
        assert (e.addr, e.metadata) == ("h:1", {"w": 2})
    """

    key: str
    addr: str
    metadata: Any = None

    @staticmethod
    def from_record(key: str, data: bytes) -> NamingEndpoint:
        """Parse a record as Go's resolver does; :class:`~etcd_recipes.errors.CodecError`
        for anything else."""
        try:
            doc = json.loads(data)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"{key}: not a naming record (not JSON): {exc}") from exc
        if not isinstance(doc, dict):
            raise CodecError(f"{key}: not a naming record: a JSON {type(doc).__name__}")
        op, addr = doc.get("Op", 0), doc.get("Addr", "")
        if op != 0 or isinstance(op, bool):
            raise CodecError(f"{key}: naming record with Op {op!r} (only 0, Add, is an endpoint)")
        if not isinstance(addr, str) or not addr:
            raise CodecError(f"{key}: a naming record needs a non-empty Addr string")
        return NamingEndpoint(key, addr, doc.get("Metadata"))

    def to_record(self) -> bytes:
        """The record Go would write for this endpoint (see :func:`encode_naming_record`)."""
        return encode_naming_record(self.addr, self.metadata)


class _RecordCodec:
    """Record bytes -> (addr, metadata) checked like Go; the key is added by the view."""

    def encode(self, value: NamingEndpoint) -> bytes:
        return value.to_record()

    def decode(self, data: bytes) -> NamingEndpoint:
        return NamingEndpoint.from_record("", data)


def _target(target: str) -> str:
    # Go targets are etcd key names (``etcd:///services/echo`` -> ``services/echo``): no
    # leading slash needed, as with etcdctl and etcd's own lock and election services.
    target = check_key_name(target, what="target").removesuffix("/")
    if not target:
        raise EmptyPathError("target must not be empty (or only '/')")
    return target


class NamingEndpoints(Recipe):
    """A live view of the endpoints of Go naming ``target`` (what ``etcd:///<target>``
    resolves to), kept current by a watch that survives restarts and compaction.

    Example::

        from etcd_recipes import NamingEndpoints

        target = f"{prefix}/grpc/echo"
        await client.put(f"{target}/10.0.0.7:50051", b'{"Op":0,"Addr":"10.0.0.7:50051"}')
        async with NamingEndpoints(client, target) as view:
            assert [e.addr for e in view.endpoints()] == ["10.0.0.7:50051"]
    """

    _absolute_path = False  # a Go target is an etcd key name (see _target)

    def __init__(
        self,
        client: EtcdClient,
        target: str,
        *,
        client_id: str | None = None,
        metrics_name: str = "",
    ) -> None:
        self.target: str = _target(target)
        """The naming target (no trailing slash)."""
        super().__init__(client, self.target + "/", client_id=client_id, metrics_name=metrics_name)
        self._cache: PrefixCache[NamingEndpoint] = PrefixCache(
            client, self.path, codec=_RecordCodec(), metrics_name=metrics_name
        )
        self._cache.add_exception_listener(self._inner_failed)
        self._cache.add_connection_state_listener(lambda new, old: self._set_state(new))
        self._key: tuple[int, int, int] = (-1, -1, -1)
        self._list: tuple[NamingEndpoint, ...] = ()
        self._published: tuple[NamingEndpoint, ...] | None = None
        self._lists: Broadcast[tuple[NamingEndpoint, ...]] = Broadcast(
            "naming-endpoints", self._record_listener_error, current=self._current
        )

    def __repr__(self) -> str:
        return f"<{self.exception_context} {self._lifecycle} endpoints={len(self._now())}>"

    def endpoints(self) -> list[NamingEndpoint]:
        """The endpoints now, by key. No I/O."""
        return list(self._now())

    def updates(self, maxsize: int = 1) -> EventStream[tuple[NamingEndpoint, ...]]:
        """The endpoint list now (once started), then each changed list, as an async
        iterator; conflated (a slow reader gets the newest list). Ends when closed.

        Example::

            from etcd_recipes import NamingEndpoints

            target = f"{prefix}/grpc/echo"
            async with NamingEndpoints(client, target) as view:
                lists = view.updates()
                assert await anext(lists) == ()
                await client.put(f"{target}/h:1", b'{"Op":0,"Addr":"h:1","Metadata":null}')
                assert [e.addr for e in await anext(lists)] == ["h:1"]
        """
        return self._lists.stream(maxsize, conflate=True)

    def _current(self) -> tuple[NamingEndpoint, ...] | None:
        return self._now() if self._lifecycle == "started" else None

    def _now(self) -> tuple[NamingEndpoint, ...]:
        cache = self._cache
        key = (cache.revision, cache.resync_count, len(cache))
        if key != self._key:
            self._key = key
            self._list = tuple(
                NamingEndpoint(e.key, e.value.addr, e.value.metadata)
                for e in cache.entries()
                if e.error is None and e.value is not None
            )
        return self._list

    def _inner_failed(self, context: str, exc: BaseException) -> None:
        self._record_exception(exc, context.rpartition(":")[2] or "cache")

    def _publish(self) -> None:
        now = self._now()
        if now != self._published:
            self._published = now
            self._lists.publish(now)

    async def _do_start(self) -> None:
        stream = self._cache.events(maxsize=1000)
        try:
            await self._cache.start()
        except BaseException:
            await stream.aclose()
            raise
        self._lifecycle = "started"
        self._publish()
        self._spawn(self._follow(stream), "follow")

    async def _follow(self, stream: EventStream[Any]) -> None:
        while True:
            try:
                await anext(stream)
            except StopAsyncIteration:
                return
            except EventStreamOverflowError:
                stream = self._cache.events(maxsize=1000)
            self._publish()

    async def _do_close(self) -> None:
        with contextlib.suppress(Exception):
            await self._cache.aclose()
        await self._lists.aclose()


def naming_registration(
    client: EtcdClient,
    target: str,
    addr: str,
    *,
    metadata: Any = None,
    key: str | None = None,
    ttl: float = 2,
    metrics_name: str = "",
) -> TransientKeyValue[bytes]:
    """An (unstarted) registration of ``addr`` as an endpoint of Go naming ``target``:
    the record ``<target>/<key or addr>`` on a self-healing lease of ``ttl`` seconds, as
    Go's ``endpoints.Manager.AddEndpoint`` with a lease writes it. Use ``async with``.
    ``metrics_name`` is the ``name`` label of its metrics (``lease_lost``; ``""``: none).

    Example::

        from etcd_recipes import NamingEndpoints, naming_registration

        target = f"{prefix}/grpc/echo"
        async with naming_registration(client, target, "127.0.0.1:50051"):
            async with NamingEndpoints(client, target) as view:
                assert [e.addr for e in view.endpoints()] == ["127.0.0.1:50051"]
        assert await client.get(f"{target}/127.0.0.1:50051") is None
    """
    record = encode_naming_record(addr, metadata)
    suffix = addr if key is None else key
    if not isinstance(suffix, str) or not suffix:
        raise InvalidArgumentError(f"key must be a non-empty str, got {key!r}")
    return _NamingRecord(
        client,
        f"{_target(target)}/{suffix}",
        record,
        lease_ttl=check_ttl(ttl),
        metrics_name=metrics_name,
    )


class _NamingRecord(TransientKeyValue[bytes]):
    """A Go naming record: its key is under a Go target, an etcd key name that need not start
    with ``/`` (see :func:`_target`); otherwise a plain transient key/value."""

    _absolute_path = False
