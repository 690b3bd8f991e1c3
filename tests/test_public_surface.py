"""One public surface: the async package's import statements are the export list, the blocking
facade exports the same names (plus its documented sync-only helpers), and every public object
reports the package a user imports it from."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import etcd_recipes
import etcd_recipes.sync

INIT = Path(etcd_recipes.__file__)
SYNC_ONLY = {"fail_after"}  # the blocking facade's own helpers, documented in its docstring


def _imported_names() -> list[str]:
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names += [alias.asname or alias.name for alias in node.names]
    return names


def test_all_is_exactly_the_imported_names() -> None:
    imported = _imported_names()
    assert len(imported) == len(set(imported)), "a name is imported twice"
    assert sorted(etcd_recipes.__all__) == sorted(imported)
    assert len(etcd_recipes.__all__) == len(set(etcd_recipes.__all__))


def test_no_star_imports_in_the_export_list() -> None:
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    stars = [
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
    ]
    assert stars == []


def test_sync_exports_equal_async_exports() -> None:
    assert set(etcd_recipes.sync.__all__) - SYNC_ONLY == set(etcd_recipes.__all__)
    assert set(etcd_recipes.sync.__all__) >= SYNC_ONLY
    for name in etcd_recipes.sync.__all__:
        assert hasattr(etcd_recipes.sync, name), name


def test_every_exported_name_resolves() -> None:
    for name in etcd_recipes.__all__:
        assert getattr(etcd_recipes, name) is not None, name


def test_public_objects_report_the_public_module() -> None:
    wrong = {}
    for name in etcd_recipes.__all__:
        value = getattr(etcd_recipes, name)
        if (inspect.isclass(value) or inspect.isfunction(value)) and (
            value.__module__ != "etcd_recipes"
        ):
            wrong[name] = value.__module__
    assert wrong == {}


def test_sync_twins_report_the_sync_module() -> None:
    wrong = {}
    for name in etcd_recipes.sync.__all__:
        value = getattr(etcd_recipes.sync, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if value is getattr(etcd_recipes, name, None):
            continue  # a shared value type: the async package's own class
        if value.__module__ != "etcd_recipes.sync":
            wrong[name] = value.__module__
    assert wrong == {}
