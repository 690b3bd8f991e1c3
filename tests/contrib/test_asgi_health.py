"""health_routes() served by a real uvicorn server (in-process, on a free port) over a real
etcd: readiness follows etcd within the deadline, liveness follows the worker's client."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

import httpx
import uvicorn
from starlette.applications import Starlette

from etcd_recipes import InvalidArgumentError
from etcd_recipes.contrib.asgi import etcd_lifespan, health_routes


@pytest.mark.slow
async def test_probes_follow_a_paused_etcd(fresh_etcd_server) -> None:
    app = Starlette(
        routes=health_routes(timeout=0.5),
        lifespan=etcd_lifespan(endpoints=fresh_etcd_server.endpoint),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            live, ready = await http.get("/healthz"), await http.get("/readyz")
            assert (live.status_code, live.json()) == (200, {"live": True})
            assert (ready.status_code, ready.json()) == (200, {"ready": True})
            fresh_etcd_server.pause()
            try:
                t0 = time.monotonic()
                ready = await http.get("/readyz")
                assert (ready.status_code, ready.json()) == (503, {"ready": False})
                assert time.monotonic() - t0 < 1.5
                assert (await http.get("/healthz")).status_code == 200
            finally:
                fresh_etcd_server.resume()
            assert (await http.get("/readyz")).status_code == 200
    finally:
        server.should_exit = True
        await serving


def test_a_bad_timeout_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="timeout"):
        health_routes(timeout=0)
