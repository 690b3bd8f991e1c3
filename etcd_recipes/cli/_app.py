"""The command's skeleton: the typer app, the client options, output and exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from .. import EtcdClient, connect
from ..errors import (
    EtcdConnectionError,
    EtcdRecipeError,
    InvalidArgumentError,
    RetriesExhaustedError,
)

T = TypeVar("T")

SCHEMA = "etcd-recipes/cli/v1"
"""The ``schema`` field of every ``-o json`` document; it changes only with a breaking change."""


class Exit(IntEnum):
    """The command's exit codes (documented on the operations page)."""

    OK = 0
    ERROR = 1
    """etcd answered with an error, could not be reached, or the operation failed."""
    USAGE = 2
    """Bad command line (unknown option, missing argument, invalid value)."""
    NOT_FOUND = 3
    """The path holds nothing of the asked kind (no lock, no dead letter with that id...)."""
    REFUSED = 4
    """A destructive command without ``--yes``, or a precondition that did not hold."""


class Output(str, Enum):
    table = "table"
    json = "json"


@dataclass
class Context:
    """What every command gets: how to connect and how to print."""

    endpoints: str | None
    ca_cert: str | None
    cert: str | None
    key: str | None
    user: str | None
    password: str | None
    namespace: str | None
    output: Output

    def connect(self) -> EtcdClient:
        return connect(
            self.endpoints,
            ca_cert=self.ca_cert,
            cert=self.cert,
            key=self.key,
            user=self.user,
            password=self.password,
            namespace=self.namespace,
        )


class CommandError(Exception):
    """A one-line failure with its exit code; printed without a traceback."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code


app = typer.Typer(
    name="etcd-recipes",
    help="A development etcd and an operator's view of every etcd-recipes recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_err = Console(stderr=True, highlight=False)


@app.callback()
def _options(
    ctx: typer.Context,
    endpoints: str | None = typer.Option(
        None,
        "--endpoints",
        envvar=["ETCDCTL_ENDPOINTS", "ETCD_ENDPOINTS"],
        help="Comma-separated endpoints (host:port or URLs).",
    ),
    cacert: str | None = typer.Option(None, "--cacert", envvar="ETCDCTL_CACERT"),
    cert: str | None = typer.Option(None, "--cert", envvar="ETCDCTL_CERT"),
    key: str | None = typer.Option(None, "--key", envvar="ETCDCTL_KEY"),
    user: str | None = typer.Option(
        None, "--user", envvar="ETCDCTL_USER", help="user or user:password"
    ),
    password: str | None = typer.Option(None, "--password", envvar="ETCDCTL_PASSWORD"),
    namespace: str | None = typer.Option(None, "--namespace", envvar="ETCD_RECIPES_NAMESPACE"),
    output: Output = typer.Option(Output.table, "-o", "--output", help="table or json"),
) -> None:
    if user and ":" in user and password is None:
        user, password = user.split(":", 1)
    ctx.obj = Context(endpoints, cacert, cert, key, user, password, namespace, output)


def run(ctx: typer.Context, work: Callable[[EtcdClient], Awaitable[T]]) -> T:
    """Connect, run ``work(client)``, close; map failures to one line and an exit code."""
    options: Context = ctx.obj

    async def main() -> T:
        async with options.connect() as client:
            return await work(client)

    return guarded(lambda: asyncio.run(main()))


def guarded(fn: Callable[[], T]) -> T:  # type: ignore[return]  # every except raises
    try:
        return fn()
    except CommandError as exc:
        fail(str(exc), exc.code)
    except InvalidArgumentError as exc:
        fail(str(exc), Exit.USAGE)
    except (EtcdConnectionError, RetriesExhaustedError) as exc:
        fail(f"cannot reach etcd: {exc}", Exit.ERROR)
    except EtcdRecipeError as exc:
        fail(str(exc), Exit.ERROR)
    except KeyboardInterrupt:
        fail("interrupted", Exit.ERROR)
    except Exception as exc:
        if os.environ.get("ETCD_RECIPES_CLI_TRACEBACK"):
            raise
        fail(f"{type(exc).__name__}: {exc} (ETCD_RECIPES_CLI_TRACEBACK=1 shows where)", Exit.ERROR)


def fail(message: str, code: Exit) -> Any:
    _err.print(f"etcd-recipes: error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(int(code))


def confirm(yes: bool, what: str) -> None:
    if not yes:
        raise CommandError(f"{what}: refusing without --yes", Exit.REFUSED)


def emit(
    ctx: typer.Context,
    command: str,
    data: dict[str, Any],
    *,
    columns: Sequence[str] = (),
    rows: Sequence[Sequence[Any]] = (),
    lines: Sequence[str] = (),
) -> None:
    """Print ``data`` as one JSON document, or ``lines`` then a table of ``rows``."""
    options: Context = ctx.obj
    if options.output is Output.json:
        doc = {"schema": SCHEMA, "command": command, "data": data}
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
        return
    console = Console(highlight=False, soft_wrap=True)
    for line in lines:
        console.print(line, markup=False)
    if columns:
        table = Table(*columns, box=None, pad_edge=False, header_style="bold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        console.print(table)
