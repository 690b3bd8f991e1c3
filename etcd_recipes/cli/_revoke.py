"""``lock revoke``: ask a mutex's holder to give the lock back (cooperative revocation,
:mod:`etcd_recipes.locks.revocation`).

Guaranteed: with ``--yes``, one write -- the holder key's value becomes ``__REVOKE__``, on its
own lease, guarded on its create revision; nothing is released or deleted, and a path that also
holds keys outside the lock layout is refused (exit 4) before anything is written. Without
``--yes`` (or with ``--dry-run``) nothing is written.

Not guaranteed: the holder releases only if it registered a revocation listener before it
acquired, and when it decides to.
"""

from __future__ import annotations

from typing import Any

import typer

from .. import EtcdClient, request_revoke
from ..locks.inspection import mutex_state
from ._app import CommandError, Exit, command_group, confirm, emit, run

lock_app = command_group("lock")


def _entry(key: bytes, lease: int, token: int, value: bytes, ttl: int) -> dict[str, Any]:
    return {
        "key": key.decode("utf-8", errors="replace"),
        "role": "holder",
        "fencing_token": token,
        "lease": f"{lease:x}",
        "ttl_left": ttl,
        "value": value.decode("utf-8", errors="replace"),
    }


@lock_app.command("revoke")
def lock_revoke(
    ctx: typer.Context,
    path: str,
    yes: bool = typer.Option(False, "--yes", help="Do it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say who would be asked; write nothing."),
) -> None:
    """Ask the holder to release the lock (it decides when; see lock break for forcing it).

    The holder key's value becomes __REVOKE__ (its lease, fencing token and place stay); a
    holder with a revocation listener hears of it. Exit 3 when nobody holds the lock.
    """
    if not path.startswith("/"):
        raise CommandError(f"a recipe path starts with '/', got {path!r}", Exit.USAGE)
    path = path.rstrip("/") or "/"

    async def work(client: EtcdClient) -> None:
        state = await mutex_state(client, path)
        if state.foreign:
            raise CommandError(
                f"{path} is not a lock: {path}/ holds {len(state.foreign)} key(s) outside the "
                "lock layout (<path>/<lease hex> on that lease)",
                Exit.REFUSED,
            )
        holder = state.holder
        if holder is None:
            raise CommandError(f"nobody holds the lock {path}", Exit.NOT_FOUND)
        ttl = (await client.lease_time_to_live(holder.lease_id)).ttl
        entry = _entry(holder.key, holder.lease_id, holder.create_revision, holder.value, ttl)
        if dry_run:
            what = f"would ask holder {entry['key']} to release {path}"
        else:
            confirm(yes, f"asking the holder of {path} ({entry['key']}) to release it")
            asked = await request_revoke(client, path)
            if asked is None or asked.key != holder.key:
                raise CommandError(f"the holder of {path} released it meanwhile", Exit.NOT_FOUND)
            entry["value"] = asked.value.decode("utf-8", errors="replace")
            what = f"asked holder {entry['key']} to release {path}"
        emit(
            ctx,
            "lock revoke",
            {"path": path, "holder": entry, "dry_run": dry_run, "action": what},
            lines=[what],
        )

    run(ctx, work)
