"""``counter get``, ``counter set`` and ``barrier status``.

Guaranteed: ``counter get`` and ``barrier status`` only read (a missing counter is not
created); ``counter set`` takes any int64, negative ones too (``counter set /x -5``). Nothing
there exits 3: no counter at the path, no barrier set at the path (a lifted barrier leaves no
key, so it cannot be told from a path that never had one -- a typo -- and is not called
"lifted").
"""

from __future__ import annotations

import typer

from .. import INT64, DistributedBarrier, EtcdClient
from ..errors import CodecError
from ._app import CommandError, Exit, emit, run
from ._commands import PATH, _path, barrier_app, counter_app


@counter_app.command("get")
def counter_get(ctx: typer.Context, path: str = PATH) -> None:
    """The counter's value (read only: a missing counter is not created; exit 3)."""
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


@counter_app.command("set", context_settings={"ignore_unknown_options": True})
def counter_set(
    ctx: typer.Context,
    path: str = PATH,
    value: int = typer.Argument(..., metavar="VALUE", help="An int64, negative ones too."),
) -> None:
    """Set the counter to VALUE (int64; counter set /x -5 works as it reads)."""
    path = _path(path)
    if not INT64.MIN <= value <= INT64.MAX:
        raise CommandError(f"{value} is outside the int64 range", Exit.USAGE)

    async def work(client: EtcdClient) -> None:
        await client.put(path, INT64.encode(value))
        emit(ctx, "counter set", {"path": path, "value": value}, lines=[str(value)])

    run(ctx, work)


@barrier_app.command("status")
def barrier_status(ctx: typer.Context, path: str = PATH) -> None:
    """Whether the barrier is set (waiters block). Not set exits 3: a lifted barrier leaves
    no key, as a path that never had a barrier."""
    path = _path(path)

    async def work(client: EtcdClient) -> None:
        barrier = DistributedBarrier(client, path)
        try:
            is_set = await barrier.is_barrier_set()
        finally:
            await barrier.aclose()
        if not is_set:
            raise CommandError(
                f"no barrier set at {path} (etcd holds no key there: never set, or removed)",
                Exit.NOT_FOUND,
            )
        emit(ctx, "barrier status", {"path": path, "set": True}, lines=["set"])

    run(ctx, work)
