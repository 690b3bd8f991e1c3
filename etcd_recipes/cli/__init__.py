"""The ``etcd-recipes`` command (extra ``cli``: typer and rich): a development etcd and an
operator's view of the recipes.

``etcd-recipes dev`` runs a local etcd; ``status``, ``lock``, ``semaphore``, ``election``,
``counter``, ``barrier``, ``queue``, ``dlq``, ``cache``, ``discovery`` and ``watch`` read (and,
with ``--yes``, change) what the recipes keep in etcd, through the recipes' own API. Every
command takes ``-o table|json`` (JSON documents carry ``"schema": "etcd-recipes/cli/v1"``) and
the client options, also from etcdctl's environment variables.
Exit codes: 0 ok, 1 error, 2 usage, 3 nothing there (no recipe of that kind at the path,
nothing under the prefix, no such id), 4 refused (no ``--yes``, a path holding another
recipe's keys, or a lock not acquired in time), 130 Ctrl-C; every failure is one line on
stderr.
"""

from . import _commands as _commands  # registers the command groups
from . import _dev as _dev  # registers dev
from . import _dlq as _dlq  # registers dlq ls, requeue, purge
from . import _election as _election  # registers election show, observe
from . import _groups as _groups  # registers group ls, group partitions
from . import _locks as _locks  # registers lock show, ls, run, break
from . import _queues as _queues  # registers queue, dlq show
from . import _recipes as _recipes  # registers election resign, discovery, cache
from . import _revoke as _revoke  # registers lock revoke (after _commands: the lock group)
from . import _semaphore as _semaphore  # registers semaphore show, release
from . import _shared as _shared  # registers shared get
from . import _status as _status  # registers status
from . import _values as _values  # registers counter, barrier
from . import _watch as _watch  # registers watch
from ._app import Exit, app

__all__ = ["Exit", "app", "main"]


def main() -> None:
    """The console script's entry point (also ``python -m etcd_recipes.cli``, which names
    itself ``etcd-recipes`` in usage lines too)."""
    app(prog_name="etcd-recipes")
