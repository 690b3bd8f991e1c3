"""Writing twin modules: signatures, conversions at the facade boundary, bodies, imports (the
text is valid Python but not pretty: :func:`tools.gen_sync.ruff` formats it)."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from . import plan as ix
from .plan import Canon, ClassPlan, Func, GenError, Member, Module, Plan, out_name
from .rules import HEADER, PACKAGE_DOC, SYNC_ONLY

Lines = list[str]  # lines of generated code
TWIN, IND = "etcd_recipes.sync._runtime.twin", "    "
ASYNC_ITERS = ("AsyncIterator", "AsyncIterable", "AsyncGenerator")
ACM, AWAITS = ("contextlib", "AbstractAsyncContextManager"), ("Awaitable", "Coroutine")
CONTAINERS = {"cm": ("contextlib", "AbstractContextManager")}
CONTAINERS["iter"] = ("collections.abc", "Iterator")
PACKAGE_TAIL = """
# Twins report the package they are imported from (as etcd_recipes does), not their module.
for _value in list(locals().values()):
    if (isinstance(_value, type) or callable(_value)) and getattr(
        _value, "__module__", ""
    ).startswith("etcd_recipes.sync."):
        _value.__module__ = __name__
del _value"""


def call(func: str, args: list[str], level: int, prefix: str = "") -> Lines:
    return [f"{IND * level}{prefix}{func}({', '.join(args)})"]


def define(name: str, params: list[str], returns: str | None, level: int) -> Lines:
    return [f"{IND * level}def {name}({', '.join(params)}){f' -> {returns}' if returns else ''}:"]


def suffix(params: list[str]) -> str:
    """A suffix that keeps the generated locals (value, result, runtime) off parameter names."""
    names = {p.lstrip("*").split(":")[0].split("=")[0].strip() for p in params}
    sfxs = ("_" * n for n in range(len(params) + 1))
    return next(x for x in sfxs if not names & {f"value{x}", f"result{x}", f"runtime{x}"})


@dataclass
class Conversion:
    """How one parameter or result crosses the facade."""

    kind: str  # plain | unwrap | unwrap_each | hook | listener | listener_nowait | twin | none
    #            | iter | cm | list
    annotation: str | None  # the sync annotation text
    optional: bool = False
    element_twinned: bool = False


class Writer:
    """The text and the imports of one generated module."""

    def __init__(self, plan: Plan, source: Module) -> None:
        self.plan = plan
        self.index = plan.index
        self.out_module = out_name(source.name)
        self.imports: dict[str, set[str]] = {}
        self.tc_imports: dict[str, set[str]] = {}
        self.names: dict[str, Canon] = {"_async": ("", source.name)}
        self.typevars: dict[str, tuple[ast.Call, Module]] = {}  # redefined in the twin module

    def need(self, module: str, name: str, *, type_only: bool = False) -> str:
        """Import ``name`` from ``module`` (unless builtin/local) and return the name to use."""
        if module == "builtins":
            return name
        if (previous := self.names.setdefault(name, (module, name))) != (module, name):
            raise GenError(f"{self.out_module}: {name!r} means {previous} and {(module, name)}")
        if module != self.out_module:  # module_text drops type-only imports also made at run time
            (self.tc_imports if type_only else self.imports).setdefault(module, set()).add(name)
        return name

    def rewrite(self, node: ast.expr, ctx: Module) -> ast.expr:
        """Copy an annotation/default with names resolved, twinned, and imported (strings are
        forward references: a ``Literal`` of strings needs a module-level alias)."""
        writer = self

        class Names(ast.NodeTransformer):
            def visit_Constant(self, n: ast.Constant) -> ast.AST:
                parsed = ix.parse_str(n)  # a forward reference
                return n if parsed is n else self.visit(parsed)

            def visit_Name(self, n: ast.Name) -> ast.AST:
                return ast.Name(writer.name_for(writer.index.resolve(ctx.name, n.id)))

        result = Names().visit(copy.deepcopy(node))
        assert isinstance(result, ast.expr)
        return result

    def name_for(self, canon: Canon) -> str:
        """The name to write for ``canon``: its twin, a local TypeVar, or an import."""
        if canon in self.plan.twins:  # in annotations only, so no import cycles
            return self.need(self.plan.twins[canon], canon[1], type_only=True)
        if tv := self.plan.typevar(canon):
            self.typevars[canon[1]] = tv
            return self.need(self.out_module, canon[1])
        return self.need(*canon)

    def text(self, node: ast.expr, ctx: Module) -> str:
        return ast.unparse(self.rewrite(node, ctx))

    def typevar_lines(self) -> Lines:
        """``T = TypeVar("T", ...)`` for every TypeVar the module uses, with its arguments."""
        lines: Lines = []
        for name, (tv, mod) in sorted(self.typevars.items()):
            if twin := self.plan.mentions_async(tv, mod):
                raise GenError(f"{mod.path}: {name} is bound to {twin}; annotate with Self instead")
            func = self.need(*self.index.canon_of(tv.func, mod) or ("typing", "TypeVar"))
            args = [repr(name), *(self.text(a, mod) for a in tv.args[1:])]
            args += [f"{k.arg}={self.text(k.value, mod)}" for k in tv.keywords]
            lines.append(f"{name} = {func}({', '.join(args)})")
        return lines

    def alias_target(self, node: ast.expr, ctx: Module) -> tuple[ast.expr, Module]:
        """Follow a module-level alias of a ``Callable[...]`` to its definition."""
        canon = self.index.canon_of(node, ctx)
        mod, stmt = (self.index.definition(canon) if canon else None) or (ctx, None)
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Subscript) and self.index.is_abc(value.value, mod, "Callable"):
            return value, mod
        return node, ctx

    def param(self, ann: ast.expr | None, ctx: Module) -> Conversion:
        """How a parameter crosses: unwrapped twin, hook, listener or plain."""
        if ann is None:
            return Conversion("plain", None)
        inner, optional = ix.split_optional(ann)
        if self.plan.is_twin(self.index.canon_of(inner, ctx)):
            return Conversion("unwrap", self.text(ann, ctx), optional)
        if not optional and self.twinned_elements(inner, ctx, "Iterable", "Sequence"):
            return Conversion("unwrap_each", self.text(ann, ctx))  # Iterable[Twin]: each
        named = inner.value if isinstance(inner, ast.Subscript) else inner  # IndexFn[T] too
        if self.plan.usage.uses("PURE", self.index.canon_of(named, ctx)):
            return Conversion("plain", self.text(ann, ctx))
        target, tctx = self.alias_target(inner, ctx)
        kind = "plain"
        if isinstance(target, ast.Subscript) and self.index.is_abc(target.value, tctx, "Callable"):
            args, ret = ix.slice_items(target)
            awaits = isinstance(ret, ast.Subscript) and self.index.is_abc(ret.value, tctx, *AWAITS)
            if awaits and isinstance(ret, ast.Subscript):
                ret_inner = ix.slice_items(ret)[-1]  # Awaitable[R], Coroutine[Any, Any, R]
                elts = [self.rewrite(args, tctx), self.rewrite(ret_inner, tctx)]
                sync = ast.unparse(ast.Subscript(self.rewrite(target.value, tctx), ast.Tuple(elts)))
                return Conversion("hook", sync + (" | None" if optional else ""), optional)
            kind = "listener_nowait" if ix.is_none(ret) else "listener"
        if self.plan.mentions_async(target, tctx):
            raise GenError(f"{ctx.path}: cannot twin a parameter of type {ast.unparse(ann)!r}")
        return Conversion(kind, self.text(ann, ctx), optional)

    def result(self, ann: ast.expr | None, ctx: Module, *, cm: bool = False) -> Conversion:
        """How a result crosses: wrapped twin, blocking iterator/context manager, or plain."""
        if ann is None or ix.is_none(ann):
            return Conversion("plain", None) if ann is None else Conversion("none", "None")
        inner, optional = ix.split_optional(ix.parse_str(ann))
        outer = inner.value if isinstance(inner, ast.Subscript) else inner  # Twin[T] too
        if self.plan.is_twin(self.index.canon_of(outer, ctx)):
            return Conversion("twin", self.text(ann, ctx), optional)
        if not optional and self.twinned_elements(inner, ctx):
            return Conversion("list", self.text(ann, ctx), False, True)  # list[Twin]: each
        if isinstance(inner, ast.Subscript) and not optional:
            head, element = self.index.canon_of(inner.value, ctx), ix.slice_items(inner)[0]
            gen = self.index.is_abc(inner.value, ctx, *ASYNC_ITERS)
            if gen and not cm:
                return self.container("iter", element, ctx)
            # An @asynccontextmanager is written as an async generator of its one value.
            acm = self.index.is_abc(inner.value, ctx, "AsyncContextManager") or head == ACM
            if gen or acm:
                return self.container("cm", element, ctx)
        if bad := self.plan.mentions_async(ann, ctx):
            raise GenError(f"{ctx.path}: cannot twin a result of type {ast.unparse(ann)!r} ({bad})")
        return Conversion("plain", self.text(ann, ctx))

    def container(self, kind: str, element: ast.expr, ctx: Module) -> Conversion:
        module, wrapper = CONTAINERS[kind]
        elem_inner, _ = ix.split_optional(ix.parse_str(element))
        twinned = self.plan.is_twin(self.index.canon_of(elem_inner, ctx))
        if not twinned and self.plan.mentions_async(element, ctx):
            raise GenError(f"{ctx.path}: cannot twin {ast.unparse(element)!r} inside {wrapper}")
        name = self.need(module, wrapper)
        return Conversion(kind, f"{name}[{self.text(element, ctx)}]", False, twinned)

    def twinned_elements(self, node: ast.expr, ctx: Module, *abcs: str) -> bool:
        """Whether ``node`` is ``list[Twin]`` (or one of the collections.abc ``abcs`` of a
        twinned class): its elements cross the facade one by one."""
        if not isinstance(node, ast.Subscript):
            return False
        is_list = isinstance(node.value, ast.Name) and node.value.id == "list"
        if not is_list and not (abcs and self.index.is_abc(node.value, ctx, *abcs)):
            return False
        element, _ = ix.split_optional(ix.slice_items(node)[0])
        outer = element.value if isinstance(element, ast.Subscript) else element
        return self.plan.is_twin(self.index.canon_of(outer, ctx))

    def doc(self, text: str | None, level: int) -> Lines:
        return [IND * level + self.plan.usage.doc(text)] if text else []

    def head(self, name: str, ps: Lines, ret: str | None, fn: Func, ctx: Module, lv: int) -> Lines:
        """``def name(params) -> ret:`` and the docstring of ``fn``, rewritten."""
        return define(name, ps, ret, lv) + self.doc(ix.doc_segment(fn.body, ctx), lv + 1)

    def signature(self, fn: Func, ctx: Module, rt: str) -> tuple[Lines, Lines]:
        """(sync parameter texts, call argument texts) of ``fn``."""
        a = fn.args
        params: list[str] = []
        args: list[str] = []
        positional = a.posonlyargs + a.args
        defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)

        def one(arg: ast.arg, default: ast.expr | None, keyword: bool, star: str = "") -> None:
            conv = self.param(arg.annotation, ctx)
            if star and conv.kind != "plain":
                raise GenError(f"{ctx.path}: {star}{arg.arg} must be plainly typed")
            text = star + arg.arg + (f": {conv.annotation}" if conv.annotation is not None else "")
            params.append(text + (f" = {self.text(default, ctx)}" if default is not None else ""))
            value = arg.arg
            if conv.kind == "unwrap":
                value = f"{arg.arg}._a"
            elif conv.kind == "unwrap_each":
                value = f"[each._a for each in {arg.arg}]"
            elif conv.kind in ("hook", "listener", "listener_nowait"):
                value = f"{rt}.{conv.kind}({arg.arg})"
            if conv.optional and value != arg.arg:
                value = f"None if {arg.arg} is None else {value}"
            args.append(f"{arg.arg}={value}" if keyword else star + value)

        for i, (arg, default) in enumerate(zip(positional, defaults)):
            if i == 0 and arg.arg in ("self", "cls"):
                ann = f": {self.text(arg.annotation, ctx)}" if arg.annotation else ""
                params.append(arg.arg + ann)
            else:
                one(arg, default, False)
            if a.posonlyargs and arg is a.posonlyargs[-1]:
                params.append("/")
        if a.vararg:
            one(a.vararg, None, False, "*")
        params += ["*"] if a.vararg is None and a.kwonlyargs else []
        for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults):
            one(arg, kw_default, True)
        if a.kwarg:
            one(a.kwarg, None, False, "**")
        return params, args

    def runtime_param(self, fn: Func, ctx: Module) -> str | None:
        """The first required parameter typed with a twinned class: its runtime is used."""
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            inner, optional = ix.split_optional(arg.annotation or ast.Constant(None))
            twin = self.plan.is_twin(self.index.canon_of(inner, ctx))
            if arg.arg not in ("self", "cls") and not optional and twin:
                return arg.arg
        return None

    def function_text(self, fn: Func, ctx: Module, target: str = "", lv: int = 0) -> Lines:
        """A function (or static method): forwards on its client's runtime, or starts one."""
        target = target or f"_async.{fn.name}"
        runtime = self.runtime_param(fn, ctx)
        params, args = self.signature(fn, ctx, f"{runtime}._rt" if runtime else "runtime")
        result = self.result(fn.returns, ctx)
        x = suffix(params)
        lines = self.head(fn.name, params, result.annotation, fn, ctx, lv)
        # an async generator (or @asynccontextmanager) is called, not awaited
        is_async = isinstance(fn, ast.AsyncFunctionDef) and result.kind not in ("iter", "cm")
        if runtime is not None:
            func = f"{runtime}._rt.{'call' if is_async else 'call_sync'}"
            lines.append(f"{IND * (lv + 1)}{self.need(TWIN, 'check_twin')}({runtime}, {runtime!r})")
            return lines + self.forward(result, func, [target, *args], runtime, lv + 1, x)
        if result.kind != "twin" or result.optional:  # a new client that owns its runtime
            raise GenError(f"{ctx.path}: {fn.name}() takes no twin, so it must return one")
        self.need("etcd_recipes.sync._runtime.runtime", "Runtime")
        factory = "Runtime.create_awaiting" if is_async else "Runtime.create"
        lines += call(factory, [target, *args], lv + 1, f"runtime{x}, value{x} = ")
        body = [f"result{x}: {result.annotation} = runtime{x}.twin(value{x}, None)"]
        return lines + [IND * (lv + 1) + b for b in [*body, f"return result{x}"]]

    def forward(self, r: Conversion, func: str, args: Lines, owner: str, lv: int, x: str) -> Lines:
        """Body lines calling ``func(*args)``; twinned results are wrapped by ``owner._twin``."""
        if r.kind in ("none", "plain"):
            return call(func, args, lv, "" if r.kind == "none" else "return ")
        wrapped = f"{owner}._twin(value{x})"
        if r.kind == "list":
            wrapped = f"[{owner}._twin(each) for each in value{x}]"
        elif r.kind != "twin":
            helper = self.need(TWIN, "SyncContextManager" if r.kind == "cm" else "SyncIterator")
            convert = f", {owner}._twin" if r.element_twinned else ""
            wrapped = f"{helper}({owner}._rt, value{x}{convert})"
        body = [f"result{x}: {r.annotation} = {wrapped}", f"return result{x}"]
        return call(func, args, lv, f"value{x} = ") + [IND * lv + b for b in body]

    def class_text(self, plan: ClassPlan) -> Lines:
        ctx = plan.ctx
        bases = [self.need(self.plan.twins[c], c[1]) for c in plan.twinned_bases]
        bases = bases or [self.need(TWIN, "SyncTwin")]
        if params := ", ".join(self.text(p, ctx) for p in plan.type_params):
            bases.append(f"{self.need('typing', 'Generic')}[{params}]")
        lines = [f"class {plan.name}({', '.join(bases)}, twin_of=_async.{plan.name}):"]
        lines += self.doc(ix.doc_segment(plan.node.body, ctx), 1)
        lines.append(f"{IND}_a: _async.{plan.name}{f'[{params}]' if params else ''}")
        lines += self.init_text(plan)
        for member in plan.members:
            lines += self.member_text(plan, member)
        return lines

    def init_text(self, plan: ClassPlan) -> Lines:
        """A constructor for classes built on a twinned object (recipes take ``client``)."""
        fn, ctx, overloads = plan.init or (None, plan.ctx, [])
        runtime = self.runtime_param(fn, ctx) if fn else None
        if fn is None or runtime is None:
            return []  # created by factories only (SyncTwin.__init__ explains that)
        params, args = self.signature(fn, ctx, f"{runtime}._rt")
        lines = self.overload_stubs(overloads, "__init__", ctx, False)
        lines += self.head("__init__", params, "None", fn, ctx, 1)
        x = suffix(params)
        lines.append(f"{IND * 2}{self.need(TWIN, 'check_twin')}({runtime}, {runtime!r})")
        lines += call(f"{runtime}._rt.call_sync", [f"_async.{plan.name}", *args], 2, f"value{x} = ")
        return [*lines, f"{IND * 2}self._bind({runtime}._rt, value{x}, {runtime}._owner())"]

    def overload_stubs(self, fns: list[Func], name: str, ctx: Module, cm: bool) -> Lines:
        lines: list[str] = []
        for fn in fns:
            params, _ = self.signature(fn, ctx, "self._rt")
            ret = "None" if name == "__init__" else self.result(fn.returns, ctx, cm=cm).annotation
            lines += [f"{IND}@{self.need('typing', 'overload')}", *define(name, params, ret, 1)]
            lines[-1] += " ..."
        return lines

    def member_text(self, plan: ClassPlan, m: Member) -> Lines:
        ctx, fn = m.ctx, m.node
        if m.kind == "property":
            return self.property_text(m)
        if m.kind == "classattr":
            typed = f": {self.text(m.annotation, ctx)}" if m.annotation is not None else ""
            return [f"{IND}{m.name}{typed} = _async.{plan.name}.{m.name}"]
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        decs = [d for d in ix.decorators(fn) if d not in ("abstractmethod", "abc.abstractmethod")]
        acm = any(d.endswith("asynccontextmanager") for d in decs)
        decs = [d for d in decs if not d.endswith("asynccontextmanager")]
        if decs in (["staticmethod"], ["classmethod"]):
            target = f"_async.{plan.name}.{m.name}"
            return [f"{IND}@{decs[0]}", *self.function_text(fn, ctx, target, 1)]
        if decs:
            raise GenError(f"{ctx.path}: cannot twin {plan.name}.{m.name} decorated with {decs}")
        name = self.plan.usage.rename(m.name)
        params, args = self.signature(fn, ctx, "self._rt")
        if m.name == "__aiter__" and any(n.name == "__anext__" for n in plan.members):
            ret = self.result(fn.returns, ctx).annotation  # an iterator's __aiter__ returns self
            return [*define(name, params, ret, 1), f"{IND * 2}return self"]
        result = self.result(fn.returns, ctx, cm=acm)
        lines = self.overload_stubs(m.overloads, name, ctx, cm=acm)
        lines += self.head(name, params, result.annotation, fn, ctx, 1)
        x, ann = suffix(params), result.annotation
        if m.name == "__aenter__":
            if result.kind not in ("twin", "plain") or ann is None:
                raise GenError(f"cannot twin __aenter__ returning {ann}")
            value = f"self._twin(value{x})" if result.kind == "twin" else f"value{x}"
            enter = f"value{x} = self._rt.enter(self, self._a)"
            body = ["try:", f"    {enter}", "except BaseException:", "    self._release()"]
            body += ["    raise", f"result{x}: {ann} = {value}", f"return result{x}"]
            return lines + [IND * 2 + line for line in body]
        if m.name in ("__aexit__", "aclose"):
            done = f"self._rt.exit({', '.join(['self', *args])})"
            if m.name == "aclose":
                done = f"self._rt.call_closing({', '.join(['self._a.aclose', *args])})"
            body = [f"result{x}: {ann} = {done}", f"return result{x}"]
            body = [done] if result.kind == "none" else body
            body = ["try:", *(f"    {b}" for b in body), "finally:", "    self._release()"]
            return lines + [IND * 2 + line for line in body]
        if m.name == "__anext__":
            anext = ["self._a.__anext__"]
            return lines + self.forward(result, "self._rt.next", anext, "self", 2, "")
        # an async generator (or @asynccontextmanager) is called, not awaited (a coroutine
        # returning an async iterator would be wrapped unawaited: mypy rejects the twin)
        is_async = isinstance(fn, ast.AsyncFunctionDef) and result.kind not in ("iter", "cm")
        method = "self._rt.call" if is_async else "self._rt.call_sync"
        target = f"self._a.{m.name}"
        if self.plan.usage.uses("DIRECT", (plan.ctx.name, plan.name, m.name)):
            # mypy --strict checks that the async class has it, with these arguments
            method, target = "self._rt.direct", f"self._a._unary_{m.name}"
        return lines + self.forward(result, method, [target, *args], "self", 2, x)

    def property_text(self, m: Member) -> Lines:
        result = self.result(m.annotation, m.ctx)
        lines = ["@property", *define(m.name, ["self"], result.annotation, 0)]
        lines = [IND + line for line in lines] + self.doc(m.doc, 2)
        read = f"lambda: self._a.{m.name}"
        return lines + self.forward(result, "self._rt.call_sync", [read], "self", 2, "")


def module_text(plan: Plan, mod: Module, names: list[str]) -> str:
    """The text of the twin of ``mod`` defining ``names`` (unformatted)."""
    w = Writer(plan, mod)
    body: list[str] = []
    for name in names:
        node = mod.defs[name]
        body += ["", ""]
        if isinstance(node, ast.ClassDef):
            body += w.class_text(plan.plan(mod, node))
        else:
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            body += w.function_text(node, mod)
    typevars = w.typevar_lines()
    tc = {m: rest for m, n in w.tc_imports.items() if (rest := n - w.imports.get(m, set()))}
    if tc:
        w.need("typing", "TYPE_CHECKING")
    package, _, leaf = mod.name.rpartition(".")
    doc = f'"""Blocking twin of :mod:`{mod.name}` (see :mod:`etcd_recipes.sync`)."""'
    head = [HEADER.format(source=mod.path), doc, "from __future__ import annotations"]
    head += [f"from {package} import {leaf} as _async", *imports(w.imports, 0)]
    head += ["", "if TYPE_CHECKING:", *imports(tc, 1)] if tc else []
    return "\n".join([*head, "", f"__all__ = {sorted(names)!r}", "", *typevars, *body]) + "\n"


def package_text(plan: Plan) -> str:
    """The text of ``etcd_recipes/sync/__init__.py`` (unformatted)."""
    where = {**plan.twins, **{c: out_name(c[0]) for c in plan.functions}}
    pairs = [(where.get(c, c[0]), n) for n, c in plan.exports.items()]
    exports: dict[str, set[str]] = {}
    for module, name in [*pairs, *SYNC_ONLY]:
        exports.setdefault(module, set()).add(name)
    every = sorted({n for _, n in [*pairs, *SYNC_ONLY]})
    head = [HEADER.format(source="etcd_recipes/__init__.py"), PACKAGE_DOC]
    return "\n".join([*head, *imports(exports, 0), f"__all__ = {every!r}", PACKAGE_TAIL]) + "\n"


def imports(names: dict[str, set[str]], level: int) -> Lines:
    """``from m import a, b`` lines (ruff's isort rule orders and groups them afterwards)."""
    return [f"{IND * level}from {m} import {', '.join(sorted(names[m]))}" for m in sorted(names)]
