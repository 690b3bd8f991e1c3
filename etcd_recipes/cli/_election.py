"""``election show`` and ``election observe`` (``election resign`` lives in ``_recipes``).

Guaranteed: both only read. ``observe`` prints the leader now, then every change; ``--count
N`` stops after N changes, so ``--count 0`` prints the leader now and exits -- the meaning
``watch --count N`` has too (N events after the start). Ctrl-C ends it with exit 130, quietly.
Not guaranteed: a change that is undone within one watch response may be seen once or not at
all (the observer reports the state it reads, not every transition).
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import typer

from .. import Elected, EtcdClient, LeaderObserver, get_participants
from ._app import CommandError, Exit, emit, run
from ._commands import PATH, _path, election_app

COUNT_HELP = (
    "Stop after this many changes (0: print the leader now and exit); default: until Ctrl-C."
)


@election_app.command("show")
def election_show(ctx: typer.Context, path: str = PATH) -> None:
    """The leader (with its fencing token and proclaimed value) and the candidates in the order
    they joined."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        participants = await get_participants(client, path)
        async with LeaderObserver(client, path) as observer:
            current = observer.current
        leader = current.leader if isinstance(current, Elected) else None
        token = current.fencing_token if isinstance(current, Elected) else None
        said = current.value if isinstance(current, Elected) else None
        encoding, value = _shown(said)
        if leader is None and not participants:
            raise CommandError(f"no election at {path}", Exit.NOT_FOUND)
        emit(
            ctx,
            "election show",
            {
                "path": path,
                "leader": leader,
                "fencing_token": token,
                "value": value,
                "value_encoding": encoding,
                "participants": [
                    {"client_id": p.client_id, "is_leader": p.is_leader} for p in participants
                ],
            },
            lines=[
                f"leader: {leader or '(none)'}" + (f" (fencing token {token})" if token else ""),
                *(
                    [f"value: {value}" + (" (base64)" if encoding == "base64" else "")]
                    if said
                    else []
                ),
            ],
            columns=("candidate", "leader"),
            rows=[(p.client_id, "yes" if p.is_leader else "") for p in participants],
        )

    run(ctx, work)


def _shown(value: bytes | None) -> tuple[str | None, str | None]:
    """(encoding, text) of a proclaimed value: UTF-8 as it is, other bytes as base64."""
    if value is None:
        return None, None
    try:
        return "utf-8", value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64", base64.b64encode(value).decode("ascii")


@election_app.command("observe")
def election_observe(
    ctx: typer.Context,
    path: str = PATH,
    count: int | None = typer.Option(None, min=0, help=COUNT_HELP),
) -> None:
    """Print the leader now and every change, until Ctrl-C (exit 130) or --count changes.

    --count N stops after N changes: --count 0 prints the leader now and exits (as
    watch --count 0 exits once its watch is in place, with no event).
    """
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        changes = -1  # the first event is the leader now, not a change
        async with LeaderObserver(client, path) as observer:
            async for event in observer.events():
                if isinstance(event, Elected):
                    data: dict[str, Any] = {
                        "leader": event.leader,
                        "fencing_token": event.fencing_token,
                    }
                    line = f"elected {event.leader} (fencing token {event.fencing_token})"
                else:
                    data, line = {"leader": None, "fencing_token": None}, "vacated"
                emit(ctx, "election observe", data, lines=[line])
                sys.stdout.flush()
                changes += 1
                if count is not None and changes >= count:
                    return

    run(ctx, work)
