"""Deciding what is twinned (from the export list) and what each twinned class contains."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from . import index as ix
from .index import ABC, Canon, Func, GenError, Index, Module
from .rules import PACKAGE, SPECIAL, Usage

ASYNC_TYPES = {"AsyncIterator", "AsyncIterable", "AsyncGenerator", "AsyncContextManager"}
ASYNC_TYPES |= {"AbstractAsyncContextManager", "Awaitable", "Coroutine"}


def is_async(canon: Canon | None) -> bool:
    """Whether ``canon`` is an async iterator/context manager/awaitable type."""
    return canon is not None and canon[0] in (*ABC, "contextlib") and canon[1] in ASYNC_TYPES


@dataclass
class Member:
    """A public member of a twinned class, with the module its annotations belong to."""

    name: str
    node: ast.stmt
    ctx: Module
    kind: str  # method | property | attribute | classattr
    doc: str | None = None
    annotation: ast.expr | None = None
    overloads: list[Func] = field(default_factory=list)
    ann_ctx: Module | None = None  # where ``annotation`` was written (inferred types)


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
        for module, names in self.index.exports():
            for name in names:
                canon = self.index.resolve(module, name)
                if canon[1] != name:
                    raise GenError(f"{module}: {name!r} is an alias of {canon}; export the name")
                self.exports[name] = canon
        self.twins: dict[Canon, str] = {}  # async class -> its sync module
        self.functions: set[Canon] = set()
        candidates = list(self.exports.values())
        changed = True
        while changed:  # names used by twinned signatures are twinned too, until stable
            changed = False
            for canon in candidates:
                if canon in self.twins or canon in self.functions:
                    continue
                found = self.index.definition(canon)
                node = found[1] if found else None
                if isinstance(node, ast.ClassDef) and self.has_async_api(canon):
                    self.twins[canon] = out_name(canon[0])
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    isinstance(node, ast.AsyncFunctionDef)
                    or self.mentions_async(node.returns, found[0] if found else None)
                ):
                    self.functions.add(canon)
                else:
                    continue
                changed = True
                candidates += self.referenced(canon)

    def referenced(self, canon: Canon) -> list[Canon]:
        """Public package classes named by the public signatures of a class (and of its
        private bases) or of a function: candidates for implicit twins."""
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
        anns += [f.returns for f in fns]
        for ann in anns:
            for name in ast.walk(ann) if ann is not None else ():
                ref = self.index.canon_of(name, mod) if isinstance(name, ast.expr) else None
                if ref and ref[0].startswith(PACKAGE + ".") and ref[1][:1].isupper():
                    out.append(ref)
        return out

    def is_twin(self, canon: Canon | None) -> bool:
        """Whether ``canon`` is a twinned class, or a TypeVar bound to one."""
        return canon is not None and (canon in self.twins or self.twin_bound(canon) is not None)

    def typevar(self, canon: Canon) -> ast.Call | None:
        """The ``TypeVar(...)`` call that defines ``canon``, if it is a TypeVar."""
        found = self.index.definition(canon)
        call = found[1].value if found and isinstance(found[1], ast.Assign) else None
        if (
            isinstance(call, ast.Call)
            and found
            and self.index.is_abc(call.func, found[0], "TypeVar")
        ):
            return call
        return None

    def twin_bound(self, canon: Canon) -> Canon | None:
        """For ``R = TypeVar("R", bound="Recipe")`` with a twinned bound: that bound."""
        call, mod = self.typevar(canon), self.index.module(canon[0])
        for kw in call.keywords if call is not None and mod is not None else ():
            target = self.index.canon_of(kw.value, mod) if kw.arg == "bound" and mod else None
            if target is not None and target in self.twins:
                return target
        return None

    def has_async_api(self, canon: Canon) -> bool:
        """Whether ``canon`` is a package class with public async methods, ``async with`` /
        ``async for`` or methods returning async iterators/context managers (itself or
        through its package bases): such a class is twinned, never handed out as is."""
        if canon in self.twins:
            return True
        found = self.index.definition(canon)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return False
        mod, node = found[0], found[1]
        for stmt in public_methods(node):
            if isinstance(stmt, ast.AsyncFunctionDef) or self.async_type(stmt.returns, mod):
                return True
        return any(b != canon and self.package_async(b) for b in self.bases(node, mod))

    def package_async(self, canon: Canon) -> bool:
        return canon[0].startswith(PACKAGE + ".") and self.has_async_api(canon)

    def bases(self, node: ast.ClassDef, mod: Module) -> list[Canon]:
        targets = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
        return [c for t in targets if (c := self.index.canon_of(t, mod)) is not None]

    def async_type(self, node: ast.expr | None, ctx: Module) -> bool:
        """Whether ``node`` names an async iterator/context manager/awaitable type."""
        subs = ast.walk(node) if node is not None else ()
        return any(is_async(self.index.canon_of(s, ctx)) for s in subs if isinstance(s, ast.expr))

    def mentions_async(self, node: ast.expr | None, ctx: Module | None) -> str | None:
        """A twinned or async type anywhere inside ``node`` (which plain passing would leak)."""
        for sub in ast.walk(node) if node is not None and ctx is not None else ():
            if isinstance(sub, (ast.Name, ast.Constant, ast.Attribute)) and ctx is not None:
                canon = self.index.canon_of(sub, ctx)
                if canon and (self.is_twin(canon) or is_async(canon) or self.package_async(canon)):
                    return canon[1]
        return None

    def modules(self) -> dict[str, list[str]]:
        """Source module -> its twinned names, in source order (bases before subclasses)."""
        out: dict[str, list[str]] = {}
        for module, _, name in sorted(
            (c[0], self.lineno(c), c[1]) for c in [*self.twins, *self.functions]
        ):
            out.setdefault(module, []).append(name)
        return out

    def lineno(self, canon: Canon) -> int:
        found = self.index.definition(canon)
        return found[1].lineno if found else 0

    def plan(self, mod: Module, node: ast.ClassDef) -> ClassPlan:
        """The members of a twinned class: its own, then those of its private bases (flattened);
        the nearest twinned classes among its ancestors become the twin's bases."""
        twinned_bases: list[Canon] = []
        type_params: list[ast.expr] = []
        members: dict[str, Member] = {}
        inits: list[tuple[ast.FunctionDef, Module, list[Func]]] = []

        def collect(cls: ast.ClassDef, ctx: Module, own: bool, twinned: bool) -> None:
            attrs: list[Member] = []
            pending: dict[str, list[Func]] = {}
            for stmt in cls.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    decs = ix.decorators(stmt)
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
                canon = self.index.canon_of(target, ctx)
                if canon is None or not isinstance(target, (ast.Name, ast.Attribute)):
                    raise GenError(f"{ctx.path}: unsupported base class {ast.unparse(base)!r}")
                is_twin = canon in self.twins
                if own and isinstance(base, ast.Subscript) and not is_twin:
                    known = {ast.dump(p) for p in type_params}
                    for p in ix.slice_items(base):
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
        """Public ``self.x = ...`` assignments of an ``__init__``, with their types."""
        args = init.args.args + init.args.kwonlyargs
        params = {a.arg: a.annotation for a in args if a.annotation}
        out: list[Member] = []
        for i, stmt in enumerate(init.body):
            if isinstance(stmt, ast.AnnAssign):
                target: ast.expr = stmt.target
                ann, ann_ctx = stmt.annotation, ctx
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            else:
                continue
            if not isinstance(target, ast.Attribute) or ast.unparse(target.value) != "self":
                continue
            if target.attr.startswith("_"):
                continue
            if isinstance(stmt, ast.Assign):
                ann, ann_ctx = self.infer(stmt.value, params, ctx, target.attr)
            doc = ix.doc_segment(init.body[i + 1 : i + 2], ctx)
            head = ann.value if isinstance(ann, ast.Subscript) else ann
            if self.usage.opaque(self.index.canon_of(head, ann_ctx)):
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
            found = self.index.definition(self.index.resolve(ctx.name, value.func.id))
            if found and isinstance(found[1], ast.FunctionDef) and found[1].returns is not None:
                return found[1].returns, found[0]
            if found and isinstance(found[1], ast.ClassDef):  # an instance of that class
                return ast.Name(found[1].name), found[0]
        raise GenError(
            f"{ctx.path}:{value.lineno}: cannot infer the type of self.{attr}; annotate it "
            f"(self.{attr}: T = ...) in the async source"
        )


def out_name(module: str) -> str:
    """``etcd_recipes.locks.mutex`` -> ``etcd_recipes.sync.locks.mutex``."""
    return f"{PACKAGE}.sync.{module.removeprefix(PACKAGE + '.')}"


def public_methods(node: ast.ClassDef) -> list[Func]:
    """The public and twinned dunder methods defined in ``node``'s body."""
    return [
        f
        for f in node.body
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (f.name in SPECIAL or not f.name.startswith("_"))
    ]
