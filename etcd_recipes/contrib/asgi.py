"""Run-once-across-workers for ASGI apps: a lifespan, leader-only jobs, per-tick schedules and
a mutex dependency (extra ``asgi``: Starlette; FastAPI and Litestar work through the same
lifespan).

``uvicorn --workers 4`` (or gunicorn with uvicorn workers) runs every startup hook and every
repeat task once per worker. With this module:

* :func:`etcd_lifespan` connects **inside** each worker (after the fork), gives the client to
  the app as lifespan state (``request.state.etcd``, also ``app.state.etcd``), runs the
  background jobs given to it, and on shutdown stops them at once: a leader steps down before
  the worker exits, so another worker takes over without waiting for a lease to expire.
* :func:`leader_only` runs a job only in the worker that leads an election, **cancels it when
  leadership is lost**, and campaigns again; the job gets the term (its ``fencing_token`` and
  ``compare()`` fence writes).
* :func:`singleton_schedule` runs a job once per tick across all workers: each tick is a slot,
  ``floor(time / every)``, and the worker whose create-if-absent of ``<path>/ticks/<slot>``
  succeeds runs it. The slot key lives on a lease of at least two intervals, so a slower
  worker cannot win a slot that a fast run already finished, and no in-progress TTL blocks
  the next tick.
* :func:`mutex_dependency` is a FastAPI ``Depends(...)`` dependency that holds a
  :class:`~etcd_recipes.DistributedMutex` for the request, answering 423 on timeout.
* :func:`health_routes` are liveness and readiness endpoints answering from the client's
  :meth:`~etcd_recipes.EtcdClient.is_live` and :meth:`~etcd_recipes.EtcdClient.check`.

Guarantees: a leader-only job runs in at most one worker at a time *as far as etcd can tell*
(it is cancelled when the term is lost; a worker paused past its TTL may still run until it
notices — fence writes with ``term.compare()``); each schedule slot is won by at most one
worker. Not guaranteed: that a slot's job ran to completion (a worker that wins a slot and
crashes does not hand it over: at most once per slot), or that every slot runs when every
worker is down or slower than the interval. Slots come from each worker's wall clock: keep
clock skew between workers below ``max_clock_skew`` (default 2 s), or a worker whose clock is
behind can win a slot whose key has already expired.

Example::

    from starlette.applications import Starlette
    from etcd_recipes.contrib.asgi import etcd_lifespan, leader_only, singleton_schedule

    async def refresh(client, term):
        print("leading with token", term.fencing_token)

    async def report(client, slot):
        print("slot", slot)

    app = Starlette(
        lifespan=etcd_lifespan(
            leader_only(refresh, election=f"{prefix}/app/leader"),
            singleton_schedule(report, every=60, path=f"{prefix}/app/report"),
            endpoints=endpoints,
        )
    )
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

try:
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "etcd_recipes.contrib.asgi needs Starlette: pip install 'etcd-recipes[asgi]'"
    ) from exc

from .. import (
    Cmp,
    DistributedMutex,
    EtcdClient,
    InvalidArgumentError,
    LeaderSelector,
    LeadershipLostError,
    LeadershipTerm,
    LockHold,
    Op,
)
from .. import connect as _connect

__all__ = [
    "BackgroundJob",
    "etcd_lifespan",
    "health_routes",
    "leader_only",
    "mutex_dependency",
    "singleton_schedule",
]

log = logging.getLogger("etcd_recipes.contrib.asgi")

_RETRY_DELAY = 1.0


class BackgroundJob(Protocol):
    """Something :func:`etcd_lifespan` runs for the life of a worker: :func:`leader_only` and
    :func:`singleton_schedule` return one. ``run`` runs until cancelled."""

    name: str

    async def run(self, client: EtcdClient) -> None: ...


class _LeaderOnly:
    def __init__(
        self,
        fn: Callable[[EtcdClient, LeadershipTerm], Awaitable[None]],
        election: str,
        lease_ttl: float,
        name: str,
    ) -> None:
        self.fn = fn
        self.election = election
        self.lease_ttl = lease_ttl
        self.name = name
        self.terms = 0
        """How many terms this worker has led (for health pages and tests)."""

    def __repr__(self) -> str:
        return f"<leader_only {self.name} election={self.election!r} terms={self.terms}>"

    async def run(self, client: EtcdClient) -> None:
        async def take_leadership(term: LeadershipTerm) -> None:
            self.terms += 1
            log.info("%s: leading (fencing token %s)", self.name, term.fencing_token)
            await self.fn(client, term)

        selector = LeaderSelector(client, self.election, take_leadership, lease_ttl=self.lease_ttl)
        async with selector:
            while True:
                try:
                    await selector.run()
                except LeadershipLostError:
                    log.warning("%s: leadership lost; the job was cancelled", self.name)
                except Exception:
                    log.exception("%s: the job failed; campaigning again", self.name)
                    await asyncio.sleep(_RETRY_DELAY)


def leader_only(
    fn: Callable[[EtcdClient, LeadershipTerm], Awaitable[None]],
    *,
    election: str,
    lease_ttl: float = 2,
    name: str | None = None,
) -> BackgroundJob:
    """A job that runs ``await fn(client, term)`` only while this worker leads ``election``.

    The job is cancelled when the term is lost (lease expired, LEADER key deleted) and when the
    worker shuts down (stepping down at once). When it returns, raises or is lost, the worker
    campaigns again. ``term.fencing_token`` grows with every term; put ``term.compare()`` in
    transactions that must not commit after the term ended.

    Example::

        from etcd_recipes.contrib.asgi import leader_only

        async def refresh(client, term):
            await client.put(f"{prefix}/owner", str(term.fencing_token))

        job = leader_only(refresh, election=f"{prefix}/leader")
        print(job.name)  # refresh
    """
    if not callable(fn):
        raise InvalidArgumentError("leader_only: fn must be an async function (client, term)")
    return _LeaderOnly(fn, election, lease_ttl, name or str(getattr(fn, "__name__", "job")))


class _Schedule:
    def __init__(
        self,
        fn: Callable[[EtcdClient, int], Awaitable[None]],
        every: float,
        path: str,
        max_clock_skew: float,
        name: str,
    ) -> None:
        self.fn = fn
        self.every = every
        self.path = path.rstrip("/")
        self.ttl = max(1, math.ceil(2 * every + max_clock_skew))
        self.name = name
        self.won = 0
        """How many slots this worker has won (for health pages and tests)."""

    def __repr__(self) -> str:
        return f"<singleton_schedule {self.name} every={self.every}s won={self.won}>"

    async def _claim(self, client: EtcdClient, slot: int) -> bool:
        key = f"{self.path}/ticks/{slot}"
        grant = await client.lease_grant(self.ttl)
        try:
            won = await client.txn([Cmp.missing(key)], [Op.put(key, b"", lease=grant.id)])
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(client.lease_revoke(grant.id))
            raise
        if not won.succeeded:
            with contextlib.suppress(Exception):
                await client.lease_revoke(grant.id)
        return won.succeeded

    async def run(self, client: EtcdClient) -> None:
        slot = math.floor(time.time() / self.every)
        while True:
            slot += 1
            await asyncio.sleep(max(0.0, slot * self.every - time.time()))
            # A worker that fell behind (a busy loop, a slow run of its own) still tries the
            # slots it missed while their keys would still exist (two intervals): the
            # create-if-absent tells whether another worker ran them. Older ones are gone.
            now_slot = math.floor(time.time() / self.every)
            if now_slot - slot > 2:
                log.warning("%s: skipped slots %s..%s (late)", self.name, slot, now_slot - 3)
                slot = now_slot - 2
            for candidate in range(slot, now_slot + 1):
                await self._tick(client, candidate)
            slot = max(slot, now_slot)

    async def _tick(self, client: EtcdClient, slot: int) -> None:
        try:
            if not await self._claim(client, slot):
                return
        except Exception:
            log.exception("%s: could not claim slot %s", self.name, slot)
            return
        self.won += 1
        try:
            await self.fn(client, slot)
        except Exception:
            log.exception("%s: the job of slot %s failed", self.name, slot)


def singleton_schedule(
    fn: Callable[[EtcdClient, int], Awaitable[None]],
    *,
    every: float,
    path: str,
    max_clock_skew: float = 2.0,
    name: str | None = None,
) -> BackgroundJob:
    """A job that runs ``await fn(client, slot)`` once per ``every`` seconds across all workers.

    Each tick is the slot ``floor(time.time() / every)``; every worker tries to create
    ``<path>/ticks/<slot>`` (create-if-absent, on a lease of ``2 * every + max_clock_skew``
    seconds) and only the winner runs the job. A run longer than ``every`` does not block the
    next slot (another worker, or this one when the run ends, takes it). At most once per slot.

    Example::

        from etcd_recipes.contrib.asgi import singleton_schedule

        async def report(client, slot):
            print("report for slot", slot)

        job = singleton_schedule(report, every=60, path=f"{prefix}/report")
        print(job)  # <singleton_schedule report every=60s won=0>
    """
    if not callable(fn):
        raise InvalidArgumentError(
            "singleton_schedule: fn must be an async function (client, slot)"
        )
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
        raise InvalidArgumentError(
            f"singleton_schedule: every must be a positive number of seconds, got {every!r}"
        )
    if not math.isfinite(every):
        raise InvalidArgumentError(f"singleton_schedule: every must be finite, got {every!r}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidArgumentError(f"singleton_schedule: path must start with '/', got {path!r}")
    return _Schedule(
        fn, float(every), path, max_clock_skew, name or str(getattr(fn, "__name__", "job"))
    )


def etcd_lifespan(
    *jobs: BackgroundJob,
    endpoints: str | list[str] | None = None,
    state_key: str = "etcd",
    client_factory: Callable[[], AbstractAsyncContextManager[EtcdClient]] | None = None,
    **connect_kwargs: Any,
) -> Callable[[Any], AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan for Starlette / FastAPI (``lifespan=``) and Litestar (``lifespan=[...]``).

    On startup (in each worker, after the fork) it connects (``connect(endpoints,
    **connect_kwargs)``, or ``client_factory()``), publishes the client as lifespan state
    ``{state_key: client}`` (``request.state.etcd``) and as ``app.state.etcd`` when the app has
    a ``state``, and starts each job in its own task. On shutdown it cancels the jobs (a leader
    steps down at once), waits for their cleanup, then closes the client.

    Example::

        from starlette.applications import Starlette
        from etcd_recipes.contrib.asgi import etcd_lifespan

        app = Starlette(lifespan=etcd_lifespan(endpoints=endpoints))
    """

    def open_client() -> AbstractAsyncContextManager[EtcdClient]:
        if client_factory is not None:
            return client_factory()
        return _connect(endpoints, **connect_kwargs)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        async with open_client() as client:
            state = getattr(app, "state", None)
            if state is not None:
                setattr(state, state_key, client)
            tasks = [
                asyncio.create_task(_supervise(job, client), name=f"etcd-job:{job.name}")
                for job in jobs
            ]
            try:
                yield {state_key: client}
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    return lifespan


async def _supervise(job: BackgroundJob, client: EtcdClient) -> None:
    while True:
        try:
            await job.run(client)
            return
        except Exception:
            log.exception("%s: stopped with an error; restarting it", job.name)
            await asyncio.sleep(_RETRY_DELAY)


def mutex_dependency(
    path: str,
    *,
    timeout: float = 5.0,
    lease_ttl: float = 2,
    state_key: str = "etcd",
    status_code: int = 423,
) -> Callable[[Any], AsyncIterator[LockHold]]:
    """A FastAPI dependency (``Depends(mutex_dependency("/locks/report"))``) that holds a
    distributed mutex for the request and answers ``status_code`` (423 Locked) when it is not
    acquired within ``timeout``.

    The endpoint gets the :class:`~etcd_recipes.LockHold`; the lock is released when the
    response has been produced. A loss while the endpoint runs does **not** cancel it (FastAPI
    runs it outside the dependency): check ``hold.is_lost`` or fence writes with
    ``hold.guarded_txn(...)``. The client comes from :func:`etcd_lifespan`'s state.

    Example::

        from etcd_recipes.contrib.asgi import mutex_dependency

        report_lock = mutex_dependency(f"{prefix}/locks/report", timeout=2)
        print(callable(report_lock))  # True
    """

    # Request and HTTPException are module globals: FastAPI resolves the (string) annotation
    # of ``request`` there.
    async def dependency(request: Request) -> AsyncIterator[LockHold]:
        client: EtcdClient = getattr(request.state, state_key)
        mutex = DistributedMutex(client, path, lease_ttl=lease_ttl)
        try:
            if not await mutex.acquire(timeout):
                raise HTTPException(status_code, f"{path} is locked; try again later")
            hold = mutex.hold
            assert hold is not None
            try:
                yield hold
            finally:
                await mutex.release()
        finally:
            await mutex.aclose()

    return dependency


def health_routes(
    *,
    live_path: str = "/healthz",
    ready_path: str = "/readyz",
    timeout: float = 1.0,
    state_key: str = "etcd",
) -> list[Route]:
    """Liveness and readiness routes for the client :func:`etcd_lifespan` published.

    ``GET /healthz`` answers 200 while the client is open and usable in this worker
    (:meth:`~etcd_recipes.EtcdClient.is_live`, no RPC: an etcd outage does not make an
    orchestrator restart the worker) and 503 otherwise; ``GET /readyz`` answers 200 when etcd
    answers within ``timeout`` seconds (:meth:`~etcd_recipes.EtcdClient.check`) and 503
    otherwise, so a paused or unreachable etcd takes the worker out of rotation within the
    deadline. Both bodies are JSON: ``{"live": true}`` / ``{"ready": false}``.

    Example::

        from starlette.applications import Starlette
        from etcd_recipes.contrib.asgi import etcd_lifespan, health_routes

        app = Starlette(routes=health_routes(), lifespan=etcd_lifespan(endpoints=endpoints))
        print([route.path for route in app.routes])  # ['/healthz', '/readyz']
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"health_routes: timeout must be seconds > 0, got {timeout!r}")

    def client_of(request: Request) -> EtcdClient | None:
        return getattr(request.state, state_key, None)

    async def live(request: Request) -> JSONResponse:
        client = client_of(request)
        ok = client is not None and client.is_live()
        return JSONResponse({"live": ok}, status_code=200 if ok else 503)

    async def ready(request: Request) -> JSONResponse:
        client = client_of(request)
        ok = client is not None and await client.check(timeout=timeout)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    return [Route(live_path, live, methods=["GET"]), Route(ready_path, ready, methods=["GET"])]
