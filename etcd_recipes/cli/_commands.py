"""The command groups (``lock``, ``election``, ``counter``, ``barrier``, ``dlq``) and the
argument rules every command shares; the commands themselves live in one module per group
(``_locks``, ``_election``, ``_values``, ``_dlq``, ``_watch``, ``_queues``, ``_recipes``).

Guaranteed: a PATH argument starts with ``/`` and loses a trailing ``/`` (a recipe's path); a
PREFIX argument starts with ``/`` and is used exactly as given: ``/demo/config/`` is the keys
under that directory only, ``/demo/config`` also ``/demo/configuration`` (etcdctl's
``--prefix``).
"""

from __future__ import annotations

import typer

from ._app import CommandError, Exit, app

lock_app = typer.Typer(help="Mutexes (also etcdctl lock and Go's concurrency.Mutex).")
election_app = typer.Typer(help="Leader elections.")
counter_app = typer.Typer(help="Atomic counters (DistributedAtomicLong).")
barrier_app = typer.Typer(help="Gate barriers (DistributedBarrier).")
dlq_app = typer.Typer(help="A work queue's dead letters.")
app.add_typer(lock_app, name="lock")
app.add_typer(election_app, name="election")
app.add_typer(counter_app, name="counter")
app.add_typer(barrier_app, name="barrier")
app.add_typer(dlq_app, name="dlq")

PATH = typer.Argument(..., metavar="PATH", help="The recipe's path (starts with /).")
"""A command's PATH argument (usage lines show ``PATH``)."""
PREFIX = typer.Argument(
    ...,
    metavar="PREFIX",
    help="A key prefix, used as given: a trailing / keeps only the keys under that directory.",
)
"""A command's PREFIX argument."""


def _path(path: str) -> str:
    if not path.startswith("/"):
        raise CommandError(f"a recipe path starts with '/', got {path!r}", Exit.USAGE)
    return path.rstrip("/") or "/"


def _prefix(prefix: str) -> str:
    """A PREFIX argument exactly as given (a trailing ``/`` is kept: exactly that prefix)."""
    if not prefix.startswith("/"):
        raise CommandError(f"a prefix starts with '/', got {prefix!r}", Exit.USAGE)
    return prefix
