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

from .emit import Emitter
from .index import GenError
from .plan import Plan, out_path
from .rules import HEADER, MARKER, OUTPUT, PACKAGE, Usage


def generate(source_root: Path) -> dict[str, str]:
    """Every generated file (path relative to the output directory) and its formatted text."""
    usage = Usage()
    plan = Plan(source_root, usage)
    emitter = Emitter(plan)
    files: dict[str, str] = {}
    for module, names in plan.modules().items():
        mod = plan.index.module(module)
        assert mod is not None
        files[out_path(module, mod.path.endswith("__init__.py"))] = emitter.module_text(mod, names)
    for path in list(files):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            init = "/".join(parts[:i]) + "/__init__.py"
            package = ".".join([PACKAGE, *parts[:i]])
            doc = f'"""Blocking twins of :mod:`{package}` (see :mod:`etcd_recipes.sync`)."""'
            files.setdefault(init, f"{HEADER.format(source=f'{PACKAGE}/{init}')}\n{doc}\n")
    files["__init__.py"] = emitter.package_text()
    unused = usage.unused()
    if unused:
        raise GenError(
            "unused rules (delete them from tools/gen_sync/rules.py): " + "; ".join(unused)
        )
    return ruff(dict(sorted(files.items())))


def _ruff_command() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ruff")
    return [found] if found else [sys.executable, "-m", "ruff"]


def ruff(files: dict[str, str]) -> dict[str, str]:
    """``files`` with imports sorted (ruff's isort rule) and formatted (``ruff format``)."""
    settings = ["--isolated", "--line-length", "100", "--target-version", "py310"]
    first_party = ["--config", f'lint.isort.known-first-party = ["{PACKAGE}"]']
    with tempfile.TemporaryDirectory(prefix="gen_sync-") as tmp:
        base = Path(tmp) / OUTPUT
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text, encoding="utf-8")
        for args in (["check", "--select", "I", "--fix", *first_party], ["format"]):
            run = subprocess.run(
                [*_ruff_command(), *args, "--quiet", *settings, str(base)],
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode:
                raise GenError(f"ruff {args[0]} failed on the output:\n{run.stdout}{run.stderr}")
        return {rel: (base / rel).read_text(encoding="utf-8") for rel in files}


def _generated_on_disk(output: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for file in sorted(output.rglob("*.py")) if output.is_dir() else ():
        text = file.read_text(encoding="utf-8")
        if text.startswith(MARKER):
            found[file.relative_to(output).as_posix()] = text
    return found


def check(source_root: Path, output: Path | None = None) -> list[str]:
    """Problems (with unified diffs) between the committed output and a fresh generation."""
    output = output or source_root / OUTPUT
    expected = generate(source_root)
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
    for rel in sorted(set(_generated_on_disk(output)) - set(expected)):
        problems.append(f"generated file no input produces (delete it): {output / rel}")
    return problems


def write(source_root: Path, output: Path | None = None) -> list[Path]:
    """(Re)write the output; remove generated files no input produces. Returns changed files."""
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
        if args.check:
            problems = check(args.source_root, args.output)
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("etcd_recipes/sync is out of date: run make gen-sync", file=sys.stderr)
                return 1
            return 0
        for path in write(args.source_root, args.output):
            print(f"wrote {path}")
    except GenError as exc:
        print(f"gen_sync: {exc}", file=sys.stderr)
        return 2
    return 0
