"""Every operation against a frozen (SIGSTOPped) server is bounded by the caller's own
deadline: ``anyio.fail_after`` / ``asyncio.timeout`` raise ``TimeoutError`` -- never a bare
``CancelledError`` leaking out of gRPC -- and the client works again once the server resumes."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from etcd_recipes import Cmp, Op, connect

# A long keepalive: the channel must not be declared dead while the server is frozen, so every
# call really waits on the server.
SLOW_KEEPALIVE = {"keepalive_time": 60, "keepalive_timeout": 20}


def _operations(client, lease_id: int, doomed_lease_id: int, watch):
    async def establish(lease: int) -> bool:
        await client.put("/frozen/healing", b"1", lease=lease)
        return True

    return {
        "lease_keep_alive_once": lambda: client.lease_keep_alive_once(lease_id),
        "get": lambda: client.get("/frozen/k"),
        "range": lambda: client.range("/frozen/", prefix=True),
        "put": lambda: client.put("/frozen/k", b"v"),
        "delete": lambda: client.delete("/frozen/k"),
        "txn": lambda: client.txn([Cmp.missing("/frozen/t")], [Op.put("/frozen/t", b"v")]),
        "compact": lambda: client.compact(1),
        "status": lambda: client.status(),
        "member_list": lambda: client.member_list(),
        "lease_grant": lambda: client.lease_grant(5),
        "lease_time_to_live": lambda: client.lease_time_to_live(lease_id),
        "lease_revoke": lambda: client.lease_revoke(doomed_lease_id),
        "acquisition_lease": lambda: client.lease(5).grant(),
        "self_healing_lease": lambda: client.self_healing_lease(5, establish).start(),
        "watch_start": lambda: client.watch("/frozen/w2").start(),
        "watch_next": lambda: watch.__anext__(),
    }


@pytest.mark.slow
async def test_operations_on_a_frozen_server_honour_anyio_and_asyncio_deadlines(
    fresh_etcd_server,
):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **SLOW_KEEPALIVE) as client:
        lease = await client.lease_grant(60)
        doomed = await client.lease_grant(60)  # its revoke may land once the server resumes
        watch = await client.watch("/frozen/w").start()
        outcomes: dict[str, str] = {}
        server.pause()
        try:
            for name, op in _operations(client, lease.id, doomed.id, watch).items():
                for flavour in ("anyio", "asyncio"):
                    t0 = time.monotonic()
                    try:
                        if flavour == "anyio":
                            with anyio.fail_after(0.15):
                                await op()
                        else:
                            async with asyncio.timeout(0.15):
                                await op()
                        outcome = "returned"
                    except TimeoutError:
                        outcome = "TimeoutError"
                    except BaseException as exc:  # recorded; asserted below
                        outcome = type(exc).__name__
                    assert time.monotonic() - t0 < 2.0, f"{name} ({flavour}) was not bounded"
                    outcomes[f"{name}/{flavour}"] = outcome
        finally:
            server.resume()
        wrong = {k: v for k, v in outcomes.items() if v != "TimeoutError"}
        assert wrong == {}, f"not a TimeoutError: {wrong}"

        # The client recovers once the server runs again.
        await client.put("/frozen/after", b"ok", timeout=5)
        assert (await client.get("/frozen/after")).value == b"ok"  # type: ignore[union-attr]
        r = await client.put("/frozen/w", b"seen")
        item = await asyncio.wait_for(watch.__anext__(), 5)
        assert item.kv.mod_revision == r.revision  # type: ignore[union-attr]
        assert await client.lease_keep_alive_once(lease.id) > 0
        await watch.aclose()
