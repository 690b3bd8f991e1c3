"""etcd_lifespan() through Litestar's lifespan hook, served by a real uvicorn server: the
client reaches handlers on app.state, and a leader-only job runs and steps down on shutdown."""

from __future__ import annotations

import asyncio
import socket

import pytest

pytest.importorskip("litestar")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

import httpx
import uvicorn
from litestar import Litestar, get
from litestar.datastructures import State

from etcd_recipes import EtcdClient, LeadershipTerm, connect
from etcd_recipes.contrib.asgi import etcd_lifespan, leader_only


async def test_litestar_lifespan_hook(etcd_server, etcd_prefix) -> None:
    leading = asyncio.Event()

    async def job(client: EtcdClient, term: LeadershipTerm) -> None:
        leading.set()
        await asyncio.Event().wait()

    @get("/put")
    async def put(state: State) -> dict[str, str]:
        client: EtcdClient = state.etcd
        await client.put(f"{etcd_prefix}via-litestar", "yes")
        return {"ok": "yes"}

    app = Litestar(
        route_handlers=[put],
        lifespan=[
            etcd_lifespan(
                leader_only(job, election=f"{etcd_prefix}el"), endpoints=etcd_server.endpoint
            )
        ],
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    async with connect(etcd_server.endpoint) as reader:
        try:
            await asyncio.wait_for(leading.wait(), 20)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                answer = await http.get("/put")
            assert (answer.status_code, answer.json()) == (200, {"ok": "yes"})
            assert (await reader.get(f"{etcd_prefix}via-litestar")).text == "yes"
        finally:
            server.should_exit = True
            await serving
        assert (await reader.get_prefix(f"{etcd_prefix}el")).kvs == []  # stepped down
