"""Producing the files: generation, formatting with ruff, the freshness check, the CLI."""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .emit import module_text, package_text
from .plan import GenError, Plan
from .rules import HEADER, MARKER, OUTPUT, PACKAGE, Usage


def generate(source_root: Path) -> dict[str, str]:
    """Every generated file (path relative to the output directory) and its formatted text."""
    usage = Usage()
    plan = Plan(source_root, usage)
    files: dict[str, str] = {}
    for module, names in plan.modules().items():
        mod = plan.index.module(module)
        assert mod is not None
        rel = module.removeprefix(PACKAGE + ".").replace(".", "/")
        rel += "/__init__.py" if mod.path.endswith("__init__.py") else ".py"
        files[rel] = module_text(plan, mod, names)
    for path in list(files):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            init, package = "/".join(parts[:i]) + "/__init__.py", ".".join([PACKAGE, *parts[:i]])
            doc = f'"""Blocking twins of :mod:`{package}` (see :mod:`etcd_recipes.sync`)."""'
            files.setdefault(init, f"{HEADER.format(source=f'{PACKAGE}/{init}')}\n{doc}\n")
    files["__init__.py"] = package_text(plan)
    if unused := usage.unused():
        raise GenError(
            "unused rules (delete them from tools/gen_sync/rules.py): " + "; ".join(unused)
        )
    return ruff(dict(sorted(files.items())))


def ruff(files: dict[str, str]) -> dict[str, str]:
    """``files`` with imports sorted (ruff's isort rule) and formatted (``ruff format``)."""
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    command = [found] if found else [sys.executable, "-m", "ruff"]
    settings = ["--quiet", "--isolated", "--line-length", "100", "--target-version", "py310"]
    first_party = ["--config", f'lint.isort.known-first-party = ["{PACKAGE}"]']
    with tempfile.TemporaryDirectory(prefix="gen_sync-") as tmp:
        base = Path(tmp) / OUTPUT
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text, encoding="utf-8")
        for args in (["check", "--select", "I", "--fix", *first_party], ["format"]):
            run = subprocess.run(
                [*command, *args, *settings, str(base)], capture_output=True, text=True
            )
            if run.returncode:
                raise GenError(f"ruff {args[0]} failed on the output:\n{run.stdout}{run.stderr}")
        return {rel: (base / rel).read_text(encoding="utf-8") for rel in files}


def _compare(source_root: Path, output: Path | None) -> tuple[Path, dict[str, str], list[str]]:
    """(output directory, expected files, generated files on disk that no input produces)."""
    output = output or source_root / OUTPUT
    expected = generate(source_root)
    on_disk = [
        f.relative_to(output).as_posix() for f in sorted(output.rglob("*.py")) if output.is_dir()
    ]
    on_disk = [
        rel for rel in on_disk if (output / rel).read_text(encoding="utf-8").startswith(MARKER)
    ]
    return output, expected, [rel for rel in on_disk if rel not in expected]


def check(source_root: Path, output: Path | None = None) -> list[str]:
    """Problems (with unified diffs) between the committed output and a fresh generation."""
    output, expected, orphans = _compare(source_root, output)
    problems: list[str] = []
    for rel, text in expected.items():
        if not (file := output / rel).is_file():
            problems.append(f"missing generated file: {file}")
        elif (current := file.read_text(encoding="utf-8")) != text:
            old, new = current.splitlines(keepends=True), text.splitlines(keepends=True)
            diff = difflib.unified_diff(old, new, f"{file} (committed)", f"{file} (generated)")
            problems.append(f"stale generated file: {file}\n{''.join(diff)}")
    return problems + [
        f"generated file no input produces (delete it): {output / r}" for r in orphans
    ]


def write(source_root: Path, output: Path | None = None) -> list[Path]:
    """(Re)write the output; remove generated files no input produces. Returns changed files."""
    output, expected, orphans = _compare(source_root, output)
    changed: list[Path] = []
    for rel, text in expected.items():
        if not (file := output / rel).is_file() or file.read_text(encoding="utf-8") != text:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text, encoding="utf-8")
            changed.append(file)
    for rel in orphans:
        (output / rel).unlink()
        changed.append(output / rel)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (1: stale output, 2: an error)."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.gen_sync",
        description="Generate the blocking facade etcd_recipes/sync/ from the async source.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    parser.add_argument(
        "--source-root",
        type=Path,
        default=Path(__file__).resolve().parents[2],
        help="the directory that contains the etcd_recipes package (default: the repository)",
    )
    parser.add_argument("--output", type=Path, help=f"default: <source-root>/{OUTPUT}")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            for path in write(args.source_root, args.output):
                print(f"wrote {path}")
            return 0
        problems = check(args.source_root, args.output)
    except GenError as exc:
        print(f"gen_sync: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("etcd_recipes/sync is out of date: run make gen-sync", file=sys.stderr)
    return 1 if problems else 0
