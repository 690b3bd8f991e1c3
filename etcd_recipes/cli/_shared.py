"""``etcd-recipes shared get PATH``: a shared value (``SharedValue``, ``SharedCount``) and its
version, read through the recipe's own ``get()`` -- read only (nothing is created or written).

The value is shown as the recipe stores it, decoded as asked: ``--as text`` (UTF-8; bytes that
are not UTF-8 are shown in base64, with ``encoding`` saying so), ``int64`` (``SharedCount``,
``DistributedAtomicLong``) or ``json``. A missing key exits 3; a value that does not decode as
asked exits 4.
"""

from __future__ import annotations

import base64
import enum
import json
from typing import Any

import typer

from .. import EtcdClient, SharedValue
from ..codecs import INT64
from ..errors import CodecError
from ._app import CommandError, Exit, app, emit, run

shared_app = typer.Typer(help="Shared values (SharedValue, SharedCount).")
app.add_typer(shared_app, name="shared")


class Decode(str, enum.Enum):
    text = "text"
    int64 = "int64"
    json = "json"


def _decoded(data: bytes, how: Decode, path: str) -> tuple[str, Any]:
    """(encoding, value) of ``data`` decoded as ``how``; a mismatch is refused (exit 4)."""
    try:
        if how is Decode.int64:
            return "int64", INT64.decode(data)
        if how is Decode.json:
            return "json", json.loads(data)
    except (CodecError, ValueError) as exc:
        raise CommandError(f"{path} is not {how.value}: {exc}", Exit.REFUSED) from None
    try:
        return "utf-8", data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64", base64.b64encode(data).decode("ascii")


@shared_app.command("get")
def shared_get(
    ctx: typer.Context,
    path: str,
    decode: Decode = typer.Option(
        Decode.text, "--as", help="Decode the value as text, int64 or json."
    ),
) -> None:
    """The value and its version (the key's mod revision). Read only."""
    if not path.startswith("/"):
        raise CommandError(f"a recipe path starts with '/', got {path!r}", Exit.USAGE)
    path = path.rstrip("/") or "/"

    async def work(client: EtcdClient) -> None:
        reading = await SharedValue(client, path, b"").get()  # not started: nothing is created
        if not reading.exists:
            raise CommandError(f"no shared value at {path}", Exit.NOT_FOUND)
        encoding, value = _decoded(reading.value, decode, path)
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        data = {"path": path, "version": reading.version, "encoding": encoding, "value": value}
        emit(ctx, "shared get", data, lines=[f"{shown}  (version {reading.version})"])

    run(ctx, work)
