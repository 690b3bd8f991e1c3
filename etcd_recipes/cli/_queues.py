"""``queue stats`` and ``queue peek``: what a FIFO, priority or work queue holds, read through
the queues family's own inspection code (:mod:`etcd_recipes.queues.inspection`).

Guaranteed: read only (nothing is written, nothing is taken); one read per command.
Not guaranteed: the numbers are stale once printed; payloads are shown only with ``--payload``.
"""

from __future__ import annotations

import base64
from typing import Any

import typer

from .. import DistributedWorkQueue, EtcdClient
from ..errors import InvalidArgumentError
from ..queues.inspection import QueueKind, detect_queue_kind, peek_queue, queue_stats
from ._app import CommandError, Exit, app, emit, run
from ._commands import PATH, _path, dlq_app
from ._dlq import work_queue_only

queue_app = typer.Typer(help="FIFO, priority and work queues (read only).")
app.add_typer(queue_app, name="queue")

_KIND = typer.Option(None, "--kind", help="fifo, priority or work (default: detect).")


def _payload(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        return {"payload": raw.decode("utf-8"), "payload_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"}


@queue_app.command("stats")
def queue_stats_cmd(ctx: typer.Context, path: str = PATH, kind: str | None = _KIND) -> None:
    """Ready, delayed, in-flight and dead items, and the oldest ready item's age."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        found = await _detected(client, path, kind)
        stats = None if found is None else await queue_stats(client, path, kind=found)
        if stats is None:
            raise CommandError(f"no queue at {path}", Exit.NOT_FOUND)
        data = {
            "path": path,
            "kind": stats.kind,
            "ready": stats.ready,
            "delayed": stats.delayed,
            "in_flight": stats.in_flight,
            "dead": stats.dead,
            "orphans": stats.orphans,
            "oldest_age": stats.oldest_age,
            "revision": stats.revision,
        }
        age = "-" if stats.oldest_age is None else f"{stats.oldest_age:.1f}s"
        emit(
            ctx,
            "queue stats",
            data,
            lines=[f"{stats.kind} queue {path} @{stats.revision}"],
            columns=("ready", "delayed", "in flight", "dead", "oldest age"),
            rows=[(stats.ready, stats.delayed, stats.in_flight, stats.dead, age)],
        )

    run(ctx, work)


async def _detected(client: EtcdClient, path: str, kind: str | None) -> QueueKind | None:
    """The --kind given, or the kind the path's keys show (``None``: nothing there). A path
    holding keys no queue writes is refused (exit 4), as ``counter get`` refuses a value that
    is not a counter."""
    if kind is not None:
        return _kind(kind)
    try:
        return await detect_queue_kind(client, path)
    except InvalidArgumentError as exc:
        raise CommandError(str(exc), Exit.REFUSED) from None


def _kind(kind: str | None) -> QueueKind | None:
    if kind not in (None, "fifo", "priority", "work"):
        raise CommandError(f"--kind is fifo, priority or work, not {kind!r}", Exit.USAGE)
    return kind  # type: ignore[return-value]


@queue_app.command("peek")
def queue_peek(
    ctx: typer.Context,
    path: str = PATH,
    n: int = typer.Option(10, "-n", min=1, help="How many items."),
    payload: bool = typer.Option(False, "--payload", help="Show the payloads too."),
    kind: str | None = _KIND,
) -> None:
    """The next N items in delivery order, metadata only unless --payload; takes nothing.
    Exit 3 when nothing waits (no queue at PATH, or only items in flight or dead)."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        found = await _detected(client, path, kind)
        entries = (
            [] if found is None else await peek_queue(client, path, n, kind=found, payload=payload)
        )
        if not entries:
            what = "no queue" if found is None else f"nothing waiting in the {found} queue"
            raise CommandError(f"{what} at {path}", Exit.NOT_FOUND)
        items = [
            {
                "id": e.id,
                "state": e.state,
                "size": e.size,
                "age": e.age,
                "due_in": e.due_in,
                "priority": e.priority,
                "attempts": e.attempts,
                "create_revision": e.create_revision,
                **_payload(e.payload),
            }
            for e in entries
        ]
        emit(
            ctx,
            "queue peek",
            {"path": path, "items": items},
            columns=(
                "id",
                "state",
                "bytes",
                "priority",
                "attempts",
                *(("payload",) if payload else ()),
            ),
            rows=[
                (
                    i["id"],
                    i["state"],
                    i["size"],
                    i["priority"],
                    i["attempts"],
                    *((i.get("payload"),) if payload else ()),
                )
                for i in items
            ],
        )

    run(ctx, work)


@dlq_app.command("show")
def dlq_show(
    ctx: typer.Context,
    path: str = PATH,
    item_id: str = typer.Option(..., "--id", help="The dead letter's id."),
) -> None:
    """One dead letter: attempts, reason, size and payload."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        await work_queue_only(client, path)
        queue = DistributedWorkQueue(client, path)
        try:
            dead = [d for d in await queue.dead_letters() if d.id == item_id]
        finally:
            await queue.aclose()
        if not dead:
            raise CommandError(f"no dead letter {item_id} in {path}", Exit.NOT_FOUND)
        d = dead[0]
        data = {
            "path": path,
            "id": d.id,
            "attempts": d.attempts,
            "reason": d.reason,
            "size": len(d.raw),
            **_payload(d.raw),
        }
        emit(
            ctx,
            "dlq show",
            data,
            lines=[f"{k}: {v}" for k, v in data.items() if k != "path"],
        )

    run(ctx, work)
