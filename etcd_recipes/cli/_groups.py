"""``group ls`` and ``group partitions``: a group's members and the owners of its items, read
through the groups family's own inspection code (:mod:`etcd_recipes.groups.inspection`).

Guaranteed: read only (nothing is written); one read per command, members and owners at one
revision; only keys in the family's layout are shown.
Not guaranteed: the view is stale once printed; an item nobody owns at that instant (a
hand-over in progress) is not listed, as the partitioners' item set is not kept in etcd.
"""

from __future__ import annotations

import base64
from typing import Any

import typer

from .. import EtcdClient
from ..groups.inspection import GroupView, read_group
from ._app import CommandError, Exit, app, emit, run

group_app = typer.Typer(help="Group members and partition owners (read only).")
app.add_typer(group_app, name="group")


def _checked(path: str) -> str:
    if not path.startswith("/"):
        raise CommandError(f"a recipe path starts with '/', got {path!r}", Exit.USAGE)
    return path.rstrip("/") or "/"


def _payload(raw: bytes) -> dict[str, Any]:
    try:
        return {"payload": raw.decode("utf-8"), "payload_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(raw).decode(), "payload_encoding": "base64"}


async def _view(client: EtcdClient, path: str) -> GroupView:
    view = await read_group(client, path)
    if not view.members and not view.owners:
        raise CommandError(f"no group at {path}", Exit.NOT_FOUND)
    return view


@group_app.command("ls")
def group_ls(ctx: typer.Context, path: str) -> None:
    """The members of the group at PATH: id, lease, payload, and how many items each owns."""
    path = _checked(path)

    async def work(client: EtcdClient) -> None:
        view = await _view(client, path)
        owned: dict[str, int] = {}
        for o in view.owners:
            owned[o.owner] = owned.get(o.owner, 0) + 1
        members = [
            {
                "id": m.member_id,
                "lease": f"{m.lease:x}" if m.lease else None,
                "create_revision": m.create_revision,
                "items": owned.get(m.member_id, 0),
                **_payload(m.payload),
            }
            for m in view.members
        ]
        data = {"path": path, "revision": view.revision, "members": members}
        emit(
            ctx,
            "group ls",
            data,
            lines=[f"{len(members)} member(s) of {path} @{view.revision}"],
            columns=("member", "lease", "items", "payload"),
            rows=[
                (m["id"], m["lease"], m["items"], m["payload"] if m["payload_encoding"] == "utf-8"
                 else f"<{len(base64.b64decode(m['payload']))} bytes>")
                for m in members
            ],
        )  # fmt: skip

    run(ctx, work)


@group_app.command("partitions")
def group_partitions(ctx: typer.Context, path: str) -> None:
    """Who owns each item of the partitioner at PATH, with its fencing token; an owner that is
    not the one rendezvous hashing names (a hand-over pending) or not a member is marked."""
    path = _checked(path)

    async def work(client: EtcdClient) -> None:
        view = await _view(client, path)
        owners = [
            {
                "item": o.item,
                "owner": o.owner,
                "fencing_token": o.fencing_token,
                "lease": f"{o.lease:x}" if o.lease else None,
                "owner_is_member": o.owner_is_member,
                "expected_owner": o.expected_owner,
            }
            for o in view.owners
        ]
        pending = sum(o["owner"] != o["expected_owner"] for o in owners)
        data = {
            "path": path,
            "revision": view.revision,
            "members": [m.member_id for m in view.members],
            "owners": owners,
        }

        def note(o: dict[str, Any]) -> str:
            if not o["owner_is_member"]:
                return "owner gone (lease expiring)"
            return "" if o["owner"] == o["expected_owner"] else f"moving to {o['expected_owner']}"

        emit(
            ctx,
            "group partitions",
            data,
            lines=[
                f"{len(owners)} item(s) owned by {len(view.members)} member(s) of {path} "
                f"@{view.revision}, {pending} hand-over(s) pending"
            ],
            columns=("item", "owner", "fencing token", "note"),
            rows=[(o["item"], o["owner"], o["fencing_token"], note(o)) for o in owners],
        )

    run(ctx, work)
