"""The command line: ``python -m tools.gen_sync [--check] [--source-root DIR] [--output DIR]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .index import GenError
from .output import check, write
from .rules import OUTPUT


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
