#!/usr/bin/env python3
"""Generate the blocking facade ``etcd_recipes/sync/`` from the async source (AST based).

Usage::

    python tools/gen_sync.py            # (re)write etcd_recipes/sync/
    python tools/gen_sync.py --check    # exit 1, with a diff, when the output is stale

For every ``(module, [names])`` in :data:`INPUTS` the generator reads the module's AST and
writes a twin module (``etcd_recipes/X.py`` -> ``etcd_recipes/sync/X.py``) with the same
public names, signatures (minus ``async``), docstrings and type hints. Bodies forward to the
async object on the client's private event-loop thread (``etcd_recipes/sync/_runtime.py``,
hand-written). Wrapping rules:

* ``async def m`` -> ``def m`` that awaits ``m`` on the loop; plain methods run on the loop
  thread; properties and public instance attributes become read-through properties;
* ``__aenter__``/``__aexit__`` -> ``__enter__``/``__exit__`` (one task per ``with`` block);
  ``__aiter__``/``__anext__`` -> ``__iter__``/``__next__``; ``aclose`` -> ``close``;
  methods returning ``AsyncIterator[X]`` / async context managers -> blocking ones;
* parameters typed with a twinned class are unwrapped; results typed with one are wrapped;
  ``Callable[..., Awaitable[R]]`` hooks are taken as plain ``Callable[..., R]`` and run in a
  worker thread; other callables (listeners) run on the client's listener thread;
* public members of private base classes are flattened in; twinned bases are inherited;
  only names in a module's ``__all__`` are twinned; private names never are;
* names used by signatures are imported from their defining module (sorted, explicit).

The output is deterministic, ruff- and mypy-clean as emitted (no formatter runs), and every
generated file starts with :data:`MARKER`. ``--check`` also reports missing generated files
and stale ones that no input produces. ``--source-root``/``--output`` point it at a copy.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# --------------------------------------------------------------------------- configuration

INPUTS: list[tuple[str, list[str]]] = [
    ("etcd_recipes/client.py", ["EtcdClient", "connect"]),
    ("etcd_recipes/_core/watch.py", ["Watch"]),
    ("etcd_recipes/_core/lease.py", ["AcquisitionLease", "SelfHealingLease"]),
    ("etcd_recipes/_core/recipe.py", ["Recipe"]),
    ("etcd_recipes/barriers/barrier.py", ["DistributedBarrier"]),
    ("etcd_recipes/counter.py", ["DistributedAtomicLong"]),
    ("etcd_recipes/keyvalue.py", ["TransientKeyValue"]),
    ("etcd_recipes/locks/mutex.py", ["DistributedMutex"]),
    ("etcd_recipes/locks/rwlock.py", ["DistributedReadWriteLock", "ReadWriteLockView"]),
    ("etcd_recipes/locks/hold.py", ["LockHold"]),
    ("etcd_recipes/locks/server.py", ["server_lock", "server_unlock"]),
    ("etcd_recipes/locks/semaphore.py", ["DistributedSemaphore"]),
    ("etcd_recipes/queues/fifo.py", ["DistributedQueue"]),
    ("etcd_recipes/queues/priority.py", ["DistributedPriorityQueue"]),
    ("etcd_recipes/queues/item.py", ["WorkItem"]),
    ("etcd_recipes/queues/work.py", ["DistributedWorkQueue"]),
    ("etcd_recipes/election/selector.py", ["LeaderSelector"]),
    ("etcd_recipes/election/latch.py", ["LeaderLatch"]),
    ("etcd_recipes/election/observer.py", ["LeaderObserver", "leadership_events"]),
    ("etcd_recipes/election/terms.py", ["get_participants"]),
    (
        "etcd_recipes/election/server.py",
        [
            "election_campaign",
            "election_leader",
            "election_observe",
            "election_proclaim",
            "election_resign",
        ],
    ),
    ("etcd_recipes/barriers/counted.py", ["DistributedBarrierWithCount"]),
    ("etcd_recipes/barriers/double.py", ["DistributedDoubleBarrier"]),
]
"""Async modules and the public names (all in the module's ``__all__``) to twin."""

SHARED: list[tuple[str, list[str] | None]] = [
    ("etcd_recipes/_core/logctx.py", ["RecipeContextFilter", "current_recipe"]),
    ("etcd_recipes/_core/recipe.py", ["BackgroundException"]),
    ("etcd_recipes/_core/txn.py", None),
    ("etcd_recipes/_core/watch.py", ["WatchItem"]),
    ("etcd_recipes/codecs.py", None),
    (
        "etcd_recipes/election/terms.py",
        ["Elected", "LeadershipEvent", "LeadershipTerm", "Participant", "Vacated"],
    ),
    ("etcd_recipes/queues/priority.py", ["InvalidPriorityError", "MAX_PRIORITY"]),
    ("etcd_recipes/queues/config.py", ["WorkQueueConfig"]),
    ("etcd_recipes/queues/dead_letters.py", ["DeadLetter"]),
    ("etcd_recipes/errors.py", None),
    ("etcd_recipes/events.py", None),
    ("etcd_recipes/metrics.py", None),
    ("etcd_recipes/resilience.py", None),
    ("etcd_recipes/types.py", None),
]
"""Values shared by both APIs, re-exported from ``etcd_recipes.sync`` (``None``: ``__all__``)."""

RUNTIME_EXPORTS: list[tuple[str, str]] = [("etcd_recipes.sync._runtime", "fail_after")]
"""Hand-written names re-exported from ``etcd_recipes.sync``."""

OPAQUE = {("etcd_recipes._core.listeners", "ListenerSet")}
"""Types whose public attributes are not twinned (use the ``add_*_listener`` methods)."""

PACKAGE = "etcd_recipes"
OUTPUT = "etcd_recipes/sync"
MARKER = "# generated by tools/gen_sync.py"
HEADER = MARKER + " from {source} — do not edit"
LINE = 100

PACKAGE_DOC = '''"""Blocking facade of etcd-recipes: the same names, with blocking methods.

Use it from threaded or plain scripts, CLIs, Django/Flask views and notebooks that have no
event loop. Inside asyncio (or anyio/trio) code use the async API of :mod:`etcd_recipes`
instead: calling this facade from a running event loop raises
:class:`~etcd_recipes.errors.UsageError` because it would block the loop.

Example::

    from etcd_recipes.sync import connect

    with connect("127.0.0.1:2379") as client:
        client.put("/k", "v")
        kv = client.get("/k")
        with client.watch("/jobs/", prefix=True) as watch:
            for item in watch:
                print(item)
        with client.lease(5) as lease:
            client.put("/presence/me", b"1", lease=lease.id)

How it works: each client owns one private thread running an asyncio loop, on which the async
client is created and lives. A blocking call submits the coroutine to that loop and waits.
Closing the client (or leaving its ``with`` block) stops the thread; a client that is never
closed is closed when it is garbage-collected or at interpreter exit.

Ctrl-C: a ``KeyboardInterrupt`` while a call blocks cancels the coroutine, waits until its
cleanup has finished (a cancelled lock acquisition leaves no waiter key, a cancelled watch
iteration consumes nothing; at most ``CLEANUP_TIMEOUT`` = 10 s), then re-raises the
``KeyboardInterrupt`` in your thread. :func:`fail_after` bounds blocking calls the same way
and raises :class:`~etcd_recipes.errors.EtcdTimeoutError`. ``with`` blocks run the async
``__aenter__``/``__aexit__`` in one task on the loop; plain code in your block cannot be
interrupted, so a hold lost while it runs raises the recipe's ``LostError`` when the block
ends (``is_lost`` and listeners tell you earlier).

Callbacks: listeners run on one listener thread per client (in order, never on the loop), so
a slow listener cannot stall the recipes. Hooks that the async API awaits (``establish``,
``resync``) are plain functions here; they run in worker threads and may call the facade.
(A metrics sink in the resilience settings is called on the loop thread: keep it quick.)

Objects come from the facade (``connect()``, ``client.watch()``, ``client.lease()``) or, for
recipes, from their constructors (``DistributedBarrier(client, "/gate")``). Values, events,
errors, codecs, resilience settings and the ``Cmp``/``Op`` builders are the async API's own
classes, re-exported here so that one import suffices. Everything in this package except the
hand-written ``_runtime.py``, ``_callbacks.py`` and ``_twin.py`` is generated by
``tools/gen_sync.py``.
"""'''

SPECIAL = {"__init__", "__aenter__", "__aexit__", "__aiter__", "__anext__"}
RENAMES = {"__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__"}
RENAMES |= {"__anext__": "__next__", "aclose": "close"}
DOC_REWRITES = [
    ("``async with``", "``with``"),
    ("``async for``", "``for``"),
    ("An async ", "A blocking "),
    ("async context manager", "context manager"),
    ("async iterator", "iterator"),
    ("async with ", "with "),
    ("async for ", "for "),
    ("async def ", "def "),
    ("await ", ""),
    (".aclose()", ".close()"),
    (":meth:`aclose`", ":meth:`close`"),
    ("``aclose()``", "``close()``"),
]

ABC = ("collections.abc", "typing")
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}

Canon = tuple[str, str]  # (defining module, name)


class GenError(Exception):
    """The async source uses a shape the generator cannot twin (the message says which).

    Example::

        GenError("etcd_recipes/lock.py: cannot infer the type of self.owner; annotate it")
    """


# --------------------------------------------------------------------------- source index


@dataclass
class Module:
    """One parsed module of the package."""

    name: str
    path: str  # relative to the source root, e.g. "etcd_recipes/client.py"
    source: str
    tree: ast.Module
    defs: dict[str, ast.stmt] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    all: list[str] | None = None
    _lines: list[bytes] = field(default_factory=list)

    def segment(self, node: ast.expr) -> str:
        """The exact source text of ``node`` (offsets are UTF-8 byte columns)."""
        if not self._lines:
            self._lines = [line.encode() for line in self.source.splitlines(keepends=True)]
        assert node.end_lineno is not None
        assert node.end_col_offset is not None
        rows = self._lines[node.lineno - 1 : node.end_lineno]
        if len(rows) == 1:
            return rows[0][node.col_offset : node.end_col_offset].decode()
        text = rows[0][node.col_offset :] + b"".join(rows[1:-1])
        return (text + rows[-1][: node.end_col_offset]).decode()

    @property
    def package(self) -> str:
        return self.name if self.path.endswith("__init__.py") else self.name.rpartition(".")[0]


class Index:
    """Parses package modules on demand and resolves names to where they are defined.

    Example::

        Index(Path(".")).resolve("etcd_recipes.client", "Sequence")  # ("collections.abc", ...)
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def by_path(self, path: str) -> Module:
        name = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        mod = self.module(name)
        if mod is None:
            raise GenError(f"{path}: no such module under {self.root}")
        return mod

    def _load(self, name: str) -> Module | None:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            return None
        rel = name.replace(".", "/")
        for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
            file = self.root / candidate
            if file.is_file():
                source = file.read_text(encoding="utf-8")
                mod = Module(name, candidate, source, ast.parse(source, candidate))
                _index_module(mod)
                return mod
        return None

    def resolve(self, module: str, name: str) -> Canon:
        """Follow imports until the module that defines ``name``; builtins resolve to builtins."""
        seen: set[Canon] = set()
        while (module, name) not in seen:
            seen.add((module, name))
            mod = self.module(module)
            if mod is None:
                return module, name
            if name in mod.defs:
                return module, name
            if name in mod.imports:
                src, attr = mod.imports[name]
                if attr is None:
                    raise GenError(f"{mod.path}: {name!r} is a module; import the names instead")
                module, name = src, attr
                continue
            if hasattr(builtins, name):
                return "builtins", name
            raise GenError(f"{mod.path}: cannot resolve the name {name!r}")
        raise GenError(f"import cycle resolving {name!r} in {module}")


def _index_module(mod: Module) -> None:
    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = mod.package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(body: Iterable[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom):
                src = absolute(stmt)
                for alias in stmt.names:
                    mod.imports[alias.asname or alias.name] = (src, alias.name)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        mod.imports[alias.asname] = (alias.name, None)
                    else:
                        top = alias.name.split(".")[0]
                        mod.imports[top] = (top, None)
            elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.defs[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        mod.defs[target.id] = stmt
                        if target.id == "__all__":
                            mod.all = [ast.literal_eval(e) for e in _elts(stmt.value)]
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                mod.defs[stmt.target.id] = stmt
            elif isinstance(stmt, ast.If):  # TYPE_CHECKING blocks and the like
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)

    visit(mod.tree.body)


def _elts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return list(node.elts)
    raise GenError("__all__ must be a literal list or tuple")


# --------------------------------------------------------------------------- emission helpers


def _all_lines(names: list[str]) -> list[str]:
    """``__all__`` on one line when it fits, else one name per line (as ruff formats it)."""
    one = "__all__ = [" + ", ".join(f'"{n}"' for n in names) + "]"
    if len(one) <= LINE:
        return [one]
    return ["__all__ = [", *(f'    "{n}",' for n in names), "]"]


def _indent(level: int) -> str:
    return "    " * level


def _call(func: str, args: Sequence[str], level: int, prefix: str = "") -> list[str]:
    """``prefix + func(args)``, wrapped one argument per line when too long."""
    one = f"{_indent(level)}{prefix}{func}({', '.join(args)})"
    if len(one) <= LINE or not args:
        return [one]
    return [
        f"{_indent(level)}{prefix}{func}(",
        *(f"{_indent(level + 1)}{a}," for a in args),
        f"{_indent(level)})",
    ]


def _def(name: str, params: Sequence[str], returns: str | None, level: int) -> list[str]:
    tail = f" -> {returns}:" if returns else ":"
    one = f"{_indent(level)}def {name}({', '.join(params)}){tail}"
    if len(one) <= LINE:
        return [one]
    return [
        f"{_indent(level)}def {name}(",
        *(f"{_indent(level + 1)}{p}," for p in params),
        f"{_indent(level)}){tail}",
    ]


def _suffix(params: Sequence[str]) -> str:
    """A suffix that keeps the generated locals (value, result, runtime) off parameter names."""
    names = {p.lstrip("*").split(":")[0].split("=")[0].strip() for p in params}
    sfx = ""
    while names & {f"value{sfx}", f"result{sfx}", f"runtime{sfx}"}:
        sfx += "_"
    return sfx


def _rewrite_doc(text: str) -> str:
    for old, new in DOC_REWRITES:
        text = text.replace(old, new)
    return text


def _is_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    """``X | None`` / ``None | X`` -> (X, True); anything else -> (node, False)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if isinstance(node.right, ast.Constant) and node.right.value is None:
            return node.left, True
        if isinstance(node.left, ast.Constant) and node.left.value is None:
            return node.right, True
    return node, False


def _optional(node: ast.expr, optional: bool) -> ast.expr:
    if not optional:
        return node
    return ast.BinOp(left=node, op=ast.BitOr(), right=ast.Constant(None))


def _slice_items(node: ast.Subscript) -> list[ast.expr]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


# --------------------------------------------------------------------------- one output module


@dataclass
class Conversion:
    """How one parameter or result crosses the facade."""

    kind: str  # plain | unwrap | hook | listener | listener_nowait | twin | none | iter | cm
    annotation: str | None  # the sync annotation text
    optional: bool = False
    element_twinned: bool = False


class Writer:
    """Collects the text and the imports of one generated module."""

    def __init__(self, gen: Generator, out_module: str, source: Module) -> None:
        self.gen = gen
        self.out_module = out_module
        self.source = source
        self.imports: dict[str, set[str]] = {}
        self.tc_imports: dict[str, set[str]] = {}
        self.names: dict[str, Canon] = {"_async": ("", source.name)}
        self.typevars: dict[str, str] = {}  # TypeVars bound to a twinned class -> sync bound
        package, _, leaf = source.name.rpartition(".")
        self.async_import = (package, leaf)  # from <package> import <leaf> as _async

    # ---------------------------------------------------------------- names and imports

    def need(self, module: str, name: str, *, type_only: bool = False) -> str:
        """Import ``name`` from ``module`` (unless builtin/local) and return the name to use."""
        canon = (module, name)
        if module == "builtins":
            return name
        previous = self.names.setdefault(name, canon)
        if previous != canon:
            raise GenError(
                f"{self.out_module}: the name {name!r} means both {previous} and {canon}"
            )
        if module == self.out_module:
            return name
        if type_only:
            if name not in self.imports.get(module, set()):
                self.tc_imports.setdefault(module, set()).add(name)
        else:
            self.imports.setdefault(module, set()).add(name)
            self.tc_imports.get(module, set()).discard(name)
        return name

    def rewrite(self, node: ast.expr, ctx: Module) -> ast.expr:
        """Copy an annotation/default with names resolved, twinned, and imported."""
        gen = self.gen

        def walk(n: ast.expr) -> ast.expr:
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                try:
                    parsed = ast.parse(n.value, mode="eval").body
                except SyntaxError:
                    return n
                return walk(parsed)
            if isinstance(n, ast.Name):
                canon = gen.index.resolve(ctx.name, n.id)
                if canon in gen.twins:
                    return ast.Name(self.need(gen.twins[canon], canon[1], type_only=True))
                bound = gen.twin_typevar(canon)
                if bound is not None:  # redefined here, bound to the sync twin
                    self.need(gen.twins[bound], bound[1], type_only=True)
                    self.need("typing", "TypeVar")
                    self.typevars[canon[1]] = bound[1]
                    return ast.Name(self.need(self.out_module, canon[1]))
                return ast.Name(self.need(*canon))
            if isinstance(n, ast.Attribute):
                return ast.Attribute(value=walk(n.value), attr=n.attr)
            if isinstance(n, ast.Subscript):
                value = walk(n.value)
                if self.is_abc(n.value, ctx, "Literal"):  # strings there are values, not names
                    return ast.Subscript(value=value, slice=n.slice)
                return ast.Subscript(value=value, slice=walk(n.slice))
            if isinstance(n, ast.Tuple):
                return ast.Tuple(elts=[walk(e) for e in n.elts])
            if isinstance(n, ast.List):
                return ast.List(elts=[walk(e) for e in n.elts])
            if isinstance(n, ast.BinOp):
                return ast.BinOp(left=walk(n.left), op=n.op, right=walk(n.right))
            if isinstance(n, ast.UnaryOp):
                return ast.UnaryOp(op=n.op, operand=walk(n.operand))
            if isinstance(n, ast.Constant):
                return ast.Constant(n.value)
            raise GenError(f"{ctx.path}:{n.lineno}: unsupported expression {ast.unparse(n)!r}")

        return walk(node)

    def text(self, node: ast.expr, ctx: Module) -> str:
        return ast.unparse(self.rewrite(node, ctx))

    # ---------------------------------------------------------------- type analysis

    def canon_of(self, node: ast.expr, ctx: Module) -> Canon | None:
        if isinstance(node, ast.Name):
            return self.gen.index.resolve(ctx.name, node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                return self.canon_of(ast.parse(node.value, mode="eval").body, ctx)
            except (SyntaxError, GenError):  # not a forward reference (a Literal value, ...)
                return None
        return None

    def alias_target(self, node: ast.expr, ctx: Module) -> tuple[ast.expr, Module]:
        """Follow a module-level alias of a ``Callable[...]`` to its definition."""
        canon = self.canon_of(node, ctx)
        if canon is None:
            return node, ctx
        mod = self.gen.index.module(canon[0])
        stmt = mod.defs.get(canon[1]) if mod else None
        if mod is not None and isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value:
            value = stmt.value
            if isinstance(value, ast.Subscript) and self.is_abc(value.value, mod, "Callable"):
                return value, mod
        return node, ctx

    def is_abc(self, node: ast.expr, ctx: Module, *names: str) -> bool:
        canon = self.canon_of(node, ctx)
        return canon is not None and canon[0] in ABC and canon[1] in names

    def mentions_async(self, node: ast.expr, ctx: Module) -> str | None:
        """A twinned or async type anywhere inside ``node`` (which plain passing would leak)."""
        for sub in ast.walk(node):
            canon = self.canon_of(sub, ctx) if isinstance(sub, (ast.Name, ast.Constant)) else None
            if canon is None:
                continue
            if self.gen.is_twin(canon) or self.gen.has_async_api(canon):
                return canon[1]
            if canon[0] in ABC and canon[1].startswith(("Async", "Awaitable", "Coroutine")):
                return canon[1]
            if canon[0] == "contextlib" and "Async" in canon[1]:
                return canon[1]
        return None

    def param(self, ann: ast.expr | None, ctx: Module) -> Conversion:
        """How a parameter crosses: unwrapped twin, hook, listener or plain."""
        if ann is None:
            return Conversion("plain", None)
        inner, optional = _is_optional(ann)
        canon = self.canon_of(inner, ctx)
        if self.gen.is_twin(canon):
            return Conversion("unwrap", self.text(ann, ctx), optional)
        target, tctx = self.alias_target(inner, ctx)
        if isinstance(target, ast.Subscript) and self.is_abc(target.value, tctx, "Callable"):
            items = _slice_items(target)
            if len(items) != 2:
                raise GenError(f"{ctx.path}: malformed Callable {ast.unparse(target)!r}")
            args, ret = items
            ret_inner = ret
            if isinstance(ret, ast.Subscript) and self.is_abc(ret.value, tctx, "Awaitable"):
                ret_inner = ret.slice
            elif isinstance(ret, ast.Subscript) and self.is_abc(ret.value, tctx, "Coroutine"):
                ret_inner = _slice_items(ret)[-1]
            if ret_inner is not ret:
                sync = ast.Subscript(
                    value=self.rewrite(target.value, tctx),
                    slice=ast.Tuple(elts=[self.rewrite(args, tctx), self.rewrite(ret_inner, tctx)]),
                )
                return Conversion("hook", ast.unparse(_optional(sync, optional)), optional)
            if self.mentions_async(target, tctx):
                raise GenError(f"{ctx.path}: cannot twin the callable {ast.unparse(ann)!r}")
            kind = "listener_nowait" if _is_none(ret) else "listener"
            return Conversion(kind, self.text(ann, ctx), optional)
        bad = self.mentions_async(ann, ctx)
        if bad:
            raise GenError(f"{ctx.path}: cannot twin a parameter of type {ast.unparse(ann)!r}")
        return Conversion("plain", self.text(ann, ctx))

    def result(self, ann: ast.expr | None, ctx: Module, *, cm: bool = False) -> Conversion:
        """How a result crosses: wrapped twin, blocking iterator/context manager, or plain."""
        if ann is None:
            return Conversion("plain", None)
        if _is_none(ann):
            return Conversion("none", "None")
        inner, optional = _is_optional(ann)
        canon = self.canon_of(inner, ctx)
        if self.gen.is_twin(canon):
            return Conversion("twin", self.text(ann, ctx), optional)
        if isinstance(inner, ast.Subscript) and not optional:
            if self.is_abc(inner.value, ctx, "AsyncIterator", "AsyncIterable", "AsyncGenerator"):
                # An @asynccontextmanager is written as an async generator of its one value.
                kind, wrapper = ("cm", "AbstractContextManager") if cm else ("iter", "Iterator")
                return self.container(kind, wrapper, _slice_items(inner)[0], ctx)
            if self.is_abc(inner.value, ctx, "AsyncContextManager") or (
                self.canon_of(inner.value, ctx) == ("contextlib", "AbstractAsyncContextManager")
            ):
                return self.container("cm", "AbstractContextManager", inner.slice, ctx)
        bad = self.mentions_async(ann, ctx)
        if bad:
            raise GenError(
                f"{ctx.path}: cannot twin a result of type {ast.unparse(ann)!r} "
                f"({bad} is async: add it to INPUTS)"
            )
        return Conversion("plain", self.text(ann, ctx))

    def container(self, kind: str, wrapper: str, element: ast.expr, ctx: Module) -> Conversion:
        module = "contextlib" if wrapper == "AbstractContextManager" else "collections.abc"
        elem_inner, _ = _is_optional(element)
        twinned = self.gen.is_twin(self.canon_of(elem_inner, ctx))
        if not twinned and self.mentions_async(element, ctx):
            raise GenError(f"{ctx.path}: cannot twin {ast.unparse(element)!r} inside {wrapper}")
        name = self.need(module, wrapper)
        return Conversion(kind, f"{name}[{self.text(element, ctx)}]", False, twinned)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


# --------------------------------------------------------------------------- members


@dataclass
class Member:
    """A public member of a twinned class, with the module its annotations belong to."""

    name: str
    node: ast.stmt
    ctx: Module
    kind: str  # method | property | attribute | classattr
    doc: str | None = None
    annotation: ast.expr | None = None
    overloads: list[ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=list)
    ann_ctx: Module | None = None  # where ``annotation`` was written (inferred types)


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    out = []
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        out.append(ast.unparse(target))
    return out


def _doc_segment(body: list[ast.stmt], ctx: Module) -> str | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return ctx.segment(first.value)
    return None


def _is_async_generator(fn: ast.AsyncFunctionDef) -> bool:
    def walk(nodes: Iterable[ast.AST]) -> bool:
        for node in nodes:
            if isinstance(node, (ast.Yield, ast.YieldFrom)):
                return True
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if walk(ast.iter_child_nodes(node)):
                return True
        return False

    return walk(fn.body)


Overloads = list[ast.FunctionDef | ast.AsyncFunctionDef]


@dataclass
class ClassPlan:
    name: str
    node: ast.ClassDef
    ctx: Module
    twinned_bases: list[Canon]
    type_params: list[ast.expr]
    init: tuple[ast.FunctionDef, Module, Overloads] | None
    members: list[Member]


class Generator:
    """Builds every output module from :data:`INPUTS` under ``root``.

    Example::

        files = Generator(Path("."), [*INPUTS, ("etcd_recipes/lock.py", ["Mutex"])]).generate()
    """

    def __init__(
        self,
        root: Path,
        inputs: Sequence[tuple[str, Sequence[str]]] = tuple(INPUTS),
        shared: Sequence[tuple[str, Sequence[str] | None]] = tuple(SHARED),
    ) -> None:
        self.root = root
        self.index = Index(root)
        self.inputs = [(self.index.by_path(path), list(names)) for path, names in inputs]
        self.shared = shared
        self.twins: dict[Canon, str] = {}  # async class -> sync module
        for mod, names in self.inputs:
            for name in names:
                if mod.all is None or name not in mod.all:
                    raise GenError(f"{mod.path}: {name!r} is not in the module's __all__")
                node = mod.defs.get(name)
                if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    raise GenError(f"{mod.path}: {name!r} is not a class or function")
                if isinstance(node, ast.ClassDef):
                    self.twins[(mod.name, name)] = self.out_name(mod)

    def is_twin(self, canon: Canon | None) -> bool:
        """Whether ``canon`` is a twinned class, or a TypeVar bound to one."""
        return canon is not None and (canon in self.twins or self.twin_typevar(canon) is not None)

    def twin_typevar(self, canon: Canon) -> Canon | None:
        """For ``R = TypeVar("R", bound="Recipe")`` with a twinned bound: that bound."""
        mod = self.index.module(canon[0])
        stmt = mod.defs.get(canon[1]) if mod else None
        if mod is None or not isinstance(stmt, ast.Assign) or not isinstance(stmt.value, ast.Call):
            return None
        func = stmt.value.func
        if not isinstance(func, ast.Name) or self.index.resolve(mod.name, func.id) not in (
            ("typing", "TypeVar"),
            ("typing_extensions", "TypeVar"),
        ):
            return None
        for kw in stmt.value.keywords:
            if kw.arg != "bound":
                continue
            bound = kw.value
            if isinstance(bound, ast.Constant) and isinstance(bound.value, str):
                bound = ast.parse(bound.value, mode="eval").body
            if isinstance(bound, ast.Name):
                target = self.index.resolve(mod.name, bound.id)
                if target in self.twins:
                    return target
        return None

    def has_async_api(self, canon: Canon) -> bool:
        """Whether ``canon`` is a package class with public async methods (or ``async with`` /
        ``async for``) that is not twinned: passing it through would hand sync users an
        object they cannot use, so such types must be twinned (added to INPUTS)."""
        if canon in self.twins:
            return False
        mod = self.index.module(canon[0])
        node = mod.defs.get(canon[1]) if mod else None
        if mod is None or not isinstance(node, ast.ClassDef):
            return False
        for stmt in node.body:
            if isinstance(stmt, ast.AsyncFunctionDef) and (
                not stmt.name.startswith("_") or stmt.name in SPECIAL
            ):
                return True
        for base in node.bases:
            target = base.value if isinstance(base, ast.Subscript) else base
            base_canon = self.base_canon(target, mod)
            inside = base_canon is not None and base_canon[0].startswith(PACKAGE + ".")
            if inside and base_canon is not None and self.has_async_api(base_canon):
                return True
        return False

    @staticmethod
    def out_name(mod: Module) -> str:
        return f"{PACKAGE}.sync.{mod.name.removeprefix(PACKAGE + '.')}"

    @staticmethod
    def out_path(mod: Module) -> str:
        return mod.path.removeprefix(PACKAGE + "/")

    # ---------------------------------------------------------------- driver

    def generate(self) -> dict[str, str]:
        """Every generated file: path relative to the output directory -> text."""
        files: dict[str, str] = {}
        for mod, names in self.inputs:
            files[self.out_path(mod)] = self.module_text(mod, names)
        for path in list(files):
            parts = Path(path).parts[:-1]
            for i in range(1, len(parts) + 1):
                init = "/".join(parts[:i]) + "/__init__.py"
                if init not in files:
                    files[init] = f"{HEADER.format(source=PACKAGE + '/' + init)}\n"
        files["__init__.py"] = self.package_text()
        return dict(sorted(files.items()))

    # ---------------------------------------------------------------- class analysis

    def plan(self, mod: Module, node: ast.ClassDef) -> ClassPlan:
        """The members of a twinned class: its own, then those of its private bases."""
        twinned_bases: list[Canon] = []
        type_params: list[ast.expr] = []
        members: dict[str, Member] = {}
        inits: list[tuple[ast.FunctionDef, Module, Overloads]] = []

        def collect(cls: ast.ClassDef, ctx: Module, own: bool, twinned: bool) -> None:
            attrs: list[Member] = []
            pending: dict[str, Overloads] = {}
            for stmt in cls.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    decs = _decorators(stmt)
                    if "overload" in decs or "typing.overload" in decs:
                        pending.setdefault(stmt.name, []).append(stmt)
                        continue
                    overloads = pending.pop(stmt.name, [])
                    if stmt.name == "__init__" and isinstance(stmt, ast.FunctionDef):
                        inits.append((stmt, ctx, overloads))
                        if not twinned:
                            attrs.extend(self.attributes(stmt, ctx))
                        continue
                    if twinned or stmt.name in members:
                        continue
                    if stmt.name.startswith("_") and stmt.name not in SPECIAL:
                        continue
                    if any(d.endswith((".setter", ".deleter")) for d in decs):
                        raise GenError(f"{ctx.path}: property setters are not supported yet")
                    kind = "property" if "property" in decs else "method"
                    members[stmt.name] = Member(stmt.name, stmt, ctx, kind, overloads=overloads)
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and not twinned:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    ann = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
                    for t in targets:
                        if not isinstance(t, ast.Name) or t.id.startswith("_"):
                            continue
                        if t.id not in members and stmt.value is not None:
                            members[t.id] = Member(t.id, stmt, ctx, "classattr", None, ann)
            for attr in attrs:
                members.setdefault(attr.name, attr)
            for base in cls.bases:
                target = base.value if isinstance(base, ast.Subscript) else base
                canon = self.base_canon(target, ctx)
                if canon is None:
                    continue
                if canon[0] in ABC and canon[1] in ("Generic", "Protocol"):
                    if own and isinstance(base, ast.Subscript):
                        type_params.extend(_slice_items(base))
                    continue
                is_twin = canon in self.twins
                # The nearest twinned base, also when reached through private bases.
                if is_twin and not twinned and canon not in twinned_bases:
                    twinned_bases.append(canon)
                    if isinstance(base, ast.Subscript):
                        raise GenError(f"{ctx.path}: generic twinned bases are not supported yet")
                base_mod = self.index.module(canon[0])
                base_node = base_mod.defs.get(canon[1]) if base_mod else None
                if base_mod is not None and isinstance(base_node, ast.ClassDef):
                    # Twinned bases only matter for __init__: their members are inherited.
                    collect(base_node, base_mod, False, twinned or is_twin)

        collect(node, mod, True, False)
        if "aclose" in members and "close" in members:
            raise GenError(f"{mod.path}: {node.name} has both close() and aclose()")
        return ClassPlan(
            node.name,
            node,
            mod,
            twinned_bases,
            type_params,
            inits[0] if inits else None,
            list(members.values()),
        )

    def base_canon(self, target: ast.expr, ctx: Module) -> Canon | None:
        """Where a base class is defined; ``None`` for bases outside the package."""
        if isinstance(target, ast.Name):
            return self.index.resolve(ctx.name, target.id)
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            imported = ctx.imports.get(target.value.id)
            if imported is not None and imported[1] is None:
                return None if imported[0].split(".")[0] != PACKAGE else (imported[0], target.attr)
        raise GenError(f"{ctx.path}: unsupported base class {ast.unparse(target)!r}")

    def attributes(self, init: ast.FunctionDef, ctx: Module) -> list[Member]:
        """Public ``self.x = ...`` assignments of an ``__init__``, with their types."""
        params = {
            a.arg: a.annotation for a in init.args.args + init.args.kwonlyargs if a.annotation
        }
        out: list[Member] = []
        body = init.body
        for i, stmt in enumerate(body):
            target: ast.expr | None = None
            ann: ast.expr | None = None
            if isinstance(stmt, ast.AnnAssign):
                target, ann = stmt.target, stmt.annotation
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            if not (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and not target.attr.startswith("_")
            ):
                continue
            ann_ctx = ctx
            if ann is None:
                assert isinstance(stmt, ast.Assign)
                ann, ann_ctx = self.infer(stmt.value, params, ctx, target.attr)
            doc = None
            if i + 1 < len(body):
                doc = _doc_segment([body[i + 1]], ctx)
            if self.opaque(ann, ann_ctx):
                continue
            out.append(Member(target.attr, stmt, ctx, "attribute", doc, ann, ann_ctx=ann_ctx))
        return out

    def infer(
        self, value: ast.expr, params: dict[str, ast.expr], ctx: Module, attr: str
    ) -> tuple[ast.expr, Module]:
        """The type of an unannotated ``self.attr = value`` (and where that type is written)."""
        if isinstance(value, ast.Name) and value.id in params:
            return params[value.id], ctx
        if isinstance(value, ast.Constant) and type(value.value) in (int, float, str, bytes, bool):
            return ast.Name(type(value.value).__name__), ctx
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            return self.infer(value.values[-1], params, ctx, attr)  # ``given or default()``
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            canon = self.index.resolve(ctx.name, value.func.id)
            mod = self.index.module(canon[0])
            fn = mod.defs.get(canon[1]) if mod else None
            if mod is not None and isinstance(fn, ast.FunctionDef) and fn.returns is not None:
                return fn.returns, mod
            if mod is not None and isinstance(fn, ast.ClassDef):  # an instance of that class
                return ast.Name(canon[1]), mod
        raise GenError(
            f"{ctx.path}:{value.lineno}: cannot infer the type of self.{attr}; annotate it "
            f"(self.{attr}: T = ...) in the async source"
        )

    def opaque(self, ann: ast.expr, ctx: Module) -> bool:
        target = ann.value if isinstance(ann, ast.Subscript) else ann
        canon = Writer(self, "", ctx).canon_of(target, ctx)
        return canon in OPAQUE

    # ---------------------------------------------------------------- module text

    def module_text(self, mod: Module, names: list[str]) -> str:
        out_module = self.out_name(mod)
        w = Writer(self, out_module, mod)
        body: list[str] = []
        for name in names:
            node = mod.defs[name]
            body.append("")
            body.append("")
            if isinstance(node, ast.ClassDef):
                body.extend(self.class_text(w, self.plan(mod, node)))
            else:
                assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                body.extend(self.function_text(w, node, mod))
        head = [
            HEADER.format(source=mod.path),
            f'"""Blocking twin of :mod:`{mod.name}` (see :mod:`etcd_recipes.sync`)."""',
            "",
            "from __future__ import annotations",
            "",
            *self.import_lines(w),
            "",
            *_all_lines(sorted(names)),
        ]
        if w.typevars:
            head.append("")
            head += [f'{n} = TypeVar("{n}", bound="{b}")' for n, b in sorted(w.typevars.items())]
        return "\n".join(head + body) + "\n"

    def import_lines(self, w: Writer) -> list[str]:
        imports = {m: set(n) for m, n in w.imports.items() if n}
        tc = {m: n - imports.get(m, set()) for m, n in w.tc_imports.items()}
        tc = {m: n for m, n in tc.items() if n}
        if tc:
            imports.setdefault("typing", set()).add("TYPE_CHECKING")
        package, leaf = w.async_import
        if package in imports:
            raise GenError(f"{w.out_module}: would import from {package} twice")
        lines = _import_block(imports, 0, aliased={package: f"{leaf} as _async"})
        if tc:
            lines += ["", "if TYPE_CHECKING:"]
            lines += _import_block(tc, 1)
        return lines

    # ---------------------------------------------------------------- functions

    def signature(
        self,
        w: Writer,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        ctx: Module,
        rt: str,
    ) -> tuple[list[str], list[str], str | None]:
        """(sync parameter texts, call argument texts, runtime expression) of ``fn``."""
        a = fn.args
        params: list[str] = []
        call: list[str] = []
        positional = a.posonlyargs + a.args
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
        defaults += list(a.defaults)
        runtime: str | None = None

        def one(arg: ast.arg, default: ast.expr | None, keyword: bool) -> None:
            nonlocal runtime
            conv = w.param(arg.annotation, ctx)
            text = arg.arg
            if conv.annotation is not None:
                text += f": {conv.annotation}"
            if default is not None:
                sep = " = " if conv.annotation is not None else "="
                text += sep + w.text(default, ctx)
            params.append(text)
            value = self.convert_arg(arg.arg, conv, rt)
            if conv.kind == "unwrap" and runtime is None and not conv.optional:
                runtime = arg.arg
            call.append(f"{arg.arg}={value}" if keyword else value)

        for i, (arg, default) in enumerate(zip(positional, defaults)):
            if i == 0 and arg.arg in ("self", "cls"):
                ann = f": {w.text(arg.annotation, ctx)}" if arg.annotation else ""
                params.append(arg.arg + ann)
                continue
            one(arg, default, False)
            if a.posonlyargs and arg is a.posonlyargs[-1]:
                params.append("/")
        if a.vararg is not None:
            conv = w.param(a.vararg.annotation, ctx)
            if conv.kind != "plain":
                raise GenError(f"{ctx.path}: *{a.vararg.arg} must be plainly typed")
            params.append(f"*{a.vararg.arg}" + (f": {conv.annotation}" if conv.annotation else ""))
            call.append(f"*{a.vararg.arg}")
        elif a.kwonlyargs:
            params.append("*")
        for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults):
            one(arg, kw_default, True)
        if a.kwarg is not None:
            conv = w.param(a.kwarg.annotation, ctx)
            if conv.kind != "plain":
                raise GenError(f"{ctx.path}: **{a.kwarg.arg} must be plainly typed")
            params.append(f"**{a.kwarg.arg}" + (f": {conv.annotation}" if conv.annotation else ""))
            call.append(f"**{a.kwarg.arg}")
        return params, call, runtime

    @staticmethod
    def runtime_param(
        w: Writer, fn: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Module
    ) -> str | None:
        """The first required parameter typed with a twinned class: its runtime is used."""
        a = fn.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            if arg.annotation is None or arg.arg in ("self", "cls"):
                continue
            inner, optional = _is_optional(arg.annotation)
            if not optional and w.gen.is_twin(w.canon_of(inner, ctx)):
                return arg.arg
        return None

    @staticmethod
    def convert_arg(name: str, conv: Conversion, rt: str) -> str:
        if conv.kind == "unwrap":
            return f"None if {name} is None else {name}._a" if conv.optional else f"{name}._a"
        if conv.kind in ("hook", "listener", "listener_nowait"):
            wrap = {"hook": "hook", "listener": "listener", "listener_nowait": "listener_nowait"}
            value = f"{rt}.{wrap[conv.kind]}({name})"
            return f"None if {name} is None else {value}" if conv.optional else value
        return name

    def function_text(
        self,
        w: Writer,
        fn: ast.FunctionDef | ast.AsyncFunctionDef,
        ctx: Module,
        target: str | None = None,
        level: int = 0,
    ) -> list[str]:
        """A function (or static method): forwards on its client's runtime, or starts one."""
        target = target or f"_async.{fn.name}"
        runtime = self.runtime_param(w, fn, ctx)
        rt = "runtime" if runtime is None else f"{runtime}._rt"  # the twinned argument's
        params, call, runtime = self.signature(w, fn, ctx, rt)
        result = w.result(fn.returns, ctx)
        lines = _def(fn.name, params, result.annotation, level)
        x = _suffix(params)
        doc = _doc_segment(fn.body, ctx)
        if doc:
            lines.append(_indent(level + 1) + _rewrite_doc(doc))
        is_async = isinstance(fn, ast.AsyncFunctionDef) and not _is_async_generator(fn)
        ind = _indent(level + 1)
        if runtime is None:
            if result.kind not in ("twin",) or result.optional:
                raise GenError(
                    f"{ctx.path}: {fn.name}() takes no twinned argument, so it must return a "
                    "twinned object (a new client that owns its runtime)"
                )
            w.need("etcd_recipes.sync._runtime", "Runtime")
            factory = "Runtime.create_awaiting" if is_async else "Runtime.create"
            lines += _call(factory, [target, *call], level + 1, f"runtime{x}, value{x} = ")
            twin = f"runtime{x}.twin(value{x}, None)"
            lines.append(f"{ind}result{x}: {result.annotation} = {twin}")
            lines.append(f"{ind}return result{x}")
            return lines
        method = "call" if is_async else "call_sync"
        func = f"{runtime}._rt.{method}"
        return lines + self.forward(w, result, func, [target, *call], runtime, level + 1, x)

    def forward(
        self,
        w: Writer,
        result: Conversion,
        func: str,
        args: list[str],
        owner: str,
        level: int,
        x: str,
    ) -> list[str]:
        """Body lines calling ``func(*args)``; twinned results are wrapped by ``owner._twin``.

        ``x`` suffixes the locals so they never shadow a parameter."""
        ind = _indent(level)
        if result.kind == "none":
            return _call(func, args, level)
        if result.kind == "plain":
            return _call(func, args, level, "return ")
        lines = _call(func, args, level, f"value{x} = ")
        if result.kind == "twin":
            lines.append(f"{ind}result{x}: {result.annotation} = {owner}._twin(value{x})")
        else:
            helper = "SyncContextManager" if result.kind == "cm" else "SyncIterator"
            w.need("etcd_recipes.sync._twin", helper)
            convert = f", {owner}._twin" if result.element_twinned else ""
            wrapped = f"{helper}({owner}._rt, value{x}{convert})"
            lines.append(f"{ind}result{x}: {result.annotation} = {wrapped}")
        lines.append(f"{ind}return result{x}")
        return lines

    # ---------------------------------------------------------------- classes

    def class_text(self, w: Writer, plan: ClassPlan) -> list[str]:
        ctx = plan.ctx
        bases: list[str] = []
        for canon in plan.twinned_bases:
            bases.append(w.need(self.twins[canon], canon[1]))
        if not bases:
            bases.append(w.need("etcd_recipes.sync._twin", "SyncTwin"))
        if plan.type_params:
            params = ", ".join(w.text(p, ctx) for p in plan.type_params)
            bases.append(f"{w.need('typing', 'Generic')}[{params}]")
        bases.append(f"twin_of=_async.{plan.name}")
        lines = _call(f"class {plan.name}", bases, 0)
        lines[-1] += ":"
        doc = _doc_segment(plan.node.body, ctx)
        if doc:
            lines.append(_indent(1) + _rewrite_doc(doc))
            lines.append("")
        suffix = ""
        if plan.type_params:
            suffix = f"[{', '.join(w.text(p, ctx) for p in plan.type_params)}]"
        lines.append(f"{_indent(1)}_a: _async.{plan.name}{suffix}")
        if plan.init is not None:
            init_lines = self.init_text(w, plan)
            if init_lines:
                lines.append("")
                lines.extend(init_lines)
        has_next = any(m.name == "__anext__" for m in plan.members)
        for member in plan.members:
            lines.append("")
            lines.extend(self.member_text(w, plan, member, has_next))
        return lines

    def init_text(self, w: Writer, plan: ClassPlan) -> list[str]:
        """A constructor for classes built on a twinned object (recipes take ``client``)."""
        assert plan.init is not None
        fn, ctx, overloads = plan.init
        runtime = self.runtime_param(w, fn, ctx)
        if runtime is None:
            return []  # created by factories only (SyncTwin.__init__ explains that)
        params, call, _ = self.signature(w, fn, ctx, f"{runtime}._rt")
        lines = self.overload_stubs(w, overloads, "__init__", ctx)
        lines += _def("__init__", params, "None", 1)
        doc = _doc_segment(fn.body, ctx)
        if doc:
            lines.append(_indent(2) + _rewrite_doc(doc))
        x = _suffix(params)
        target = [f"_async.{plan.name}", *call]
        lines += _call(f"{runtime}._rt.call_sync", target, 2, f"value{x} = ")
        lines.append(f"{_indent(2)}self._bind({runtime}._rt, value{x}, {runtime}._owner())")
        return lines

    def overload_stubs(
        self, w: Writer, overloads: Overloads, name: str, ctx: Module, *, cm: bool = False
    ) -> list[str]:
        """``@overload`` stubs with twinned signatures."""
        lines: list[str] = []
        for fn in overloads:
            params, _, _ = self.signature(w, fn, ctx, "self._rt")
            returns = "None" if name == "__init__" else w.result(fn.returns, ctx, cm=cm).annotation
            lines.append(f"{_indent(1)}@{w.need('typing', 'overload')}")
            lines += _def(name, params, returns, 1)
            lines[-1] += " ..."
            lines.append("")
        return lines

    def member_text(self, w: Writer, plan: ClassPlan, m: Member, has_next: bool) -> list[str]:
        ctx = m.ctx
        if m.kind in ("property", "attribute"):
            return self.property_text(w, m)
        if m.kind == "classattr":
            ann = f": {w.text(m.annotation, ctx)}" if m.annotation is not None else ""
            return [f"{_indent(1)}{m.name}{ann} = _async.{plan.name}.{m.name}"]
        fn = m.node
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        decs = [d for d in _decorators(fn) if d not in ("abstractmethod", "abc.abstractmethod")]
        acm = any(d.endswith("asynccontextmanager") for d in decs)
        decs = [d for d in decs if not d.endswith("asynccontextmanager")]
        static = decs in (["staticmethod"], ["classmethod"])
        if decs and not static:
            raise GenError(f"{ctx.path}: cannot twin {plan.name}.{m.name} decorated with {decs}")
        name = RENAMES.get(m.name, m.name)
        if static:
            target = f"_async.{plan.name}.{m.name}"
            return [f"{_indent(1)}@{decs[0]}", *self.function_text(w, fn, ctx, target, 1)]
        params, call, _ = self.signature(w, fn, ctx, "self._rt")
        is_async = isinstance(fn, ast.AsyncFunctionDef) and not _is_async_generator(fn)
        if m.name == "__aiter__" and has_next and _returns_self(fn):
            inner = w.result(fn.returns, ctx)
            lines = _def(name, params, inner.annotation, 1)
            return [*lines, f"{_indent(2)}return self"]
        result = w.result(fn.returns, ctx, cm=acm)
        lines = self.overload_stubs(w, m.overloads, name, ctx, cm=acm)
        lines += _def(name, params, result.annotation, 1)
        doc = _doc_segment(fn.body, ctx)
        if doc:
            lines.append(_indent(2) + _rewrite_doc(doc))
        if m.name == "__aenter__":
            return lines + self.enter_text(result, _suffix(params))
        if m.name == "__aexit__":
            return lines + self.exit_text(result, call, _suffix(params))
        if m.name == "__anext__":
            anext = [f"self._a.{m.name}"]
            return lines + self.forward(w, result, "self._rt.next", anext, "self", 2, "")
        if m.name == "aclose":
            body = _call("self._rt.call_closing", ["self._a.aclose", *call], 3)
            return [
                *lines,
                f"{_indent(2)}try:",
                *body,
                f"{_indent(2)}finally:",
                f"{_indent(3)}self._release()",
            ]
        if is_async and result.kind in ("iter", "cm"):
            raise GenError(f"{ctx.path}: async {m.name} returning {result.annotation}")
        method = "self._rt.call" if is_async else "self._rt.call_sync"
        args = [f"self._a.{m.name}", *call]
        return lines + self.forward(w, result, method, args, "self", 2, _suffix(params))

    @staticmethod
    def enter_text(result: Conversion, x: str) -> list[str]:
        lines = [
            f"{_indent(2)}try:",
            f"{_indent(3)}value{x} = self._rt.enter(self, self._a)",
            f"{_indent(2)}except BaseException:",
            f"{_indent(3)}self._release()",
            f"{_indent(3)}raise",
        ]
        if result.kind == "twin":
            lines.append(f"{_indent(2)}result{x}: {result.annotation} = self._twin(value{x})")
        elif result.kind == "plain" and result.annotation is not None:
            lines.append(f"{_indent(2)}result{x}: {result.annotation} = value{x}")
        else:
            raise GenError(f"cannot twin __aenter__ returning {result.annotation}")
        return [*lines, f"{_indent(2)}return result{x}"]

    @staticmethod
    def exit_text(result: Conversion, call: list[str], x: str) -> list[str]:
        args = ", ".join(["self", *call])
        if result.kind == "none":
            body = [f"{_indent(3)}self._rt.exit({args})"]
        else:
            body = [
                f"{_indent(3)}result{x}: {result.annotation} = self._rt.exit({args})",
                f"{_indent(3)}return result{x}",
            ]
        return [
            f"{_indent(2)}try:",
            *body,
            f"{_indent(2)}finally:",
            f"{_indent(3)}self._release()",
        ]

    def property_text(self, w: Writer, m: Member) -> list[str]:
        ctx = m.ctx
        if m.kind == "property":
            fn = m.node
            assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(fn, ast.AsyncFunctionDef):
                raise GenError(f"{ctx.path}: async property {m.name}")
            ann, doc = fn.returns, _doc_segment(fn.body, ctx)
        else:
            ann, doc = m.annotation, m.doc
        result = w.result(ann, m.ann_ctx or ctx)
        if result.kind in ("iter", "cm", "none"):
            raise GenError(f"{ctx.path}: cannot twin the property {m.name}: {result.annotation}")
        lines = [f"{_indent(1)}@property", *_def(m.name, ["self"], result.annotation, 1)]
        if doc:
            lines.append(_indent(2) + _rewrite_doc(doc))
        read = f"lambda: self._a.{m.name}"
        lines += self.forward(w, result, "self._rt.call_sync", [read], "self", 2, "")
        return lines

    # ---------------------------------------------------------------- package __init__

    def package_text(self) -> str:
        exports: dict[str, Canon] = {}

        def add(name: str, module: str) -> None:
            previous = exports.setdefault(name, (module, name))
            if previous != (module, name):
                raise GenError(f"etcd_recipes.sync: {name!r} is exported twice ({previous})")

        for path, names in self.shared:
            mod = self.index.by_path(path)
            chosen = list(names) if names is not None else list(mod.all or [])
            for name in chosen:
                if mod.all is None or name not in mod.all:
                    raise GenError(f"{path}: {name!r} is not in the module's __all__")
                add(name, mod.name)
        for mod, names in self.inputs:
            for name in names:
                add(name, self.out_name(mod))
        for module, name in RUNTIME_EXPORTS:
            add(name, module)
        imports: dict[str, set[str]] = {}
        for name, (module, _) in exports.items():
            imports.setdefault(module, set()).add(name)
        lines = [
            HEADER.format(source="its INPUTS and SHARED lists"),
            PACKAGE_DOC,
            "",
            *_import_block(imports, 0),
            "",
            "__all__ = [",
            *(f'    "{name}",' for name in sorted(exports)),
            "]",
        ]
        return "\n".join(lines) + "\n"


def _returns_self(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in fn.body if not isinstance(s, ast.Expr)]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Name)
        and body[0].value.id == "self"
    )


# --------------------------------------------------------------------------- imports (isort order)


def _section(module: str) -> int:
    top = module.split(".")[0]
    if top == "__future__":
        return 0
    if top in STDLIB:
        return 1
    if top == PACKAGE:
        return 3
    return 2


def _member_key(name: str) -> tuple[int, str]:
    # ruff/isort "order-by-type": CONSTANTS, then Classes, then the rest; case-insensitive.
    letters = name.strip("_")
    if len(letters) > 1 and letters.isupper():
        rank = 0
    elif letters[:1].isupper():
        rank = 1
    else:
        rank = 2
    return rank, name.lower()


def _import_block(
    imports: dict[str, set[str]], level: int, aliased: dict[str, str] | None = None
) -> list[str]:
    """``from m import a, B`` lines grouped and ordered the way ruff's isort wants them."""
    ind = _indent(level)
    entries = {m: sorted(n, key=_member_key) for m, n in imports.items()}
    for module, alias in (aliased or {}).items():
        entries[module] = [alias]
    by_section: dict[int, list[str]] = {}
    for module in sorted(entries, key=str.lower):
        names = entries[module]
        one = f"{ind}from {module} import {', '.join(names)}"
        block = [one]
        if len(one) > LINE:
            block = [f"{ind}from {module} import (", *(f"{ind}    {n}," for n in names), f"{ind})"]
        by_section.setdefault(_section(module), []).extend(block)
    out: list[str] = []
    for section in sorted(by_section):
        if out:
            out.append("")
        out.extend(by_section[section])
    return out


# --------------------------------------------------------------------------- files and check


def generate(source_root: Path) -> dict[str, str]:
    """Every generated file (relative to the output directory) and its text.

    Example::

        files = generate(Path("."))
        print(files["client.py"][:80])
    """
    return Generator(source_root).generate()


def _generated_on_disk(output: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if output.is_dir():
        for file in sorted(output.rglob("*.py")):
            text = file.read_text(encoding="utf-8")
            if text.startswith(MARKER):
                found[file.relative_to(output).as_posix()] = text
    return found


def check(source_root: Path, output: Path | None = None) -> list[str]:
    """Problems (with unified diffs) between the committed output and a fresh generation.

    Example::

        problems = check(Path("."))
        assert not problems, "\\n".join(problems)
    """
    output = output or source_root / OUTPUT
    expected = generate(source_root)
    actual = _generated_on_disk(output)
    problems: list[str] = []
    for rel, text in expected.items():
        file = output / rel
        if not file.is_file():
            problems.append(f"missing generated file: {file}")
            continue
        current = file.read_text(encoding="utf-8")
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{file} (committed)",
                f"{file} (generated)",
            )
            problems.append(f"stale generated file: {file}\n{''.join(diff)}")
    for rel in sorted(set(actual) - set(expected)):
        problems.append(f"generated file no input produces (delete it): {output / rel}")
    return problems


def write(source_root: Path, output: Path | None = None) -> list[Path]:
    """(Re)write the output; remove generated files no input produces. Returns changed files.

    Example::

        for path in write(Path(".")):
            print("wrote", path)
    """
    output = output or source_root / OUTPUT
    expected = generate(source_root)
    changed: list[Path] = []
    for rel, text in expected.items():
        file = output / rel
        if not file.is_file() or file.read_text(encoding="utf-8") != text:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text, encoding="utf-8")
            changed.append(file)
    for rel in sorted(set(_generated_on_disk(output)) - set(expected)):
        (output / rel).unlink()
        changed.append(output / rel)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring); returns the exit status.

    Example::

        sys.exit(main(["--check"]))
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    parser.add_argument(
        "--source-root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the directory that contains the etcd_recipes package (default: the repository)",
    )
    parser.add_argument("--output", type=Path, help=f"default: <source-root>/{OUTPUT}")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(args.source_root, args.output)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("etcd_recipes/sync is out of date: run tools/gen_sync.py", file=sys.stderr)
                return 1
            return 0
        for path in write(args.source_root, args.output):
            print(f"wrote {path}")
    except GenError as exc:
        print(f"gen_sync: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
