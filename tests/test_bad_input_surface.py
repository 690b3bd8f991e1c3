"""Bad input, across the WHOLE public surface (async ``etcd_recipes`` and ``etcd_recipes.sync``).

The walk introspects every public function, constructor and method, recognises the parameters it
knows by name (client, path, TTL, timeout, count/limit, lease, revision, values, delta, ...), and
calls each entry point once per bad value of each such parameter (every other argument good).
Each call must raise one of our typed argument errors (``InvalidArgumentError``, a ``ValueError``;
its ``...TypeError`` subclass for a wrong type is also a ``TypeError``) whose message names the
argument -- never an ``AttributeError``, an ``OverflowError`` or a bare builtin from deep inside,
never a silent acceptance -- and etcd's revision must not move (nothing was written).

Recipes are walked unstarted: arguments are checked before the lifecycle, so a bad argument is
reported as such whatever the state. Result value types (``KeyValue``, events, ...) are built by
the library and are not entry points.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

import etcd_recipes
import etcd_recipes.sync
from etcd_recipes import InvalidArgumentError

pytestmark = pytest.mark.xdist_group("bad_input_surface")

NAN, INF = math.nan, math.inf
BIG = 2**63  # one past int64

# ---------------------------------------------------------------------- the table of bad values

# parameter name -> kind
KIND_OF: dict[str, str] = {
    "client": "client",
    "path": "path",
    "ttl": "ttl",
    "lease_ttl": "ttl",
    "visibility_timeout": "ttl",
    "timeout": "timeout",
    "start_timeout": "timeout",
    "connect_timeout": "timeout",
    "operation_timeout": "timeout",
    "heal_operation_timeout": "timeout",
    "keepalive_time": "timeout",
    "keepalive_timeout": "timeout",
    "sweep_interval": "duration",
    "minimum_wait_time": "duration",
    "delay": "delay",
    "member_count": "count",
    "permits": "count",
    "page_size": "count",
    "max_deliveries": "count",
    "max_items": "count",
    "max_attempts": "count",
    "maxsize": "bound",
    "limit": "limit",
    "lease": "lease",
    "lease_id": "lease_id",
    "revision": "revision",
    "start_revision": "revision",
    "max_create_revision": "revision",
    "min_mod_revision": "revision",
    "values": "values",
    "delta": "int64",
    "default": "int64",
    "priority": "priority",
}

BAD: dict[str, list[Any]] = {
    "client": [None, "etcd", 42, object()],
    "path": ["relative/path", "", "/", "/a//b", "/a\x00b", b"/bytes", None, 42],
    "ttl": [0, -1, 2.5, NAN, INF, -INF, "2", True, None, BIG],
    "timeout": [NAN, -1, -INF, "1", True, b"1", []],
    "duration": [NAN, INF, -1, "1", True, None],
    "delay": [NAN, INF, "1", True],  # a delay <= 0 means "now"
    "count": [0, -1, "5", 2.5, True, None, NAN],
    "bound": [-1, "5", 2.5, True, NAN],
    "limit": [-1, "5", 2.5, True, None, BIG],
    "lease": ["abc", -1, True, 2.5, None, BIG],
    "lease_id": ["abc", 0, -1, True, 2.5, None, BIG],
    "revision": [-1, "1", True, 2.5, None, BIG],
    "values": [None, 42, "abc", b"abc", 1.5],
    "int64": [BIG, -BIG - 1, "1", 2.5, True, None],
    "priority": [-1, 65536, "1", True, 2.5, None],
}

# timeout=0 means "try once, do not wait" for these; anywhere else 0 is rejected.
ZERO_TIMEOUT_OK = {"acquire", "with_lock", "with_permit", "poll", "receive", "receive_many"}

# Result and event value types: built by the library from etcd's answers, not entry points.
RESULT_TYPES = {
    "BackgroundException", "CacheBatch", "CacheEntry", "CacheEvent", "ChildData", "DeadLetter",
    "DeleteResult", "Elected", "ElectionLeaderKey", "KeyValue", "LeaseExpired", "LeaseFailed",
    "LeaseGrant", "LeaseInfo", "LeaseRestored", "LeaseSuspended", "LeadershipTerm", "Member",
    "NodeCacheEvent", "Participant", "PathChildrenCacheEvent", "PutResult", "RangeResult",
    "Status", "TxnResult", "Vacated", "WatchEvent", "WatchFailed", "WatchProgress",
    "WatchResubscribed", "WatchResynced", "WatchSuspended", "WorkItem", "LockHold",
    "ReadWriteLockView", "EventStream", "Watch", "WatchItem", "Recipe", "EtcdClient",
    "AcquisitionLease", "SelfHealingLease", "DeleteOp", "GetOp", "PutOp", "TxnOp", "Compare",
    "EtcdMetrics", "Codec", "RetryPolicy", "LockParticipant", "NamingEndpoint",
    "LeadershipGap", "LeaseResumed",
}  # fmt: skip
RESULT_TYPES |= {"MemberJoined", "MemberUpdated", "MemberLeft", "GroupResynced", "ItemAssigned"}
RESULT_TYPES |= {"ItemReleased"}
# ...whose methods are walked on instances made by the library instead (see _instances()).


# A kind applies where the annotation says so (``lease`` is a lease id in ``put()`` but a
# ``LeaseResilience`` in ``ResilienceConfig``; ``values`` a batch, or a cache's flag).
NEEDS = {"client": "EtcdClient", "path": "str", "values": "Iterable", "lease": "int"}
# Names of another meaning outside these classes.
ONLY_IN = {"default": {"DistributedAtomicLong"}, "delta": {"DistributedAtomicLong"}}


def _applies(kind: str, param: inspect.Parameter, owner: str) -> bool:
    annotation = str(param.annotation)
    if param.name in ONLY_IN and owner not in ONLY_IN[param.name]:
        return False
    if kind in NEEDS:
        return NEEDS[kind] in annotation
    return "int" in annotation or "float" in annotation


def _bad_values(kind: str, param: inspect.Parameter, method: str) -> list[Any]:
    values = list(BAD[kind])
    annotation = str(param.annotation)
    if "None" in annotation or param.default is None:
        values = [v for v in values if v is not None]
    if kind == "timeout" and method not in ZERO_TIMEOUT_OK:
        values.append(0)
    if kind == "ttl" and param.name == "visibility_timeout":
        values = [v for v in values if v is not None]
    return values


# ---------------------------------------------------------------------- good values


@dataclass
class Env:
    client: Any
    prefix: str
    lease_id: int
    endpoints: str
    counter: list[int] = field(default_factory=lambda: [0])

    def path(self) -> str:
        self.counter[0] += 1
        return f"{self.prefix}w{self.counter[0]}"


async def _establish(lease_id: int) -> bool:
    return True


def _establish_sync(lease_id: int) -> bool:
    return True


async def _take(term: Any) -> None:
    return None


async def _apply(stm: Any) -> None:
    return None


def _good(env: Env, name: str, owner: str, sync: bool) -> Any:
    """A valid value for a required parameter (``KeyError``: the walk cannot call it)."""
    if name in ("client",):
        return env.client
    if name == "name" and owner.startswith("Service"):
        return "svc"  # a service name is one path segment
    if name in ("path", "name", "service_path", "target"):
        return env.path()
    if name == "key":
        return env.path()
    if name == "prefix":
        return env.path() + ("/" if owner == "PrefixCache" else "")
    if name == "addr":
        return "127.0.0.1:8080"
    if name in ("value", "data"):
        return b"v"
    if name == "seed":
        return b"v"
    if name == "expected_version":
        return 0
    if name == "values":
        return [b"v"]
    if name in ("ttl", "lease_ttl"):
        return 5
    if name in ("lease", "lease_id"):
        return env.lease_id
    if name == "revision":
        return 1
    if name == "member_count":
        return 2
    if name == "permits":
        return 2
    if name == "max_items":
        return 2
    if name == "establish":
        return _establish_sync if sync else _establish
    if name == "take_leadership":
        return (lambda term: None) if sync else _take
    if name == "compare":
        return []
    if name == "delta":
        return 1
    if name == "item_id":
        return "0000000000000000001-abc"
    if name == "timeout":
        return 5
    if name == "max_attempts":
        return 3
    if name == "codec":
        return etcd_recipes.BYTES
    if name == "endpoints":
        return env.endpoints
    if name == "items":
        return ["item-a", "item-b"]
    if name == "leader":
        return etcd_recipes.ElectionLeaderKey(b"/e", b"/e/1", 1, env.lease_id)
    if name == "paths":
        return [env.path(), env.path()]
    if name == "apply":
        return (lambda stm: None) if sync else _apply
    raise KeyError(name)


# ---------------------------------------------------------------------- the walk


@dataclass(frozen=True)
class Entry:
    name: str  # "DistributedMutex", "DistributedMutex.acquire", "connect", ...
    owner: str  # the class name ("" for a function)
    method: str  # the method's name ("__init__" for a constructor)
    signature: inspect.Signature
    make: Callable[[Env], Any] | None  # the instance (None: a function or a constructor)
    target: Callable[..., Any] | None  # a function or a class (None: a method of make())


def _params(sig: inspect.Signature) -> list[inspect.Parameter]:
    return [
        p
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _construct(cls: type, env: Env, sync: bool) -> Any:
    sig = inspect.signature(cls)
    args, kwargs = _fill(sig, env, cls.__name__, sync, skip=None)
    return cls(*args, **kwargs)


def _fill(
    sig: inspect.Signature, env: Env, owner: str, sync: bool, skip: str | None
) -> tuple[list[Any], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in _params(sig):
        if p.name == skip or (p.default is not p.empty and p.name != "endpoints"):
            continue
        value = _good(env, p.name, owner, sync)
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = value
        else:
            args.append(value)
    return args, kwargs


def _entries(package: Any, sync: bool) -> Iterator[Entry]:
    instances: dict[str, Callable[[Env], Any]] = {
        "EtcdClient": lambda env: env.client,
        "ReadWriteLockView": lambda env: (
            _construct(package.DistributedReadWriteLock, env, sync).read_lock
        ),
    }
    for name in sorted(package.__all__):
        value = getattr(package, name)
        if inspect.isfunction(value):
            yield Entry(name, "", name, inspect.signature(value), None, value)
            continue
        if not inspect.isclass(value) or issubclass(value, BaseException):
            continue
        if name in RESULT_TYPES and name not in instances:
            continue
        if name not in RESULT_TYPES:
            try:
                sig = inspect.signature(value)
            except (TypeError, ValueError):  # pragma: no cover - C types
                continue
            yield Entry(name, name, "__init__", sig, None, value)
            make = instances.get(name) or (lambda env, cls=value: _construct(cls, env, sync))
        else:
            make = instances[name]
        for attr in sorted(dir(value)):
            if attr.startswith("_"):
                continue
            member = inspect.getattr_static(value, attr)
            if isinstance(member, staticmethod | classmethod):
                yield Entry(
                    f"{name}.{attr}", name, attr, inspect.signature(getattr(value, attr)), None,
                    getattr(value, attr),
                )  # fmt: skip
            elif inspect.isfunction(member):
                yield Entry(f"{name}.{attr}", name, attr, inspect.signature(member), make, None)


@dataclass
class Outcome:
    checked: int = 0
    failures: list[str] = field(default_factory=list)


def _judge(entry: Entry, param: str, bad: Any, exc: BaseException | None) -> str:
    where = f"{entry.name}({param}={bad!r})"
    if exc is None:
        return f"{where}: accepted"
    if not isinstance(exc, InvalidArgumentError):
        return f"{where}: {type(exc).__name__}: {exc}"
    if param not in str(exc):
        return f"{where}: the message does not name {param!r}: {exc}"
    return ""


def _cases(entry: Entry) -> Iterator[tuple[inspect.Parameter, Any]]:
    for p in _params(entry.signature):
        kind = KIND_OF.get(p.name)
        if kind is None or not _applies(kind, p, entry.owner):
            continue
        for bad in _bad_values(kind, p, entry.method):
            yield p, bad


def _call_args(
    entry: Entry, env: Env, sync: bool, p: inspect.Parameter, bad: Any
) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    args, kwargs = _fill(entry.signature, env, entry.owner, sync, skip=p.name)
    if p.kind is p.KEYWORD_ONLY or p.default is not p.empty:
        kwargs[p.name] = bad
    else:
        position = [q.name for q in _params(entry.signature) if q.default is q.empty].index(p.name)
        args.insert(position, bad)
    if entry.target is not None:
        return entry.target, args, kwargs
    assert entry.make is not None
    return getattr(entry.make(env), entry.method), args, kwargs


async def _revision(client: Any) -> int:
    return int((await client.range("/", count_only=True)).revision)


async def _walk_async(env: Env) -> Outcome:
    out = Outcome()
    for entry in _entries(etcd_recipes, sync=False):
        before = await _revision(env.client)
        for p, bad in _cases(entry):
            exc: BaseException | None = None
            try:
                fn, args, kwargs = _call_args(entry, env, False, p, bad)
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, 5)
                elif hasattr(result, "__aenter__"):
                    with anyio.fail_after(5):
                        async with result:
                            pass
                elif hasattr(result, "__anext__"):
                    with anyio.fail_after(5):
                        await result.__anext__()
            except KeyError as missing:  # a required parameter the walk cannot fill
                out.failures.append(f"{entry.name}: no good value for {missing}")
                continue
            except Exception as error:
                exc = error
            out.checked += 1
            if problem := _judge(entry, p.name, bad, exc):
                out.failures.append(problem)
        if await _revision(env.client) != before:
            out.failures.append(f"{entry.name}: a bad call wrote to etcd before failing")
    return out


def _walk_sync(env: Env) -> Outcome:
    out = Outcome()
    for entry in _entries(etcd_recipes.sync, sync=True):
        before = int(env.client.range("/", count_only=True).revision)
        for p, bad in _cases(entry):
            exc: BaseException | None = None
            try:
                fn, args, kwargs = _call_args(entry, env, True, p, bad)
                result = fn(*args, **kwargs)
                if hasattr(result, "__next__"):
                    next(result)
                elif hasattr(result, "__enter__"):
                    with result:
                        pass
            except KeyError as missing:
                out.failures.append(f"{entry.name}: no good value for {missing}")
                continue
            except Exception as error:
                exc = error
            out.checked += 1
            if problem := _judge(entry, p.name, bad, exc):
                out.failures.append(problem)
        if int(env.client.range("/", count_only=True).revision) != before:
            out.failures.append(f"{entry.name}: a bad call wrote to etcd before failing")
    return out


# Entry points whose parameters the walk recognises: a floor, so that the walk cannot silently
# shrink (a renamed parameter, a broken introspection) and still pass.
MIN_CHECKED = 1100  # 1142 today


async def test_every_async_entry_point_rejects_bad_input(etcd_client, etcd_prefix):
    async with etcd_client.lease(30) as lease:
        out = await _walk_async(Env(etcd_client, etcd_prefix, lease.id, etcd_client.endpoints))
    assert out.failures == [], "\n".join([f"{len(out.failures)} of {out.checked}", *out.failures])
    assert out.checked >= MIN_CHECKED, out.checked


def test_every_sync_entry_point_rejects_bad_input(etcd_server, etcd_prefix):
    with etcd_recipes.sync.connect(**etcd_server.client_kwargs()) as client:
        grant = client.lease_grant(30)
        try:
            out = _walk_sync(Env(client, etcd_prefix + "s", grant.id, client.endpoints))
        finally:
            client.lease_revoke(grant.id)
    assert threading.active_count() < 50, sorted(t.name for t in threading.enumerate())
    assert out.failures == [], "\n".join([f"{len(out.failures)} of {out.checked}", *out.failures])
    assert out.checked >= MIN_CHECKED, out.checked
