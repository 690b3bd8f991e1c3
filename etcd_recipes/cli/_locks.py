"""``lock show``, ``lock ls``, ``lock run`` and ``lock break``, through the locks family's own
inspection code (:mod:`etcd_recipes.locks.inspection`).

Guaranteed: only keys in the lock layout (``<path>/<lease hex>`` on that lease) are a lock's
contenders; ``lock break`` revokes the holder's lease and never deletes a key, and refuses
(exit 4, nothing written) a path holding anything else. ``lock run`` starts its command in a
process group of its own and, when the lock is lost (or on Ctrl-C, SIGTERM), signals that
whole group: SIGTERM, then SIGKILL to whatever is left after ``--grace``.

Not guaranteed: a process the command leaves behind when it exits on its own keeps running
after the lock is released; a process that leaves the group (``setsid``) is not signalled.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import signal
from typing import Any

import typer

from .. import DistributedMutex, EtcdClient
from ..errors import LockLostError, LockTimeoutError
from ..locks.inspection import mutex_state
from ._app import CommandError, Exit, confirm, emit, run
from ._commands import PATH, PREFIX, _path, _prefix, lock_app

NOT_FOUND_EXIT = 127
"""``lock run``'s exit code when the command does not exist (the shell's convention)."""
NOT_EXECUTABLE_EXIT = 126
"""``lock run``'s exit code when the command exists but cannot be executed."""


async def _contenders(client: EtcdClient, path: str) -> list[dict[str, Any]]:
    """The lock's keys in arrival order, the holder first: only keys in the lock layout
    (``<path>/<lease hex>`` on that lease). Exit 4, before anything is written, when
    ``<path>/`` also holds other keys (a plain key, another recipe's)."""
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
def lock_show(ctx: typer.Context, path: str = PATH) -> None:
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
def lock_ls(ctx: typer.Context, prefix: str = PREFIX) -> None:
    """The locks whose keys are under PREFIX: one row per lock; exit 3 when there is none.

    A lock is a path whose keys are all in the lock layout (PATH/<lease hex> on that lease,
    as etcdctl, Go and this library write them); other recipes' paths are not listed.
    """
    prefix = _prefix(prefix)

    async def work(client: EtcdClient) -> None:
        read = await client.get_prefix(prefix, keys_only=True)
        keys = [kv.key_text for kv in read.kvs]  # sorted by key, as etcd returns them
        locks: dict[str, list[int]] = {}
        for kv in read.kvs:
            parent, _, name = kv.key_text.rpartition("/")
            if kv.lease and name == f"{kv.lease:x}":
                locks.setdefault(parent, []).append(kv.create_revision)
        rows = []
        for path, revs in sorted(locks.items()):
            if (path + "/").startswith(prefix):  # every key under path/ was read
                under = bisect.bisect_left(keys, path + "0") - bisect.bisect_left(keys, path + "/")
            else:  # PREFIX cuts through path/: count what lies there
                under = await client.count(path + "/")
            if under == len(revs):  # nothing else under path/: a lock, not another recipe's
                rows.append({"path": path, "contenders": len(revs), "fencing_token": min(revs)})
        if not rows:
            raise CommandError(f"no lock under {prefix}", Exit.NOT_FOUND)
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
    path: str = PATH,
    command: list[str] = typer.Argument(
        ..., metavar="-- COMMAND...", help="The command to run holding the lock (after --)."
    ),
    ttl: int = typer.Option(2, help="The lock's lease TTL, seconds."),
    timeout: float | None = typer.Option(None, help="Give up acquiring after this many seconds."),
    grace: float = typer.Option(5.0, help="Seconds between SIGTERM and SIGKILL on a loss."),
) -> None:
    """Run COMMAND holding the lock; stop it if the lock is lost.

    COMMAND runs in a process group of its own and gets ETCD_RECIPES_FENCING_TOKEN and
    ETCD_RECIPES_LOCK_KEY in its environment. On a loss (and on Ctrl-C or SIGTERM) the
    whole group gets SIGTERM, then SIGKILL after --grace seconds. The exit code is
    COMMAND's; 1 if the lock was lost, 4 on --timeout, 127 if COMMAND is not found, 126 if
    it is not executable, 130 on Ctrl-C, 143 on SIGTERM.
    """
    path = _path(path)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CommandError("give the command to run after --", Exit.USAGE)

    async def work(client: EtcdClient) -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        terminated = False

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        mutex = DistributedMutex(client, path, lease_ttl=ttl)
        try:
            async with mutex.with_lock(timeout) as hold:
                env = dict(os.environ)
                env["ETCD_RECIPES_FENCING_TOKEN"] = str(hold.fencing_token)
                env["ETCD_RECIPES_LOCK_KEY"] = hold.key.decode("utf-8", "replace")
                child = await _spawn(command, env)
                try:
                    return await child.wait()
                except asyncio.CancelledError:
                    await asyncio.shield(_terminate(child, grace))
                    raise
        except LockTimeoutError as exc:
            raise CommandError(f"not acquired: {exc}", Exit.REFUSED) from None
        except LockLostError as exc:
            raise CommandError(f"lock lost, command stopped: {exc}") from None
        except asyncio.CancelledError:
            if terminated:
                return 128 + signal.SIGTERM
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            await mutex.aclose()

    code = run(ctx, work)
    raise typer.Exit(code)


async def _spawn(command: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start ``command`` as the leader of a new session, so of a process group of its own (a
    terminal's Ctrl-C reaches this command, which stops the group); exit 127 or 126 if it
    cannot start."""
    try:
        return await asyncio.create_subprocess_exec(*command, env=env, start_new_session=True)
    except FileNotFoundError:
        raise CommandError(f"{command[0]}: command not found", NOT_FOUND_EXIT) from None
    except PermissionError:
        raise CommandError(f"{command[0]}: permission denied", NOT_EXECUTABLE_EXIT) from None
    except OSError as exc:
        raise CommandError(
            f"cannot run {command[0]!r}: {exc.strerror}", NOT_EXECUTABLE_EXIT
        ) from None


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group; False when the group has no process left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member changed its uid: not ours any more
        return True
    return True


async def _terminate(child: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the command's process group; SIGKILL whatever is left of it after ``grace``
    seconds (the child, and the processes it started and left in the group)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    if not _signal_group(child.pid, signal.SIGTERM):
        await child.wait()
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(child.wait(), grace)
    # Nothing signals that a process group emptied (its members are not our children): poll.
    while loop.time() < deadline and _signal_group(child.pid, 0):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    _signal_group(child.pid, signal.SIGKILL)
    await child.wait()


@lock_app.command("break")
def lock_break(
    ctx: typer.Context,
    path: str = PATH,
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
