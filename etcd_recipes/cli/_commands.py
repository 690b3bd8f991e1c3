"""The operator's commands: locks, elections, counters, barriers, dead letters, watch
(``status`` lives in ``_status``).

Each reads through the recipes' own public API (their key layouts live there, once).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import signal
import sys
from typing import Any

import typer

from .. import (
    INT64,
    DistributedBarrier,
    DistributedMutex,
    DistributedWorkQueue,
    Elected,
    EtcdClient,
    LeaderObserver,
    get_participants,
)
from ..errors import CodecError, InvalidArgumentError, LockLostError, LockTimeoutError
from ..locks.inspection import mutex_state
from ..queues.inspection import detect_queue_kind, in_flight, peek_queue, queue_stats
from ._app import CommandError, Exit, app, confirm, emit, run

lock_app = typer.Typer(help="Mutexes (also etcdctl lock and Go's concurrency.Mutex).")
election_app = typer.Typer(help="Leader elections.")
counter_app = typer.Typer(help="Atomic counters (DistributedAtomicLong).")
barrier_app = typer.Typer(help="Gate barriers (DistributedBarrier).")
dlq_app = typer.Typer(help="A work queue's dead letters.")
app.add_typer(lock_app, name="lock")
app.add_typer(election_app, name="election")
app.add_typer(counter_app, name="counter")
app.add_typer(barrier_app, name="barrier")
app.add_typer(dlq_app, name="dlq")


def _path(path: str) -> str:
    if not path.startswith("/"):
        raise CommandError(f"a recipe path starts with '/', got {path!r}", Exit.USAGE)
    return path.rstrip("/") or "/"


# ---------------------------------------------------------------------------------- locks


async def _contenders(client: EtcdClient, path: str) -> list[dict[str, Any]]:
    """The lock's keys in arrival order, the holder first: only keys in the lock layout
    (``<path>/<lease hex>`` on that lease). Exit 3 when there is none; exit 4, before anything
    is written, when ``<path>/`` also holds other keys (a plain key, another recipe's)."""
    state = await mutex_state(client, path)
    if state.foreign:
        shown = ", ".join(p.key.decode("utf-8", "replace") for p in state.foreign[:3])
        more = f" and {len(state.foreign) - 3} more" if len(state.foreign) > 3 else ""
        raise CommandError(
            f"{path} is not a lock: {path.rstrip('/')}/ holds {len(state.foreign)} key(s) outside "
            f"the lock layout (<path>/<lease hex> on that lease): {shown}{more}",
            Exit.REFUSED,
        )
    out = []
    for entry in ([state.holder] if state.holder else []) + state.waiters:
        ttl = (await client.lease_time_to_live(entry.lease_id)).ttl
        out.append(
            {
                "key": entry.key.decode("utf-8", errors="replace"),
                "role": "holder" if entry.is_holder else "waiter",
                "fencing_token": entry.create_revision,
                "lease": f"{entry.lease_id:x}",
                "ttl_left": ttl,
                "value": entry.value.decode("utf-8", errors="replace"),
            }
        )
    return out


@lock_app.command("show")
def lock_show(ctx: typer.Context, path: str) -> None:
    """The holder and the waiters in order, with fencing token and lease TTL left."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        entries = await _contenders(client, path)
        if not entries:
            raise CommandError(f"nobody holds or waits for the lock {path}", Exit.NOT_FOUND)
        emit(
            ctx,
            "lock show",
            {"path": path, "holder": entries[0], "waiters": entries[1:]},
            columns=("role", "key", "fencing token", "lease", "ttl left"),
            rows=[
                (e["role"], e["key"], e["fencing_token"], e["lease"], e["ttl_left"])
                for e in entries
            ],
        )

    run(ctx, work)


@lock_app.command("ls")
def lock_ls(ctx: typer.Context, prefix: str) -> None:
    """The locks under PREFIX that have a holder: one row per lock.

    A lock is a path whose keys are all in the lock layout (``<path>/<lease hex>`` on that
    lease, as etcdctl, Go and this library write them); other recipes' paths are not listed.
    """
    prefix = _path(prefix)

    async def work(client: EtcdClient) -> None:
        read = await client.get_prefix(prefix.rstrip("/") + "/", keys_only=True)
        keys = [kv.key_text for kv in read.kvs]  # sorted by key, as etcd returns them
        locks: dict[str, list[int]] = {}
        for kv in read.kvs:
            parent, _, name = kv.key_text.rpartition("/")
            if kv.lease and name == f"{kv.lease:x}":
                locks.setdefault(parent, []).append(kv.create_revision)
        rows = []
        for path, revs in sorted(locks.items()):
            under = bisect.bisect_left(keys, path + "0") - bisect.bisect_left(keys, path + "/")
            if under == len(revs):  # nothing else under path/: a lock, not another recipe's
                rows.append({"path": path, "contenders": len(revs), "fencing_token": min(revs)})
        emit(
            ctx,
            "lock ls",
            {"prefix": prefix, "locks": rows},
            columns=("path", "contenders", "holder's token"),
            rows=[(r["path"], r["contenders"], r["fencing_token"]) for r in rows],
        )

    run(ctx, work)


@lock_app.command("run")
def lock_run(
    ctx: typer.Context,
    path: str,
    command: list[str] = typer.Argument(..., help="The command to run holding the lock."),
    ttl: int = typer.Option(2, help="The lock's lease TTL, seconds."),
    timeout: float | None = typer.Option(None, help="Give up acquiring after this many seconds."),
    grace: float = typer.Option(5.0, help="Seconds between SIGTERM and SIGKILL on a loss."),
) -> None:
    """Run COMMAND holding the lock; kill it if the lock is lost (SIGTERM, then SIGKILL).

    COMMAND gets ETCD_RECIPES_FENCING_TOKEN and ETCD_RECIPES_LOCK_KEY in its environment.
    The exit code is COMMAND's (1 if the lock was lost, 4 on --timeout).
    """
    path = _path(path)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CommandError("give the command to run after --", Exit.USAGE)

    async def work(client: EtcdClient) -> int:
        mutex = DistributedMutex(client, path, lease_ttl=ttl)
        try:
            async with mutex.with_lock(timeout) as hold:
                env = dict(os.environ)
                env["ETCD_RECIPES_FENCING_TOKEN"] = str(hold.fencing_token)
                env["ETCD_RECIPES_LOCK_KEY"] = hold.key.decode("utf-8", "replace")
                try:
                    child = await asyncio.create_subprocess_exec(*command, env=env)
                except OSError as exc:
                    raise CommandError(f"cannot run {command[0]!r}: {exc.strerror}") from None
                try:
                    return await child.wait()
                except asyncio.CancelledError:
                    await asyncio.shield(_terminate(child, grace))
                    raise
        except LockTimeoutError as exc:
            raise CommandError(f"not acquired: {exc}", Exit.REFUSED) from None
        except LockLostError as exc:
            raise CommandError(f"lock lost, command stopped: {exc}") from None
        finally:
            await mutex.aclose()

    code = run(ctx, work)
    raise typer.Exit(code)


async def _terminate(child: asyncio.subprocess.Process, grace: float) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(child.wait(), grace)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


@lock_app.command("break")
def lock_break(
    ctx: typer.Context,
    path: str,
    yes: bool = typer.Option(False, "--yes", help="Do it."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; change nothing."),
) -> None:
    """Revoke the holder's lease: its key goes, and so does every other key on that lease
    (listed first); the next waiter gets the lock.

    Only a key in the lock layout (PATH/<lease hex> on that lease) is a holder. A PATH that
    also holds other keys is refused (exit 4) and nothing is written; no key is ever deleted.
    """
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        entries = await _contenders(client, path)
        if not entries:
            raise CommandError(f"nobody holds the lock {path}", Exit.NOT_FOUND)
        holder = entries[0]
        lease = int(holder["lease"], 16)
        info = await client.lease_time_to_live(lease, keys=True)
        lease_keys = sorted(k.decode("utf-8", "replace") for k in info.keys)
        others = [k for k in lease_keys if k != holder["key"]]
        also = f"; its lease also carries {', '.join(others)}" if others else ""
        if dry_run:
            what = f"would revoke lease {holder['lease']} of holder {holder['key']}{also}"
        else:
            confirm(yes, f"breaking {path} (holder {holder['key']}{also})")
            await client.lease_revoke(lease)
            what = f"revoked lease {holder['lease']} of holder {holder['key']}{also}"
        emit(
            ctx,
            "lock break",
            {
                "path": path,
                "holder": holder,
                "lease_keys": lease_keys,
                "dry_run": dry_run,
                "action": what,
            },
            lines=[what],
        )

    run(ctx, work)


# ------------------------------------------------------------------------------- elections


@election_app.command("show")
def election_show(ctx: typer.Context, path: str) -> None:
    """The leader (with its fencing token) and the candidates in the order they joined."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        participants = await get_participants(client, path)
        async with LeaderObserver(client, path) as observer:
            current = observer.current
        leader = current.leader if isinstance(current, Elected) else None
        token = current.fencing_token if isinstance(current, Elected) else None
        if leader is None and not participants:
            raise CommandError(f"no election at {path}", Exit.NOT_FOUND)
        emit(
            ctx,
            "election show",
            {
                "path": path,
                "leader": leader,
                "fencing_token": token,
                "participants": [
                    {"client_id": p.client_id, "is_leader": p.is_leader} for p in participants
                ],
            },
            lines=[
                f"leader: {leader or '(none)'}" + (f" (fencing token {token})" if token else "")
            ],
            columns=("candidate", "leader"),
            rows=[(p.client_id, "yes" if p.is_leader else "") for p in participants],
        )

    run(ctx, work)


@election_app.command("observe")
def election_observe(
    ctx: typer.Context,
    path: str,
    count: int | None = typer.Option(None, help="Stop after this many changes."),
) -> None:
    """Print the leader now and every change, until Ctrl-C (or --count changes)."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        seen = 0
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
                seen += 1
                if count is not None and seen > count:
                    return

    run(ctx, work)


# --------------------------------------------------------------------- counters, barriers


@counter_app.command("get")
def counter_get(ctx: typer.Context, path: str) -> None:
    """The counter's value (read only: a missing counter is not created)."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        kv = await client.get(path)
        if kv is None:
            raise CommandError(f"no counter at {path}", Exit.NOT_FOUND)
        try:
            value = INT64.decode(kv.value)
        except CodecError as exc:
            raise CommandError(f"{path} is not a counter: {exc}", Exit.REFUSED) from None
        emit(ctx, "counter get", {"path": path, "value": value}, lines=[str(value)])

    run(ctx, work)


@counter_app.command("set")
def counter_set(ctx: typer.Context, path: str, value: int) -> None:
    """Set the counter to VALUE (int64)."""
    path = _path(path)
    if not INT64.MIN <= value <= INT64.MAX:
        raise CommandError(f"{value} is outside the int64 range", Exit.USAGE)

    async def work(client: EtcdClient) -> None:
        await client.put(path, INT64.encode(value))
        emit(ctx, "counter set", {"path": path, "value": value}, lines=[str(value)])

    run(ctx, work)


@barrier_app.command("status")
def barrier_status(ctx: typer.Context, path: str) -> None:
    """Whether the barrier is set (waiters block) or lifted."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        barrier = DistributedBarrier(client, path)
        try:
            is_set = await barrier.is_barrier_set()
        finally:
            await barrier.aclose()
        emit(
            ctx,
            "barrier status",
            {"path": path, "set": is_set},
            lines=["set" if is_set else "lifted"],
        )

    run(ctx, work)


# ------------------------------------------------------------------------------ dead letters


@dlq_app.command("ls")
def dlq_ls(ctx: typer.Context, path: str) -> None:
    """The work queue's dead letters, oldest first: id, attempts, size and failure reason
    (a FIFO or priority queue's path is refused, exit 4: only work queues have dead letters)."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        await work_queue_only(client, path)
        queue = DistributedWorkQueue(client, path)
        try:
            dead = await queue.dead_letters()
        finally:
            await queue.aclose()
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


async def _queued(client: EtcdClient, path: str, ids: list[str]) -> set[str]:
    """Which of ``ids`` are back in the work queue: ready or delayed (what ``queue peek``
    lists), or already taken again by a consumer (in flight)."""
    found = await in_flight(client, path, ids)
    stats = await queue_stats(client, path, kind="work")
    waiting = 0 if stats is None else stats.ready + stats.delayed
    if waiting:
        found |= {e.id for e in await peek_queue(client, path, waiting, kind="work")}
    return found & set(ids)


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
            queued = await _queued(client, path, absent) if absent else set()
            # A requeued item is no longer dead but waits in the queue again: asking for it
            # twice is the same request, answered "already requeued" with nothing written.
            already = [i for i in absent if i in queued] if verb == "requeue" else []
            missing = [i for i in absent if i not in already]
            if missing:
                hint = ""
                if verb == "purge" and any(i in queued for i in missing):
                    hint = " (it is queued, not dead: purge deletes dead letters only)"
                raise CommandError(
                    f"no dead letter {', '.join(missing)} in {path}{hint}", Exit.NOT_FOUND
                )
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
                queued = await _queued(client, path, gone)
                if verb == "requeue":
                    already += [i for i in gone if i in queued]
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


@dlq_app.command("requeue")
def dlq_requeue(
    ctx: typer.Context,
    path: str,
    ids: list[str] = typer.Option([], "--id", help="A dead letter's id (repeatable)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; write nothing."),
    yes: bool = typer.Option(False, "--yes", help="Do it."),
) -> None:
    """Put dead letters back in the queue at their original place, with fresh attempts.

    Idempotent: an --id already requeued (no longer dead: waiting in the queue, or received
    again and in flight) is reported "already requeued" and nothing is written (exit 0); an
    id found nowhere (never dead, or requeued and since acknowledged) exits 3.
    Only work queues have dead letters: a FIFO or priority queue's path is refused (exit 4).
    """
    _dlq_change(ctx, path, ids, all_, dry_run, yes, "requeue")


@dlq_app.command("purge")
def dlq_purge(
    ctx: typer.Context,
    path: str,
    ids: list[str] = typer.Option([], "--id", help="A dead letter's id (repeatable)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; write nothing."),
    yes: bool = typer.Option(False, "--yes", help="Do it."),
) -> None:
    """Delete dead letters for good.

    A purged dead letter leaves nothing behind, so purging it again cannot be told from an id
    that never existed: both exit 3 (not found). An id waiting in the queue exits 3 too, saying
    it is queued, not dead. A FIFO or priority queue's path is refused (exit 4).
    """
    _dlq_change(ctx, path, ids, all_, dry_run, yes, "purge")


# ------------------------------------------------------------------------------------ watch


@app.command()
def watch(
    ctx: typer.Context,
    prefix: str,
    count: int | None = typer.Option(None, help="Stop after this many events."),
) -> None:
    """Print every change under PREFIX, with the watch's recoveries inline, until Ctrl-C."""
    prefix = _path(prefix)

    async def work(client: EtcdClient) -> None:
        seen = 0

        async def resync() -> int:
            # History was compacted while the watch was away: continue from now (the
            # Resynced line says so) rather than failing.
            return (await client.get_prefix(prefix, count_only=True)).revision + 1

        async with client.watch(prefix, prefix=True, resync=resync) as stream:
            async for item in stream.items():
                if await _print_watch_item(ctx, item):
                    seen += 1
                if count is not None and seen >= count:
                    return

    run(ctx, work)


async def _print_watch_item(ctx: typer.Context, item: Any) -> bool:
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
