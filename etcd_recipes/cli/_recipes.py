"""``election resign``, ``discovery ls/show`` and ``cache dump``, through the families' own
code (:mod:`etcd_recipes.election.inspection`, ``ServiceDiscovery``, ``PrefixCache``).

Guaranteed: ``election resign`` ends only the term it read (its lease is revoked; without
``--yes`` it refuses and writes nothing); the others only read, and exit 3 when they find
nothing (no service, no key under the cache's PREFIX, which is used exactly as given).
Not guaranteed: what is printed is stale once printed; a resigned LeaderLatch contests again.
"""

from __future__ import annotations

import base64
from typing import Any

import typer

from .. import EtcdClient, PrefixCache, ServiceDiscovery
from ..election.inspection import leader_record, resign_leader
from ._app import CommandError, Exit, app, confirm, emit, run
from ._commands import PATH, PREFIX, _path, _prefix, election_app


@election_app.command("resign")
def election_resign_cmd(
    ctx: typer.Context, path: str = PATH, yes: bool = typer.Option(False, "--yes", help="Do it.")
) -> None:
    """End the current leader's term (revoke its lease); it steps down."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        record = await leader_record(client, path)
        if record is None:
            raise CommandError(f"nobody leads the election {path}", Exit.NOT_FOUND)
        confirm(yes, f"resigning {record.client_id} from {path}")
        ended = await resign_leader(client, path, fencing_token=record.fencing_token)
        if ended is None:
            raise CommandError(f"the term of {record.client_id} ended meanwhile", Exit.NOT_FOUND)
        how = f"revoked lease {ended.lease_id:x}" if ended.lease_id else f"deleted {ended.key}"
        what = f"{how}: {ended.client_id} (fencing token {ended.fencing_token}) resigned"
        emit(
            ctx,
            "election resign",
            {
                "path": path,
                "leader": ended.client_id,
                "fencing_token": ended.fencing_token,
                "action": what,
            },
            lines=[what],
        )

    run(ctx, work)


# ------------------------------------------------------------------ discovery, caches

discovery_app = typer.Typer(help="Service discovery registrations (ServiceDiscovery).")
cache_app = typer.Typer(help="What a PrefixCache would hold.")
app.add_typer(discovery_app, name="discovery")
app.add_typer(cache_app, name="cache")


_PROBE = "/probe"


def _names_suffix(client: EtcdClient) -> str:
    """What the discovery layout puts between a base and a service name (``"/names"``), read
    from the recipe's own ``names_path`` rather than restated here."""
    return ServiceDiscovery(client, _PROBE).registry.names_path.removeprefix(_PROBE)


async def _discovery_bases(client: EtcdClient) -> list[str]:
    """Every base under the namespace root holding a key ``<base><suffix>/<name>/<id>`` (one
    keys-only read of every key under ``/``). Candidates only: records are parsed later."""
    suffix = _names_suffix(client)
    read = await client.get_prefix("/", keys_only=True)
    bases = set()
    for kv in read.kvs:
        parent, _, instance_id = kv.key_text.rpartition("/")
        names, _, name = parent.rpartition("/")
        base = names.removesuffix(suffix)
        if instance_id and name and names.endswith(suffix) and base.startswith("/"):
            bases.add(base)
    return sorted(bases)


async def _services(client: EtcdClient, base: str) -> tuple[list[dict[str, Any]], int]:
    """The services under ``base`` with at least one well-formed instance, and how many
    records were skipped because they do not parse as a ServiceInstance."""
    skipped: list[BaseException] = []
    async with ServiceDiscovery(client, base) as discovery:
        discovery.add_exception_listener(lambda _context, exc: skipped.append(exc))
        rows = []
        for name in await discovery.query_for_names():
            count = len(await discovery.query_for_instances(name))
            if count:
                rows.append({"base": base, "name": name, "instances": count})
    return rows, len(skipped)


@discovery_app.command("ls")
def discovery_ls(
    ctx: typer.Context,
    base: str | None = typer.Argument(
        None,
        metavar="[BASE]",
        help="The ServiceDiscovery path; omitted: every base under the namespace root.",
    ),
) -> None:
    """The services registered under BASE, with their instance counts.

    Without BASE, every base the discovery key layout (<base>/names/<name>/<id>) finds
    under the namespace root: one keys-only read of every key there (on a large keyspace,
    give BASE), then each candidate's records are read and parsed as ServiceInstance JSON, so
    another recipe's keys that happen to fit the layout are not listed. Records that do not
    parse are skipped and counted (skipped). Exit 3 when no service is found.
    """
    given = None if base is None else _path(base)

    async def work(client: EtcdClient) -> None:
        bases = [given] if given is not None else await _discovery_bases(client)
        rows: list[dict[str, Any]] = []
        skipped = 0
        for one in bases:
            found, bad = await _services(client, one)
            rows += found
            skipped += bad
        if not rows:
            where = f"under {given}" if given else "under the namespace root"
            extra = f" ({skipped} record(s) that are not ServiceInstance JSON)" if skipped else ""
            raise CommandError(f"no service registered {where}{extra}", Exit.NOT_FOUND)
        emit(
            ctx,
            "discovery ls",
            {"base": given or "/", "services": rows, "skipped": skipped},
            lines=[f"skipped {skipped} record(s) that are not ServiceInstance JSON"]
            if skipped
            else [],
            columns=("service", "instances") if given else ("base", "service", "instances"),
            rows=[
                (r["name"], r["instances"]) if given else (r["base"], r["name"], r["instances"])
                for r in rows
            ],
        )

    run(ctx, work)


@discovery_app.command("show")
def discovery_show(
    ctx: typer.Context,
    base: str = typer.Argument(..., metavar="BASE", help="The ServiceDiscovery path."),
    name: str = typer.Argument(..., metavar="NAME", help="The service's name."),
) -> None:
    """The instances of service NAME under BASE: id, address, port, payload."""
    base = _path(base)

    async def work(client: EtcdClient) -> None:
        skipped: list[BaseException] = []
        async with ServiceDiscovery(client, base) as discovery:
            discovery.add_exception_listener(lambda _context, exc: skipped.append(exc))
            found = await discovery.query_for_instances(name)
        if not found:
            why = (
                f" ({len(skipped)} record(s) that are not ServiceInstance JSON)" if skipped else ""
            )
            raise CommandError(f"no instances of {name} under {base}{why}", Exit.NOT_FOUND)
        rows = [
            {
                "id": i.id,
                "address": i.address,
                "port": i.port,
                "ssl_port": i.ssl_port,
                "uri": i.uri,
                "enabled": i.enabled,
                "payload": i.payload_text(),
            }
            for i in found
        ]
        emit(
            ctx,
            "discovery show",
            {"base": base, "name": name, "instances": rows},
            columns=("id", "address", "port", "enabled", "payload"),
            rows=[(r["id"], r["address"], r["port"], r["enabled"], r["payload"]) for r in rows],
        )

    run(ctx, work)


@cache_app.command("dump")
def cache_dump(
    ctx: typer.Context,
    prefix: str = PREFIX,
    timeout: float = typer.Option(10.0, help="Seconds to wait for the snapshot."),
) -> None:
    """The keys and values (UTF-8, or base64) a PrefixCache on PREFIX holds, at one revision;
    exit 3 when PREFIX holds no key."""
    prefix = _prefix(prefix)

    async def work(client: EtcdClient) -> None:
        async with PrefixCache(client, prefix, start_timeout=timeout) as cache:
            entries = cache.entries()
            revision = cache.revision
        if not entries:
            raise CommandError(f"no key under {prefix}", Exit.NOT_FOUND)
        rows = []
        for e in entries:
            raw = e.value if isinstance(e.value, bytes) else b""
            try:
                value, encoding = raw.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                value, encoding = base64.b64encode(raw).decode(), "base64"
            rows.append(
                {
                    "key": e.key,
                    "value": value,
                    "encoding": encoding,
                    "mod_revision": e.mod_revision,
                    "version": e.version,
                    "lease": f"{e.lease:x}" if e.lease else None,
                }
            )
        emit(
            ctx,
            "cache dump",
            {"prefix": prefix, "revision": revision, "entries": rows},
            columns=("key", "value", "mod rev", "lease"),
            rows=[(r["key"], r["value"], r["mod_revision"], r["lease"]) for r in rows],
        )

    run(ctx, work)
