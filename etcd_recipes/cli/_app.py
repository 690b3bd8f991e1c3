"""The command's skeleton: the typer app, the client options, output and exit codes.

Guaranteed: the client options are resolved by the library's own code
(:func:`etcd_recipes.client.settings.resolve_settings`, what :func:`~etcd_recipes.connect` runs),
so the command and the library read the same variables in the same order
(``$ETCD_ENDPOINTS``, then ``$ETCDCTL_ENDPOINTS``; the TLS and user variables only when the
endpoints come from the environment). Every failure, a bad command line included, is one line
on stderr (``etcd-recipes: error: ...``) and an :class:`Exit` code, never a traceback or a panel.
The library's own log records are not printed unless ``$ETCD_RECIPES_CLI_LOG`` names a level.
The client options work before and after the command's name (the one after it wins); Ctrl-C
exits 130 with nothing printed.

Not guaranteed: ``--help`` pages keep click's plain layout (they are for people, not scripts);
the global options are not listed on a command's own help page, only on the top-level one.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import os
import re
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
    TlsHandshakeError,
)
from ._reach import all_refuse

T = TypeVar("T")

DIAL_TIMEOUT = 2.0
"""The CLI's ``--dial-timeout`` default, seconds: a silent endpoint fails within it (the
library's ``connect_timeout`` default, 5 s, suits a long-lived service, not a command); one
that refuses connections fails at once (``_reach``)."""

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
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT), the documented end of ``watch`` and ``election observe``:
    nothing is printed (the shell's convention, 128 + SIGINT)."""


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
    dial_timeout: float = DIAL_TIMEOUT

    def connect(self, endpoints: str | None = None) -> EtcdClient:
        """A client configured as the library's ``connect()`` would be from these options and
        the environment; ``endpoints`` replaces the resolved endpoints only (``status`` reads
        each member through its own URL with the same TLS and credentials)."""
        user, password = self.user, self.password
        if user and ":" in user and password is None:
            user, password = user.split(":", 1)
        got = resolve_settings(
            self.endpoints,
            ca_cert=self.ca_cert,
            cert=self.cert,
            key=self.key,
            user=user,
            password=password,
        )
        return connect(
            endpoints or got.endpoints,
            ca_cert=got.ca_cert,
            cert=got.cert,
            key=got.key,
            user=got.user,
            password=got.password,
            namespace=self.namespace,
            connect_timeout=self.dial_timeout,
        )

    def endpoints_tried(self) -> str:
        """The endpoints a failed connection tried, as given (for a one-line error)."""
        try:
            got = resolve_settings(
                self.endpoints, ca_cert=None, cert=None, key=None, user=None, password=None
            )
        except EtcdRecipeError:
            return self.endpoints or "?"
        return got.endpoints if isinstance(got.endpoints, str) else ",".join(got.endpoints)


class CommandError(Exception):
    """A one-line failure with its exit code; printed without a traceback."""

    def __init__(self, message: str, code: int = Exit.ERROR) -> None:
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _global_options_anywhere(self)

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


_LATE = "_etcd_recipes_late_option"


def _global_options_anywhere(root: TyperGroup) -> None:
    """Give every command a hidden copy of the root's options, so ``status -o json`` and
    ``lock show /x --endpoints ...`` work as ``-o json status`` does (etcdctl's ``-w``,
    kubectl's ``-o``). A copy given after the command replaces the value given before it; a
    copy reads no environment variable (the root's option did)."""
    globals_ = [p for p in root.params if p.name in _FIELDS]

    def late(field: str) -> Callable[[Any, Any, Any], Any]:
        def store(ctx: Any, _param: Any, value: Any) -> Any:
            if value is not None and isinstance(ctx.obj, Context):
                setattr(ctx.obj, field, Output(value) if field == "output" else value)
            return value

        return store

    def walk(command: Any) -> None:
        for sub in getattr(command, "commands", {}).values():
            walk(sub)
        if getattr(command, "commands", None) is not None:
            return
        for param in command.params:
            if callable(getattr(param, "_usage_display_name", None)):  # typer's "{PATH}"
                param._usage_display_name = functools.partial(_usage_name, param)
        have = {opt for p in command.params for opt in getattr(p, "opts", ())}
        for param in globals_:
            if getattr(param, _LATE, False) or have & set(param.opts):
                continue
            copy_: Any = copy.copy(param)
            copy_.expose_value = False
            copy_.hidden = True
            copy_.envvar = None
            copy_.default = None
            copy_.required = False
            copy_.show_default = False
            copy_.callback = late(_FIELDS[param.name or ""])
            setattr(copy_, _LATE, True)
            command.params.append(copy_)

    for command in root.commands.values():
        walk(command)


def _usage_name(param: Any) -> str:
    """An argument as usage lines show it: ``PATH``, ``[BASE]``, ``COMMAND...`` (typer writes
    a required one in braces, ``{PATH}``, which reads as a placeholder to fill in literally)."""
    name = str(param.metavar or (param.name or "").upper())
    name = name if param.required else f"[{name.strip('[]')}]"
    return name if param.nargs == 1 or name.endswith("...") else f"{name}..."


_FIELDS = {
    "endpoints": "endpoints",
    "cacert": "ca_cert",
    "cert": "cert",
    "key": "key",
    "user": "user",
    "password": "password",
    "namespace": "namespace",
    "output": "output",
    "dial_timeout": "dial_timeout",
}
"""The root's option names and the :class:`Context` field each sets."""


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


_EPILOG = (
    "The options above may also follow the command (etcd-recipes status -o json).\n\n"
    "Exit codes: 0 done; 1 error (etcd unreachable or answering an error); 2 bad command "
    "line; 3 nothing there (no recipe of that kind at PATH, nothing under PREFIX, no such "
    "id); 4 refused (no --yes, another recipe's keys, a precondition); 130 Ctrl-C.\n\n"
    "lock run exits with its command's code (127: not found, 126: not executable)."
)


def _one_line(message: str) -> None:
    _err.print(f"etcd-recipes: error: {' '.join(message.split())}", markup=False, soft_wrap=True)


app = typer.Typer(
    name="etcd-recipes",
    help="A development etcd and an operator's view of every etcd-recipes recipe.",
    epilog=_EPILOG,
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def command_group(name: str) -> typer.Typer:
    """The sub-command group registered as ``name`` (``"lock"``), for a module that adds a
    command to a group another module defines (``_revoke`` adds ``lock revoke``)."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    raise LookupError(f"no command group {name!r} is registered (yet)")


_err = Console(stderr=True, highlight=False)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


def seconds(text: str | float) -> float:
    """``"2"``, ``"2.5"``, ``"2s"``, ``"500ms"``, ``"1m"`` (etcdctl's durations) as seconds > 0;
    anything else is a usage error."""
    if isinstance(text, float | int):
        return float(text)
    m = _DURATION.match(text)
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2) or "s"] if m else 0.0
    if not value > 0:
        raise typer.BadParameter(f"a duration above 0 (2, 2.5, 2s, 500ms), not {text!r}")
    return value


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
    dial_timeout: float = typer.Option(
        DIAL_TIMEOUT,
        "--dial-timeout",
        parser=seconds,
        metavar="SECONDS",
        help="How long to wait for a first answer from etcd: seconds, or etcdctl's 2s, 500ms.",
    ),
) -> None:
    ctx.obj = Context(endpoints, cacert, cert, key, user, password, namespace, output, dial_timeout)


def run(ctx: typer.Context, work: Callable[[EtcdClient], Awaitable[T]]) -> T:
    """Connect, run ``work(client)``, close; map failures to one line and an exit code."""
    options: Context = ctx.obj

    async def main() -> T:
        me = asyncio.current_task()
        connected = refused = False

        def decided(probe: asyncio.Task[bool]) -> None:
            nonlocal refused
            answered = not probe.cancelled() and probe.exception() is None
            if answered and probe.result() and not connected and me is not None:
                refused = True
                me.cancel()  # every endpoint refuses: do not wait out --dial-timeout

        probe = asyncio.create_task(all_refuse(options.endpoints_tried(), options.dial_timeout))
        probe.add_done_callback(decided)
        try:
            async with options.connect() as client:
                connected = True
                probe.cancel()
                return await work(client)
        except asyncio.CancelledError:
            if refused:
                raise CommandError(
                    f"cannot reach etcd at {options.endpoints_tried()}: connection refused"
                ) from None
            raise
        finally:
            probe.cancel()

    return guarded(lambda: asyncio.run(main()), options.endpoints_tried)


def guarded(  # type: ignore[return]  # every except raises
    fn: Callable[[], T], endpoints: Callable[[], str] = lambda: "?"
) -> T:
    """Run ``fn``; map its failure to one line on stderr and an :class:`Exit` code (Ctrl-C:
    exit 130, nothing printed)."""
    try:
        return fn()
    except CommandError as exc:
        fail(str(exc), exc.code)
    except InvalidArgumentError as exc:
        fail(str(exc), Exit.USAGE)
    except (EtcdConnectionError, RetriesExhaustedError) as exc:
        fail(unreachable(exc, endpoints), Exit.ERROR)
    except EtcdRecipeError as exc:
        fail(str(exc), Exit.ERROR)
    except KeyboardInterrupt:
        raise typer.Exit(int(Exit.INTERRUPTED)) from None
    except Exception as exc:
        if os.environ.get("ETCD_RECIPES_CLI_TRACEBACK"):
            raise
        fail(f"{type(exc).__name__}: {exc} (ETCD_RECIPES_CLI_TRACEBACK=1 shows where)", Exit.ERROR)


_CAUSES = (
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"dns|name or service not known|resolution|resolve", re.I), "name not resolved"),
    (re.compile(r"handshake|ssl|tls|certificate", re.I), "TLS handshake failed"),
    (re.compile(r"connection reset|socket closed|broken pipe", re.I), "connection reset"),
    (re.compile(r"unreachable|no route", re.I), "host unreachable"),
)


def unreachable(exc: BaseException, endpoints: Callable[[], str]) -> str:
    """``cannot reach etcd at HOST:PORT: connection refused``: the endpoints and the cause in
    one short line (the library's message, with every attempt's detail, is for logs)."""
    text = str(exc)
    cause = next((why for pattern, why in _CAUSES if pattern.search(text)), None)
    if cause is None:
        m = re.search(r"within ([\d.]+)s", text)
        cause = f"no answer within {m.group(1)}s" if m else text.rsplit(": ", 1)[-1][:120]
    if isinstance(exc, TlsHandshakeError) or cause == "TLS handshake failed":
        cause = "TLS handshake failed (a wrong --cacert, a missing client certificate, or TLS "
        cause += "against a plain-text endpoint)"
    return f"cannot reach etcd at {endpoints()}: {cause}"


def fail(message: str, code: int) -> Any:
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
