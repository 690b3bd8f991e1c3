"""``watch PREFIX``: every change under a prefix, with the watch's recoveries inline.

Guaranteed: PREFIX is used exactly as given (``/demo/`` only the keys under ``/demo/``);
``--count N`` stops after N events (0: as soon as the watch is in place, with none), the
meaning ``election observe --count`` has; Ctrl-C ends it with exit 130, quietly. History
compacted while the watch was away is not replayed: a ``Resynced`` line says it continued from
the current revision.
Not guaranteed: events between the command's start and its watch being in place are not shown.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from .. import EtcdClient
from ._app import app, emit, run
from ._commands import PREFIX, _prefix


@app.command()
def watch(
    ctx: typer.Context,
    prefix: str = PREFIX,
    count: int | None = typer.Option(
        None,
        min=0,
        help="Stop after this many events (0: once the watch is in place); default: until Ctrl-C.",
    ),
) -> None:
    """Print every change under PREFIX, with the watch's recoveries inline, until Ctrl-C
    (exit 130) or --count events (0: exit once the watch is in place, as election observe
    --count 0 exits after the leader now)."""
    prefix = _prefix(prefix)

    async def work(client: EtcdClient) -> None:
        seen = 0

        async def resync() -> int:
            # History was compacted while the watch was away: continue from now (the
            # Resynced line says so) rather than failing.
            return (await client.get_prefix(prefix, count_only=True)).revision + 1

        async with client.watch(prefix, prefix=True, resync=resync) as stream:
            if count == 0:
                return
            async for item in stream.items():
                if _print_watch_item(ctx, item):
                    seen += 1
                if count is not None and seen >= count:
                    return

    run(ctx, work)


def _print_watch_item(ctx: typer.Context, item: Any) -> bool:
    """Print one watch item (a data event or a recovery event); True for a data event."""
    ev = getattr(item, "type", None)
    kv = getattr(item, "kv", None)
    if ev is not None and kv is not None:
        data = {"event": ev.name, "key": kv.key_text, "revision": kv.mod_revision}
        line = f"{ev.name} {kv.key_text} @{kv.mod_revision}"
    else:
        kind = type(item).__name__
        data, line = {"event": kind, "detail": str(item)}, f"[{kind}] {item}"
    emit(ctx, "watch", data, lines=[line])
    sys.stdout.flush()
    return ev is not None
