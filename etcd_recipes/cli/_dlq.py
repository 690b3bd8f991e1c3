"""``dlq ls``, ``dlq requeue`` and ``dlq purge``: a work queue's dead letters, through the
queues family's own API (``dlq show`` lives in ``_queues``).

Guaranteed: only a work queue's path is acted on (a FIFO or priority queue's, or keys no queue
writes, exit 4 with nothing written); ``--dry-run`` and a refusal without ``--yes`` write
nothing. ``requeue`` is idempotent for an id waiting in the queue again (reported "already
requeued", exit 0); an id a consumer holds (in flight) is not a dead letter and is reported so,
exit 3, as an id found nowhere.
Not guaranteed: an id waiting in the queue may also be one that was never dead (the queue does
not remember that an item was requeued).
"""

from __future__ import annotations

from typing import Any

import typer

from .. import DistributedWorkQueue, EtcdClient
from ..errors import InvalidArgumentError
from ..queues.inspection import detect_queue_kind, in_flight, peek_queue, queue_stats
from ._app import CommandError, Exit, confirm, emit, run
from ._commands import PATH, _path, dlq_app


@dlq_app.command("ls")
def dlq_ls(ctx: typer.Context, path: str = PATH) -> None:
    """The work queue's dead letters, oldest first: id, attempts, size and failure reason;
    exit 3 when there is none (a FIFO or priority queue's path is refused, exit 4: only work
    queues have dead letters)."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        await work_queue_only(client, path)
        queue = DistributedWorkQueue(client, path)
        try:
            dead = await queue.dead_letters()
        finally:
            await queue.aclose()
        if not dead:
            raise CommandError(f"no dead letter in {path}", Exit.NOT_FOUND)
        rows = [
            {"id": d.id, "attempts": d.attempts, "size": len(d.raw), "reason": d.reason}
            for d in dead
        ]
        emit(
            ctx,
            "dlq ls",
            {"path": path, "dead_letters": rows},
            columns=("id", "attempts", "bytes", "reason"),
            rows=[(r["id"], r["attempts"], r["size"], r["reason"]) for r in rows],
        )

    run(ctx, work)


async def work_queue_only(client: EtcdClient, path: str) -> None:
    """Refuse (exit 4) a path that holds a FIFO or priority queue, or keys no queue writes:
    only a work queue has dead letters. An empty path passes (nothing to find there)."""
    try:
        kind = await detect_queue_kind(client, path)
    except InvalidArgumentError as exc:
        raise CommandError(str(exc), Exit.REFUSED) from None
    if kind not in (None, "work"):
        raise CommandError(
            f"{path} is a {kind} queue: only a work queue has dead letters", Exit.REFUSED
        )


async def _whereabouts(client: EtcdClient, path: str, ids: list[str]) -> dict[str, str]:
    """Where each of ``ids`` that is not dead is: ``"waiting"`` (ready or delayed, what
    ``queue peek`` lists) or ``"claimed"`` (received by a consumer: in flight)."""
    found = {i: "claimed" for i in await in_flight(client, path, ids)}
    stats = await queue_stats(client, path, kind="work")
    waiting = 0 if stats is None else stats.ready + stats.delayed
    if waiting:
        for e in await peek_queue(client, path, waiting, kind="work"):
            found.setdefault(e.id, "waiting")
    return {i: found[i] for i in ids if i in found}


def _dlq_change(
    ctx: typer.Context, path: str, ids: list[str], all_: bool, dry_run: bool, yes: bool, verb: str
) -> None:
    path = _path(path)
    if all_ == bool(ids):
        raise CommandError("give --id ID (repeatable) or --all", Exit.USAGE)

    async def work(client: EtcdClient) -> None:
        await work_queue_only(client, path)
        queue = DistributedWorkQueue(client, path)
        try:
            present = [d.id for d in await queue.dead_letters()]
            wanted = present if all_ else list(dict.fromkeys(ids))
            absent = [i for i in wanted if i not in present]
            where = await _whereabouts(client, path, absent) if absent else {}
            # A requeued item is no longer dead but waits in the queue again: asking for it
            # twice is the same request, answered "already requeued" with nothing written.
            already = [i for i in absent if where.get(i) == "waiting"] if verb == "requeue" else []
            missing = [i for i in absent if i not in already]
            if missing:
                raise CommandError(_not_dead(missing, where, path, verb), Exit.NOT_FOUND)
            todo = [i for i in wanted if i in present]
            if todo and not dry_run:
                confirm(yes, f"dlq {verb} of {len(todo)} item(s) in {path}")
            done: list[str] = []
            gone: list[str] = []
            for item_id in todo:
                if dry_run:
                    done.append(item_id)
                    continue
                change = queue.requeue_dead_letter if verb == "requeue" else queue.purge_dead_letter
                (done if await change(item_id) else gone).append(item_id)
            if gone:  # another operator moved them between the read and the write
                where = await _whereabouts(client, path, gone)
                if verb == "requeue":
                    already += [i for i in gone if where.get(i) == "waiting"]
                gone = [i for i in gone if i not in already]
        finally:
            await queue.aclose()
        action = f"would {verb}" if dry_run else {"requeue": "requeued", "purge": "purged"}[verb]
        line = f"{action} {len(done)} item(s): {', '.join(done) or '-'}"
        if already:
            line += f"; already requeued (back in the queue): {', '.join(already)}"
        data: dict[str, Any] = {"path": path, "ids": done, "dry_run": dry_run}
        if verb == "requeue":
            data["already_requeued"] = already
        emit(ctx, f"dlq {verb}", data, lines=[line])
        if gone:
            raise CommandError(
                f"{', '.join(gone)}: changed by someone else meanwhile, not {action}",
                Exit.NOT_FOUND,
            )

    run(ctx, work)


def _not_dead(missing: list[str], where: dict[str, str], path: str, verb: str) -> str:
    """Why the ``missing`` ids are not dead letters, one clause per kind."""
    claimed = [i for i in missing if where.get(i) == "claimed"]
    waiting = [i for i in missing if where.get(i) == "waiting"]
    nowhere = [i for i in missing if i not in where]
    parts = []
    if claimed:
        parts.append(
            f"{', '.join(claimed)} in {path} is claimed by a consumer (in flight), not dead"
        )
    if waiting:  # only for purge: requeue takes a waiting id as already requeued
        parts.append(
            f"{', '.join(waiting)} in {path} is waiting in the queue, not dead "
            f"({verb} deletes dead letters only)"
        )
    if nowhere:
        parts.append(f"no dead letter {', '.join(nowhere)} in {path}")
    return "; ".join(parts)


@dlq_app.command("requeue")
def dlq_requeue(
    ctx: typer.Context,
    path: str = PATH,
    ids: list[str] = typer.Option([], "--id", help="A dead letter's id (repeatable)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; write nothing."),
    yes: bool = typer.Option(False, "--yes", help="Do it."),
) -> None:
    """Put dead letters back in the queue at their original place, with fresh attempts.

    Idempotent: an --id already requeued and waiting in the queue is reported "already
    requeued" and nothing is written (exit 0). An id a consumer holds (in flight) is not a
    dead letter: it is reported as claimed, exit 3, as an id found nowhere (never dead, or
    requeued and since acknowledged). Only work queues have dead letters: a FIFO or
    priority queue's path is refused (exit 4).
    """
    _dlq_change(ctx, path, ids, all_, dry_run, yes, "requeue")


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    path: str = PATH,
    ids: list[str] = typer.Option([], "--id", help="A dead letter's id (repeatable)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; write nothing."),
    yes: bool = typer.Option(False, "--yes", help="Do it."),
) -> None:
    """Delete dead letters for good.

    A purged dead letter leaves nothing behind, so purging it again cannot be told from an id
    that never existed: both exit 3 (not found). An id waiting in the queue or claimed by a
    consumer exits 3 too, saying where it is. A FIFO or priority queue's path is refused
    (exit 4).
    """
    _dlq_change(ctx, path, ids, all_, dry_run, yes, "purge")
