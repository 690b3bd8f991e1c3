"""``etcd-recipes status``: the cluster at a glance, for an operator.

Guaranteed: the answering member's view (version, leader, raft term, revision), the compact
revision (the lowest revision still readable, found by bisection: etcd reports it nowhere),
every member with its role (leader, follower, learner) and, when the CLI can reach it, its own
revision and database size, the alarms, and the largest member database against the quota
(``--quota-bytes``, etcd's default 2 GiB) with a warning from 80 %. Exit code 0 whenever etcd
answered, warnings or not (scripts read ``warnings`` and ``alarms`` in the JSON form).

NOT guaranteed: the quota is the one you give (a member's ``--quota-backend-bytes`` cannot be
read over the API); a member the CLI cannot reach (another network, a stopped process) shows
an ``error`` instead of its sizes, and the figures of different members are read one after the
other, not at one instant.
"""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from .. import EtcdClient, Member, Status
from ..errors import EtcdRecipeError
from ._app import Context, app, emit, run

DEFAULT_QUOTA = 2 * 1024**3
"""etcd's default ``--quota-backend-bytes``."""
WARN_AT = 0.8
"""The share of the quota from which ``status`` warns."""
_MEMBER_TIMEOUT = 3.0


def _role(leader: bool, learner: bool) -> str:
    return "leader" if leader else ("learner" if learner else "follower")


def _size(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units, like etcd's own logs)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


async def _member_status(options: Context, member: Member) -> Status | str:
    """The member's own Status through its first client URL, or why it could not be read."""
    if not member.client_urls:
        return "not started yet (no client URL)"
    try:
        async with options.connect(member.client_urls[0]) as client:
            return await client.status(timeout=_MEMBER_TIMEOUT)
    except (EtcdRecipeError, OSError) as exc:
        return f"unreachable: {exc}"


def _member_row(member: Member, leader: int, seen: Status | str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": f"{member.id:x}",
        "name": member.name,
        "role": _role(member.id == leader, member.is_learner),
        "client_urls": member.client_urls,
        "peer_urls": member.peer_urls,
    }
    if isinstance(seen, Status):
        row.update(
            revision=seen.revision,
            raft_index=seen.raft_index,
            db_size=seen.db_size,
            db_size_in_use=seen.db_size_in_use,
            errors=seen.errors,
        )
    else:
        row["error"] = seen
    return row


@app.command()
def status(
    ctx: typer.Context,
    quota_bytes: int = typer.Option(
        DEFAULT_QUOTA,
        "--quota-bytes",
        min=1,
        help="The members' --quota-backend-bytes (etcd's default: 2 GiB); warns from 80 %.",
    ),
) -> None:
    """Endpoints, members and roles, revision and compact revision, DB size against the quota,
    alarms."""
    options: Context = ctx.obj

    async def work(client: EtcdClient) -> None:
        st = await client.status()
        members = await client.member_list()
        alarms = await client.alarms()
        compacted = await client.compact_revision()
        seen = await asyncio.gather(*(_member_status(options, m) for m in members))
        rows = [_member_row(m, st.leader, s) for m, s in zip(members, seen, strict=True)]
        largest = max([st.db_size, *(r.get("db_size", 0) for r in rows)])
        percent = round(100.0 * largest / quota_bytes, 1)
        names = {m.id: m.name or f"{m.id:x}" for m in members}
        warnings = [
            f"alarm {a.alarm} on member {names.get(a.member_id, f'{a.member_id:x}')}"
            for a in alarms
        ]
        if largest >= WARN_AT * quota_bytes:
            warnings.append(
                f"database {_size(largest)} is {percent}% of the {_size(quota_bytes)} quota: "
                "compact and defragment, or raise --quota-backend-bytes"
            )
        data = {
            "endpoints": [e.strip() for e in client.endpoints.split(",")],
            "cluster_id": f"{st.cluster_id:x}",
            "version": st.version,
            "leader": f"{st.leader:x}",
            "raft_term": st.raft_term,
            "revision": st.revision,
            "compact_revision": compacted,
            "db_size": largest,
            "quota_bytes": quota_bytes,
            "quota_percent": percent,
            "alarms": [{"member": f"{a.member_id:x}", "alarm": a.alarm} for a in alarms],
            "warnings": warnings,
            "errors": st.errors,
            "members": rows,
        }
        emit(
            ctx,
            "status",
            data,
            lines=[
                f"etcd {st.version} at {client.endpoints}: cluster {st.cluster_id:x}, "
                f"raft term {st.raft_term}",
                f"revision {st.revision}, compacted at {compacted or '-'}",
                f"database {_size(largest)} of {_size(quota_bytes)} quota ({percent}%)",
                f"alarms: {', '.join(f'{a.alarm}' for a in alarms) or 'none'}",
                *(f"error: {e}" for e in st.errors),
                *(f"warning: {w}" for w in warnings),
            ],
            columns=("member", "name", "role", "revision", "db size", "client urls"),
            rows=[
                (
                    r["id"],
                    r["name"],
                    r["role"],
                    r.get("revision", "?"),
                    _size(r["db_size"]) if "db_size" in r else r["error"],
                    ",".join(r["client_urls"]),
                )
                for r in rows
            ],
        )

    run(ctx, work)
