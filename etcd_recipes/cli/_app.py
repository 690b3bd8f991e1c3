"""The command's skeleton: the typer app, the client options, output and exit codes.

Guaranteed: the client options are resolved by the library's own code
(:func:`etcd_recipes.client.settings.resolve_settings`, what :func:`~etcd_recipes.connect` runs),
so the command and the library read the same variables in the same order
(``$ETCD_ENDPOINTS``, then ``$ETCDCTL_ENDPOINTS``; the TLS and user variables only when the
endpoints come from the environment). Every failure, a bad command line included, is one line
on stderr (``etcd-recipes: error: ...``) and an :class:`Exit` code, never a traceback or a panel.
The library's own log records are not printed unless ``$ETCD_RECIPES_CLI_LOG`` names a level.

Not guaranteed: ``--help`` pages keep typer's layout (they are for people, not scripts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from .. import EtcdClient, connect
from ..client.settings import ENDPOINT_VARIABLES, resolve_settings
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
    """Bad command line (unknown option, missing argument, invalid value, a relative path)."""
    NOT_FOUND = 3
    """The path holds nothing of the asked kind (no lock, no dead letter with that id...)."""
    REFUSED = 4
    """A destructive command without ``--yes``, a path holding another recipe's keys, or a
    precondition that did not hold."""


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

    def connect(self, endpoints: str | None = None) -> EtcdClient:
        """A client configured as the library's ``connect()`` would be from these options and
        the environment; ``endpoints`` replaces the resolved endpoints only (``status`` reads
        each member through its own URL with the same TLS and credentials)."""
        got = resolve_settings(
            self.endpoints,
            ca_cert=self.ca_cert,
            cert=self.cert,
            key=self.key,
            user=self.user,
            password=self.password,
        )
        return connect(
            endpoints or got.endpoints,
            ca_cert=got.ca_cert,
            cert=got.cert,
            key=got.key,
            user=got.user,
            password=got.password,
            namespace=self.namespace,
        )


class CommandError(Exception):
    """A one-line failure with its exit code; printed without a traceback."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(message)
        self.code = code


# typer >= 0.2x vendors click (``typer._click``), older versions use click itself: take the
# exception classes from typer's public ``BadParameter`` rather than importing either module.
_USAGE_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)
_CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


class _OneLineErrors(TyperGroup):
    """The root group: a bad command line is one line on stderr and exit code 2 (typer would
    print a boxed usage panel); the library's log records stay quiet unless asked for."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _quiet_library_logs()
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except CommandError as exc:  # raised before connecting (a path without "/"...)
            _one_line(str(exc))
            sys.exit(int(exc.code))
        except _USAGE_ERROR as exc:
            ctx: Any = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                sys.stderr.write(ctx.get_help() + "\n")  # no command at all: the help page
            else:
                where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                _one_line(f"{exc.format_message()}{where}")  # type: ignore[attr-defined]
            sys.exit(int(Exit.USAGE))
        except _CLICK_ERROR as exc:
            _one_line(exc.format_message())  # type: ignore[attr-defined]
            sys.exit(int(getattr(exc, "exit_code", Exit.ERROR)))
        except typer.Abort:
            _one_line("aborted")
            sys.exit(int(Exit.ERROR))
        sys.exit(code if isinstance(code, int) else 0)


def _quiet_library_logs() -> None:
    """No library log record on stderr (the command reports what it found itself), unless
    ``$ETCD_RECIPES_CLI_LOG`` is a level name (``debug``, ``info``, ``warning``)."""
    logger = logging.getLogger("etcd_recipes")
    level = os.environ.get("ETCD_RECIPES_CLI_LOG", "").strip().upper()
    # The library's own NullHandler keeps its records off stderr; a configured handler is kept.
    if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
        return
    if level in ("DEBUG", "INFO", "WARNING", "ERROR"):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.setLevel(level)
        logger.addHandler(handler)


def _one_line(message: str) -> None:
    _err.print(f"etcd-recipes: error: {' '.join(message.split())}", markup=False, soft_wrap=True)


app = typer.Typer(
    name="etcd-recipes",
    help="A development etcd and an operator's view of every etcd-recipes recipe.",
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def command_group(name: str) -> typer.Typer:
    """The sub-command group registered as ``name`` (``"lock"``), for a module that adds a
    command to a group another module defines (``_revoke`` adds ``lock revoke``)."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    raise LookupError(f"no command group {name!r} is registered (yet)")


_err = Console(stderr=True, highlight=False)


@app.callback()
def _options(
    ctx: typer.Context,
    endpoints: str | None = typer.Option(
        None,
        "--endpoints",
        help="Comma-separated endpoints (host:port or URLs); else "
        + ", then ".join(f"${name}" for name in ENDPOINT_VARIABLES)
        + " (and then the TLS and user variables are read too, as the library does).",
    ),
    cacert: str | None = typer.Option(
        None, "--cacert", help="CA bundle; else $ETCDCTL_CACERT (endpoints from the environment)."
    ),
    cert: str | None = typer.Option(
        None, "--cert", help="Client certificate; else $ETCDCTL_CERT (likewise)."
    ),
    key: str | None = typer.Option(None, "--key", help="Client key; else $ETCDCTL_KEY (likewise)."),
    user: str | None = typer.Option(
        None,
        "--user",
        help="user or user:password; else $ETCDCTL_USER, with $ETCDCTL_PASSWORD (likewise).",
    ),
    password: str | None = typer.Option(None, "--password", help="The --user's password."),
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
    _one_line(message)
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
