"""Every ``Example::`` block in a docstring under ``etcd_recipes/`` runs here, against real etcd.

The convention a docstring example follows (so that it is short and still true):

* it may use three names it does not define: ``endpoints`` (the ``host:port`` of a running
  etcd, also in ``ETCD_ENDPOINTS`` while the block runs, so ``connect()`` reaches it), ``prefix`` (a key prefix no other example uses, e.g. ``/doc/lock-py-120``) and, in a
  block that uses ``await``, ``client`` (an :class:`~etcd_recipes.EtcdClient` connected to
  ``endpoints``); everything else it defines itself;
* a block in the async package may ``await`` at top level (it runs inside a coroutine on a
  fresh event loop); a block without ``await`` runs in a plain thread with no event loop, so
  it may call ``asyncio.run(...)`` itself;
* a block in ``etcd_recipes/sync/`` (generated from the async docstrings) runs in a plain
  thread, and ``client`` is a blocking :class:`etcd_recipes.sync.EtcdClient`;
* it finishes within :data:`TIMEOUT` seconds and raises nothing.

The block is the indented text after a line ending in ``Example::`` (reStructuredText's
literal block), up to the first line indented less than its first line.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import os
import re
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "etcd_recipes"
TIMEOUT = 30.0
MARK = re.compile(r"(^|\s)Examples?::\s*$")


@dataclass(frozen=True)
class DocExample:
    path: str  # relative to the repository root
    line: int  # line of the docstring in the file
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def is_sync(self) -> bool:
        return self.path.startswith("etcd_recipes/sync/")


def _blocks(doc: str) -> Iterator[str]:
    lines = doc.expandtabs().splitlines()
    i = 0
    while i < len(lines):
        if not MARK.search(lines[i]):
            i += 1
            continue
        base = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i == len(lines):
            return
        indent = len(lines[i]) - len(lines[i].lstrip())
        if indent <= base:
            continue
        body: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) >= indent
        ):
            body.append(lines[i][indent:])
            i += 1
        yield "\n".join(body).strip("\n") + "\n"


def collect() -> list[DocExample]:
    """Every example block of every docstring (module, class, function, attribute) in the
    package."""
    found: list[DocExample] = []
    root = PACKAGE.parent
    for file in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        nodes: list[Any] = [tree]
        nodes += [
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        docs: list[tuple[int, str]] = []
        for node in nodes:
            doc = ast.get_docstring(node, clean=True)
            if doc:
                docs.append((node.body[0].lineno if node.body else 1, doc))
            docs += _attribute_docs(node)
        for line, doc in docs:
            for code in _blocks(doc):
                found.append(DocExample(str(file.relative_to(root)), line, code))
    return found


def _attribute_docs(node: Any) -> Iterator[tuple[int, str]]:
    """The docstrings of a module's or class's attributes: a string right after an assignment
    (the convention Sphinx and the API pages read)."""
    body = getattr(node, "body", [])
    for before, stmt in itertools.pairwise(body):
        if (
            isinstance(before, (ast.Assign, ast.AnnAssign))
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            yield stmt.lineno, inspect.cleandoc(stmt.value.value)


EXAMPLES = collect()


def _compile(example: DocExample) -> types.CodeType:
    return compile(
        example.code,
        f"<{example.id}>",
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )


def _prefix(example: DocExample) -> str:
    return "/doc/" + re.sub(r"[^A-Za-z0-9]+", "-", example.id.removeprefix("etcd_recipes/"))


def _run_in_thread(target: Any) -> None:
    """Run ``target()`` in a fresh thread (no event loop there), re-raising its error."""
    errors: list[BaseException] = []

    def main() -> None:
        try:
            target()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=main, name="doc-example", daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    if thread.is_alive():
        pytest.fail(f"the example did not finish within {TIMEOUT} s")
    if errors:
        raise errors[0]


def run_example(example: DocExample, endpoints: str) -> None:
    saved = os.environ.get("ETCD_ENDPOINTS")
    os.environ["ETCD_ENDPOINTS"] = endpoints
    try:
        _run_example(example, endpoints)
    finally:
        if saved is None:
            os.environ.pop("ETCD_ENDPOINTS", None)
        else:
            os.environ["ETCD_ENDPOINTS"] = saved


def _run_example(example: DocExample, endpoints: str) -> None:
    code = _compile(example)
    ns: dict[str, Any] = {
        "__name__": "__doc_example__",
        "endpoints": endpoints,
        "prefix": _prefix(example),
    }
    if example.is_sync:
        from etcd_recipes.sync import connect as sync_connect

        def blocking() -> None:
            with sync_connect(endpoints) as client:
                ns["client"] = client
                exec(code, ns)

        _run_in_thread(blocking)
        return
    if not code.co_flags & inspect.CO_COROUTINE:
        _run_in_thread(lambda: exec(code, ns))
        return

    async def main() -> None:
        from etcd_recipes import connect

        async with connect(endpoints) as client:
            ns["client"] = client
            result = eval(code, ns)
            if asyncio.iscoroutine(result):
                await result

    _run_in_thread(lambda: asyncio.run(main()))


def test_examples_are_found() -> None:
    # A collector that silently finds nothing would make every other test here vacuous.
    assert len(EXAMPLES) > 100
    assert any(e.is_sync for e in EXAMPLES)
    assert any(e.path == "etcd_recipes/__init__.py" for e in EXAMPLES)


def test_block_extraction() -> None:
    doc = "Title.\n\nExample::\n\n    a = 1\n\n    b = 2\nafter\n"
    assert list(_blocks(doc)) == ["a = 1\n\nb = 2\n"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_docstring_example(example: DocExample, etcd_server: Any) -> None:
    run_example(example, etcd_server.endpoint)
