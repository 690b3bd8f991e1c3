"""``semaphore show`` and ``semaphore release``, through the locks family's own inspection
code (:func:`etcd_recipes.locks.inspection.semaphore_state`, which reads only the semaphore's
own keys: its permit count and ``<path>/holders/``).

Guaranteed: ``show`` writes nothing. ``release`` force-releases the permits of one holder
(its client id, or one holder key): it deletes exactly those holder keys, each only if it is
still the key that was read (same create revision), so the next waiter is admitted and the
holder's instance reports the permit lost; nothing else is touched -- not the holder's lease
(its session may carry other recipes' keys), not a waiter, not a key outside the layout.
Without ``--yes`` it refuses (exit 4); ``--dry-run`` says what would go.
Not guaranteed: the holder's code keeps running until it sees the loss (a permit-lost
listener, ``permit_lost_events()``); what is printed is stale once printed.
"""

from __future__ import annotations

from typing import Any

import typer

from .. import Cmp, EtcdClient, LockParticipant, Op
from ..errors import InvalidArgumentError
from ..locks.inspection import SemaphoreState, semaphore_state
from ._app import CommandError, Exit, app, confirm, emit, run
from ._commands import PATH, _path

semaphore_app = typer.Typer(help="Counting semaphores (DistributedSemaphore).")
app.add_typer(semaphore_app, name="semaphore")


async def _row(client: EtcdClient, p: LockParticipant) -> dict[str, Any]:
    ttl = (await client.lease_time_to_live(p.lease_id)).ttl if p.lease_id else None
    return {
        "key": p.key.decode("utf-8", "replace"),
        "client_id": p.value.decode("utf-8", "replace"),
        "fencing_token": p.create_revision,
        "lease": f"{p.lease_id:x}" if p.lease_id else None,
        "ttl_left": ttl,
    }


async def _state(client: EtcdClient, path: str) -> SemaphoreState:
    try:
        state = await semaphore_state(client, path)
    except InvalidArgumentError as exc:
        raise CommandError(str(exc), Exit.REFUSED) from None
    if state is None:
        raise CommandError(f"no semaphore at {path}", Exit.NOT_FOUND)
    return state


@semaphore_app.command("show")
def semaphore_show(ctx: typer.Context, path: str = PATH) -> None:
    """Permits, holders with lease TTL left, and waiters in line order."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        state = await _state(client, path)
        holders = [await _row(client, p) for p in state.holders]
        waiters = [await _row(client, p) for p in state.waiters]
        emit(
            ctx,
            "semaphore show",
            {"path": path, "permits": state.permits, "holders": holders, "waiters": waiters},
            lines=[f"{len(holders)} of {state.permits} permits held, {len(waiters)} waiting"],
            columns=("role", "client id", "fencing token", "lease", "ttl left"),
            rows=[
                (role, r["client_id"], r["fencing_token"], r["lease"], r["ttl_left"])
                for role, rows in (("holder", holders), ("waiter", waiters))
                for r in rows
            ],
        )

    run(ctx, work)


@semaphore_app.command("release")
def semaphore_release(
    ctx: typer.Context,
    path: str = PATH,
    holder: str = typer.Option(
        ..., "--holder", help="The holder's client id (all its permits) or one holder key."
    ),
    yes: bool = typer.Option(False, "--yes", help="Do it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change nothing."),
) -> None:
    """Force-release a holder's permits: delete its holder keys (only those, each only if
    unchanged since read); the next waiter gets the permit, the holder sees it lost.

    Exit 3 when HOLDER holds no permit (a waiter, or unknown); 4 without --yes.
    """
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        state = await _state(client, path)
        held = [p for p in state.holders if holder in (p.value.decode("utf-8", "replace"), _key(p))]
        if not held:
            waiting = [
                w for w in state.waiters if holder in (w.value.decode("utf-8", "replace"), _key(w))
            ]
            why = " (it is waiting, not holding)" if waiting else ""
            raise CommandError(f"{holder} holds no permit of {path}{why}", Exit.NOT_FOUND)
        rows = [await _row(client, p) for p in held]
        keys = ", ".join(r["key"] for r in rows)
        if dry_run:
            released: list[dict[str, Any]] = []
            what = f"would release {len(rows)} permit(s) of {holder}: {keys}"
        else:
            confirm(yes, f"releasing {len(rows)} permit(s) of {holder} in {path} ({keys})")
            released = []
            for p, row in zip(held, rows, strict=True):
                done = await client.txn(
                    [Cmp.create_revision(p.key) == p.create_revision], [Op.delete(p.key)]
                )
                if done.succeeded:
                    released.append(row)
            if not released:
                raise CommandError(f"{holder} released its permits meanwhile", Exit.NOT_FOUND)
            shown = ", ".join(r["key"] for r in released)
            what = f"released {len(released)} permit(s) of {holder}: {shown}"
        emit(
            ctx,
            "semaphore release",
            {
                "path": path,
                "holder": holder,
                "permits": rows if dry_run else released,
                "dry_run": dry_run,
                "action": what,
            },
            lines=[what],
        )

    run(ctx, work)


def _key(p: LockParticipant) -> str:
    return p.key.decode("utf-8", "replace")
