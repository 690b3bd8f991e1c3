"""Reading the async source (parsed modules, name resolution, the export list) and deciding
what is twinned and what each twinned class contains."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .rules import EXPORTS, PACKAGE, SPECIAL, Usage

Canon = tuple[str, str]  # (defining module, name)
Func = ast.FunctionDef | ast.AsyncFunctionDef
ABC = ("collections.abc", "typing", "typing_extensions")
SELF = {("typing", "Self"), ("typing_extensions", "Self")}


class GenError(Exception):
    """The async source uses a shape the generator cannot twin (the message says which)."""


@dataclass
class Module:
    """One parsed module of the package."""

    name: str
    path: str  # relative to the source root, e.g. "etcd_recipes/client.py"
    source: str
    tree: ast.Module
    defs: dict[str, ast.stmt] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.name.split(".")
        parts = parts[: len(parts) - node.level + self.path.endswith("__init__.py")]
        return ".".join(parts + ([node.module] if node.module else []))


class Index:
    """Parses package modules on demand and resolves names to where they are defined."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = None
            rel = name.replace(".", "/")
            paths = [f"{rel}.py", f"{rel}/__init__.py"] if name.split(".")[0] == PACKAGE else []
            for path in [p for p in paths if (self.root / p).is_file()][:1]:
                source = (self.root / path).read_text(encoding="utf-8")
                mod = self._modules[name] = Module(name, path, source, ast.parse(source, path))
                _index_module(mod, mod.tree.body)
        return self._modules[name]

    def definition(self, canon: Canon) -> tuple[Module, ast.stmt] | None:
        mod = self.module(canon[0])
        stmt = mod.defs.get(canon[1]) if mod else None
        return None if mod is None or stmt is None else (mod, stmt)

    def resolve(self, module: str, name: str) -> Canon:
        """Follow imports until the module that defines ``name``; builtins resolve to builtins."""
        seen: set[Canon] = set()
        while (module, name) not in seen:
            seen.add((module, name))
            mod = self.module(module)
            if mod is None or name in mod.defs:
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

    def canon_of(self, node: ast.expr, ctx: Module) -> Canon | None:
        """Where the name ``node`` (or a string forward reference to it) is defined."""
        if isinstance(node, ast.Name):  # None for a module
            is_module = ctx.imports.get(node.id, ("", ""))[1] is None
            return None if is_module else self.resolve(ctx.name, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            src, attr = ctx.imports.get(node.value.id, ("", ""))
            if attr is None:
                return src, node.attr  # ``module.Name``
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                return self.canon_of(ast.parse(node.value, mode="eval").body, ctx)
            except (SyntaxError, GenError):  # not a forward reference (a Literal value, ...)
                return None
        return None

    def is_abc(self, node: ast.expr, ctx: Module, *names: str) -> bool:
        canon = self.canon_of(node, ctx)
        return canon is not None and canon[0] in ABC and canon[1] in names

    def exports(self) -> list[tuple[str, list[str]]]:
        """``(module, names)`` of each ``from .module import names``; ``__all__`` is their union."""
        if (mod := self.module(PACKAGE)) is None:
            raise GenError(f"no {EXPORTS} under {self.root}")
        found: list[tuple[str, list[str]]] = []
        all_ = mod.defs.get("__all__")
        if not isinstance(all_, ast.Assign) or not isinstance(all_.value, (ast.List, ast.Tuple)):
            raise GenError(f"{EXPORTS}: __all__ must be a literal list")
        declared = [ast.literal_eval(e) for e in all_.value.elts]
        for stmt in mod.tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level:  # a renamed one fails the check
                found.append((mod.absolute(stmt), [a.name for a in stmt.names]))
        seen = [n for _, names in found for n in names]
        if sorted(declared) != sorted(seen):  # each name once in each
            extra, missing = sorted(set(declared) - set(seen)), sorted(set(seen) - set(declared))
            raise GenError(
                f"{EXPORTS}: __all__ must list each imported name once "
                f"(not imported: {extra}, not in __all__: {missing})"
            )
        return found


def _index_module(mod: Module, body: Iterable[ast.stmt]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.ImportFrom):
            src = mod.absolute(stmt)
            for alias in stmt.names:
                mod.imports[alias.asname or alias.name] = (src, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                top = alias.name if alias.asname else alias.name.split(".")[0]
                mod.imports[alias.asname or top] = (top, None)
        elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.defs[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            mod.defs.update({t.id: stmt for t in targets if isinstance(t, ast.Name)})
        elif isinstance(stmt, (ast.If, ast.Try)):  # TYPE_CHECKING blocks and the like
            _index_module(mod, [*stmt.body, *(stmt.orelse if isinstance(stmt, ast.If) else [])])


def decorators(fn: Func) -> list[str]:
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]


def doc_segment(body: list[ast.stmt], ctx: Module) -> str | None:
    first = body[0].value if body and isinstance(body[0], ast.Expr) else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return ast.get_source_segment(ctx.source, first)
    return None


def split_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    """``X | None`` / ``None | X`` -> (X, True); anything else -> (node, False)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for this, other in ((node.left, node.right), (node.right, node.left)):
            if is_none(other):
                return this, True
    return node, False


def slice_items(node: ast.Subscript) -> list[ast.expr]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def parse_str(node: ast.expr) -> ast.expr:
    """A string annotation parsed to its expression; other nodes unchanged."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return node
    return node


ASYNC_TYPES = {"AsyncIterator", "AsyncIterable", "AsyncGenerator", "AsyncContextManager"}
ASYNC_TYPES |= {"AbstractAsyncContextManager", "Awaitable", "Coroutine"}


def is_async(canon: Canon) -> bool:
    """Whether ``canon`` is an async iterator/context manager/awaitable type."""
    return canon[0] in (*ABC, "contextlib") and canon[1] in ASYNC_TYPES


@dataclass
class Member:
    """A public member of a twinned class, with the module its annotations belong to."""

    name: str
    node: ast.stmt
    ctx: Module
    kind: str  # method | property (properties and attributes) | classattr
    doc: str | None = None
    annotation: ast.expr | None = None
    overloads: list[Func] = field(default_factory=list)


@dataclass
class ClassPlan:
    name: str
    node: ast.ClassDef
    ctx: Module
    twinned_bases: list[Canon]
    type_params: list[ast.expr]
    init: tuple[ast.FunctionDef, Module, list[Func]] | None
    members: list[Member]


class Plan:
    """The twinned classes and functions (by defining module) and the shared names."""

    def __init__(self, root: Path, usage: Usage) -> None:
        self.index = Index(root)
        self.usage = usage
        self.exports: dict[str, Canon] = {}  # public name -> where it is defined
        for module, name in [(m, n) for m, names in self.index.exports() for n in names]:
            if (canon := self.index.resolve(module, name))[1] != name:
                raise GenError(f"{module}: {name!r} is an alias of {canon}; export the name")
            self.exports[name] = canon
        self.twins: dict[Canon, str] = {}  # async class -> its sync module
        self.functions: set[Canon] = set()
        candidates = list(self.exports.values())
        for canon in candidates:  # grows: names used by twinned signatures are candidates too
            found = self.index.definition(canon)
            if canon in self.twins or canon in self.functions or found is None:
                continue
            if isinstance(found[1], ast.ClassDef) and self.has_async_api(canon):
                self.twins[canon] = out_name(canon[0])
            elif isinstance(fn := found[1], ast.AsyncFunctionDef) or (
                isinstance(fn, ast.FunctionDef) and self.mentions_async(fn.returns, found[0])
            ):
                self.functions.add(canon)
            else:
                continue
            candidates += self.referenced(canon)

    def referenced(self, canon: Canon) -> list[Canon]:
        """Package classes in public signatures (private bases too): implicit twin candidates."""
        if (found := self.index.definition(canon)) is None:
            return []
        mod, node = found
        out: list[Canon] = []
        fns = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):
            fns = [f for f in public_methods(node) if f.name != "__init__"]
            for base in self.bases(node, mod):
                out += self.referenced(base) if base[1].startswith("_") else []
        anns = [x.annotation for f in fns for x in [*f.args.args, *f.args.kwonlyargs]]
        refs = [r for ann in [*anns, *(f.returns for f in fns)] for r in self.names_in(ann, mod)]
        return out + [r for r in refs if r[0].startswith(PACKAGE + ".") and r[1][:1].isupper()]

    def names_in(self, node: ast.expr | None, ctx: Module) -> list[Canon]:
        """Where each name inside the annotation ``node`` is defined."""
        subs = [s for s in ast.walk(node) if isinstance(s, ast.expr)] if node is not None else []
        return [c for s in subs if (c := self.index.canon_of(s, ctx)) is not None]

    def is_twin(self, canon: Canon | None) -> bool:
        """Whether ``canon`` is a twinned class or ``Self`` (only twinned classes are emitted)."""
        return canon in self.twins or canon in SELF

    def typevar(self, canon: Canon) -> tuple[ast.Call, Module] | None:
        """The ``TypeVar(...)`` call that defines ``canon`` and its module, if it is a TypeVar."""
        mod, stmt = self.index.definition(canon) or (None, None)
        call = stmt.value if isinstance(stmt, ast.Assign) else None
        if isinstance(call, ast.Call) and mod and self.index.is_abc(call.func, mod, "TypeVar"):
            return call, mod
        return None

    def has_async_api(self, canon: Canon) -> bool:
        """Whether ``canon`` (or a package base) has public async methods or returns async types."""
        found = self.index.definition(canon)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return False
        mod, node = found[0], found[1]
        for fn in public_methods(node):
            returns = self.names_in(fn.returns, mod)
            if isinstance(fn, ast.AsyncFunctionDef) or any(map(is_async, returns)):
                return True
        return any(b != canon and self.has_async_api(b) for b in self.bases(node, mod))

    def bases(self, node: ast.ClassDef, mod: Module) -> list[Canon]:
        targets = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
        return [c for t in targets if (c := self.index.canon_of(t, mod)) is not None]

    def mentions_async(self, node: ast.expr | None, ctx: Module) -> str | None:
        """A twinned or async type anywhere inside ``node`` (which plain passing would leak)."""
        for c in self.names_in(node, ctx):
            if self.is_twin(c) or is_async(c) or self.has_async_api(c):
                return c[1]
        return None

    def modules(self) -> dict[str, list[str]]:
        """Source module -> its twinned names, in source order (bases before subclasses)."""
        out: dict[str, list[str]] = {}
        found = {c: self.index.definition(c) for c in [*self.twins, *self.functions]}
        for m, _, n in sorted((c[0], f[1].lineno, c[1]) for c, f in found.items() if f):
            out.setdefault(m, []).append(n)
        return out

    def plan(self, mod: Module, node: ast.ClassDef) -> ClassPlan:
        """A twinned class: own members, then private bases' (flattened); nearest twinned bases."""
        twinned_bases: list[Canon] = []
        type_params: list[ast.expr] = []
        members: dict[str, Member] = {}
        inits: list[tuple[ast.FunctionDef, Module, list[Func]]] = []

        def collect(cls: ast.ClassDef, ctx: Module, own: bool, twinned: bool) -> None:
            attrs: list[Member] = []
            pending: dict[str, list[Func]] = {}
            for i, stmt in enumerate(cls.body):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    decs = decorators(stmt)
                    if "overload" in decs or "typing.overload" in decs:
                        pending.setdefault(stmt.name, []).append(stmt)
                        continue
                    overloads = pending.pop(stmt.name, [])
                    if stmt.name == "__init__" and isinstance(stmt, ast.FunctionDef):
                        inits.append((stmt, ctx, overloads))
                        if not twinned:
                            attrs.extend(self.attributes(stmt, ctx))
                        continue
                    private = stmt.name.startswith("_") and stmt.name not in SPECIAL
                    if twinned or stmt.name in members or private:
                        continue
                    if any(d.endswith((".setter", ".deleter")) for d in decs):
                        raise GenError(f"{ctx.path}: property setters are not supported yet")
                    prop = "property" in decs  # read-only (an async one fails mypy on the twin)
                    doc, ann = (doc_segment(stmt.body, ctx), stmt.returns) if prop else (None, None)
                    kind = "property" if prop else "method"
                    members[stmt.name] = Member(stmt.name, stmt, ctx, kind, doc, ann, overloads)
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and not twinned:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    ann = stmt.annotation if isinstance(stmt, ast.AnnAssign) else None
                    names = [t.id for t in targets if isinstance(t, ast.Name)]
                    for n in [n for n in names if not n.startswith("_") and n not in members]:
                        if stmt.value is not None:
                            members[n] = Member(n, stmt, ctx, "classattr", None, ann)
                        else:  # ``x: T`` declares an instance attribute
                            doc = doc_segment(cls.body[i + 1 : i + 2], ctx)
                            attrs.append(Member(n, stmt, ctx, "property", doc, ann))
            for attr in attrs:
                members.setdefault(attr.name, attr)
            for base in cls.bases:
                target = base.value if isinstance(base, ast.Subscript) else base
                canon = self.index.canon_of(target, ctx)
                if canon is None or not isinstance(target, (ast.Name, ast.Attribute)):
                    raise GenError(f"{ctx.path}: unsupported base class {ast.unparse(base)!r}")
                is_twin = canon in self.twins
                if own and isinstance(base, ast.Subscript) and not is_twin:
                    known = {ast.dump(p) for p in type_params}
                    for p in slice_items(base):
                        tv = self.index.canon_of(p, ctx)
                        if ast.dump(p) not in known and tv and self.typevar(tv) is not None:
                            type_params.append(p)
                if canon[0] in ABC and canon[1] in ("Generic", "Protocol"):
                    continue
                if is_twin and not twinned and canon not in twinned_bases:
                    if isinstance(base, ast.Subscript):
                        raise GenError(f"{ctx.path}: generic twinned bases are not supported yet")
                    twinned_bases.append(canon)
                found = self.index.definition(canon)
                if found is not None and isinstance(found[1], ast.ClassDef):
                    # Members of twinned bases are inherited; only their __init__ matters.
                    collect(found[1], found[0], False, twinned or is_twin)

        collect(node, mod, True, False)
        if "aclose" in members and "close" in members:
            raise GenError(f"{mod.path}: {node.name} has both close() and aclose()")
        init, every = inits[0] if inits else None, list(members.values())
        return ClassPlan(node.name, node, mod, twinned_bases, type_params, init, every)

    def attributes(self, init: ast.FunctionDef, ctx: Module) -> list[Member]:
        """Public ``self.x: T = ...`` assignments of an ``__init__`` (each must be annotated)."""
        out: list[Member] = []
        for i, stmt in enumerate(init.body):
            target: ast.expr | None = stmt.target if isinstance(stmt, ast.AnnAssign) else None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            if not isinstance(target, ast.Attribute) or ast.unparse(target.value) != "self":
                continue
            if target.attr.startswith("_") or any(m.name == target.attr for m in out):
                continue
            if not isinstance(stmt, ast.AnnAssign):
                raise GenError(
                    f"{ctx.path}:{stmt.lineno}: the twin needs the type of self.{target.attr}; "
                    f"annotate it (self.{target.attr}: T = ...) in the async source"
                )
            if any(self.usage.uses("OPAQUE", c) for c in self.names_in(stmt.annotation, ctx)):
                continue
            doc = doc_segment(init.body[i + 1 : i + 2], ctx)
            out.append(Member(target.attr, stmt, ctx, "property", doc, stmt.annotation))
        return out


def out_name(module: str) -> str:
    """``etcd_recipes.locks.mutex`` -> ``etcd_recipes.sync.locks.mutex``."""
    return f"{PACKAGE}.sync.{module.removeprefix(PACKAGE + '.')}"


def public_methods(node: ast.ClassDef) -> list[Func]:
    """The public and twinned dunder methods defined in ``node``'s body."""
    fns = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [f for f in fns if f.name in SPECIAL or not f.name.startswith("_")]
