"""Reading the async source: parsed modules, name resolution, and the export list."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .rules import EXPORTS, PACKAGE

Canon = tuple[str, str]  # (defining module, name)
Func = ast.FunctionDef | ast.AsyncFunctionDef
ABC = ("collections.abc", "typing", "typing_extensions")


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

    @property
    def package(self) -> str:
        return self.name if self.path.endswith("__init__.py") else self.name.rpartition(".")[0]

    def absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))


class Index:
    """Parses package modules on demand and resolves names to where they are defined."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = None
            rel = name.replace(".", "/")
            for path in (
                (f"{rel}.py", f"{rel}/__init__.py") if name.split(".")[0] == PACKAGE else ()
            ):
                if (file := self.root / path).is_file():
                    source = file.read_text(encoding="utf-8")
                    mod = self._modules[name] = Module(name, path, source, ast.parse(source, path))
                    _index_module(mod, mod.tree.body)
                    break
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
        if isinstance(node, ast.Name):
            imported = ctx.imports.get(node.id)
            if imported is not None and imported[1] is None:
                return None  # a module
            return self.resolve(ctx.name, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            imported = ctx.imports.get(node.value.id)
            if imported is not None and imported[1] is None:
                return imported[0], node.attr  # ``module.Name``
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
        """``(module, names)`` of every ``from .module import names`` in the export list.

        ``__all__`` must be exactly the union of those names (and nothing is imported twice).
        """
        if (mod := self.module(PACKAGE)) is None:
            raise GenError(f"no {EXPORTS} under {self.root}")
        found: list[tuple[str, list[str]]] = []
        seen: list[str] = []
        if not isinstance(all_ := mod.defs.get("__all__"), ast.Assign):
            raise GenError(f"{EXPORTS}: no __all__")
        if not isinstance(all_.value, (ast.List, ast.Tuple)):
            raise GenError(f"{EXPORTS}: __all__ must be a literal list")
        declared = [ast.literal_eval(e) for e in all_.value.elts]
        for stmt in mod.tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.level:
                names = [a.asname or a.name for a in stmt.names]
                if any(a.asname and a.asname != a.name for a in stmt.names):
                    raise GenError(f"{EXPORTS}: exports must not be renamed ({names})")
                found.append((mod.absolute(stmt), names))
                seen += names
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice or set(declared) != set(seen) or len(declared) != len(set(declared)):
            extra, missing = sorted(set(declared) - set(seen)), sorted(set(seen) - set(declared))
            raise GenError(
                f"{EXPORTS}: __all__ must equal the imported names "
                f"(not imported: {extra}, not in __all__: {missing}, imported twice: {twice})"
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
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    mod.defs[target.id] = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            mod.defs[stmt.target.id] = stmt
        elif isinstance(stmt, ast.If):  # TYPE_CHECKING blocks and the like
            _index_module(mod, stmt.body)
            _index_module(mod, stmt.orelse)
        elif isinstance(stmt, ast.Try):
            _index_module(mod, stmt.body)


def decorators(fn: Func) -> list[str]:
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]


def doc_segment(body: list[ast.stmt], ctx: Module) -> str | None:
    first = body[0].value if body and isinstance(body[0], ast.Expr) else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return ast.get_source_segment(ctx.source, first)
    return None


def is_async_generator(fn: Func) -> bool:
    nodes: list[ast.AST] = list(fn.body) if isinstance(fn, ast.AsyncFunctionDef) else []
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            nodes += ast.iter_child_nodes(node)
    return False


def returns_self(fn: Func) -> bool:
    body = [s for s in fn.body if not isinstance(s, ast.Expr)]
    ret = body[0] if len(body) == 1 and isinstance(body[0], ast.Return) else None
    return ret is not None and isinstance(ret.value, ast.Name) and ret.value.id == "self"


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
