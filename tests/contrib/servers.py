"""Real servers for the contrib tests, each a separate process that registers itself in etcd.

    python -m tests.contrib.servers http|grpc ENDPOINT SERVICE_PATH NAME ID [--fail]

* ``http``: a Starlette app served by uvicorn on a free loopback port; ``GET /`` answers
  ``{"id": ID}`` (``503`` with ``--fail``). It registers after uvicorn is listening.
* ``grpc``: a ``grpc.aio`` server with the standard health service and a generic method
  ``/test.Who/Who`` (raw bytes, no generated code) answering ID; it registers once started.

Both print ``REGISTERED <port>`` when their instance is in etcd. On SIGTERM they leave as a
well-behaved server does: unregister first, keep serving for ``DRAIN`` seconds (clients see
the change a few milliseconds later), then stop with a grace period. SIGKILL leaves the
registration to expire with its lease (TTL 2 s).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from etcd_recipes import ServiceInstance, ServiceRegistry, connect

DRAIN = 1.0
TTL = 2


async def _serve_until_term(
    endpoint: str, service_path: str, name: str, ident: str, port: int, stop: object
) -> None:
    term = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, term.set)
    async with connect(endpoint) as client:
        registry = ServiceRegistry(client, service_path, ttl=TTL)
        instance = ServiceInstance(name, "", address="127.0.0.1", port=port, id=ident)
        await registry.register(instance)
        print(f"REGISTERED {port}", flush=True)
        await term.wait()
        await registry.unregister(instance)
        await asyncio.sleep(DRAIN)
        await registry.aclose()
    await stop()  # type: ignore[operator]


async def http_main(endpoint: str, service_path: str, name: str, ident: str, fail: bool) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def who(request: object) -> JSONResponse:
        return JSONResponse({"id": ident}, status_code=503 if fail else 200)

    app = Starlette(routes=[Route("/", who)])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    async def stop() -> None:
        server.should_exit = True
        await serving

    await _serve_until_term(endpoint, service_path, name, ident, port, stop)


async def grpc_main(endpoint: str, service_path: str, name: str, ident: str) -> None:
    import grpc
    import grpc.aio
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)

    async def who(request: bytes, context: object) -> bytes:
        if request:  # a slow call: the request says how many milliseconds to take
            await asyncio.sleep(int(request) / 1000)
        return ident.encode()

    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.Who", {"Who": grpc.unary_unary_rpc_method_handler(who)}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def stop() -> None:
        await server.stop(grace=5)

    await _serve_until_term(endpoint, service_path, name, ident, port, stop)


def main(argv: list[str]) -> None:
    kind, endpoint, service_path, name, ident = argv[:5]
    if kind == "http":
        asyncio.run(http_main(endpoint, service_path, name, ident, "--fail" in argv))
    else:
        asyncio.run(grpc_main(endpoint, service_path, name, ident))


if __name__ == "__main__":
    main(sys.argv[1:])
