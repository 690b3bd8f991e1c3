"""TransientKeyValue against a real etcd: presence, healing after a pause past the TTL, and
disappearance after the owner is SIGKILLed."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from etcd_recipes import (
    JSON,
    AlreadyStartedError,
    ConnectionState,
    LeaseExpired,
    LeaseRestored,
    LeaseSuspended,
    connect,
)
from etcd_recipes.keyvalue import TransientKeyValue
from tests.helpers import eventually, first_item_then_break, take


async def test_key_lives_with_the_recipe(etcd_client, etcd_prefix):
    key = etcd_prefix + "presence"
    tkv = TransientKeyValue(etcd_client, key, "alive", lease_ttl=2)
    assert await etcd_client.get(key) is None
    async with tkv:
        kv = await etcd_client.get(key)
        assert kv.text == "alive" and kv.lease == tkv.lease_id != 0
        await asyncio.sleep(3)  # longer than the TTL: kept alive
        assert (await etcd_client.get(key)).text == "alive"
        with pytest.raises(AlreadyStartedError):
            await tkv.start()
    assert await etcd_client.get(key) is None  # revoked at close, not at TTL


async def test_typed_value(etcd_client, etcd_prefix):
    key = etcd_prefix + "svc"
    async with TransientKeyValue(etcd_client, key, {"port": 8080}, codec=JSON):
        assert await etcd_client.get_value(key, JSON) == {"port": 8080}


async def test_out_of_band_revoke_heals(etcd_client, etcd_prefix):
    key = etcd_prefix + "presence"
    events: list[object] = []
    async with TransientKeyValue(etcd_client, key, b"x", lease_ttl=2) as tkv:
        tkv.add_lease_listener(events.append)
        old = tkv.lease_id
        await etcd_client.lease_revoke(old)
        await eventually(lambda: any(isinstance(e, LeaseRestored) for e in events))
        assert isinstance(events[0], LeaseExpired) and events[0].lease_id == old
        kv = await etcd_client.get(key)
        assert kv is not None and kv.lease == tkv.lease_id != old
        assert tkv.connection_state is ConnectionState.RECONNECTED
        assert tkv.has_exceptions


@pytest.mark.slow
async def test_survives_pause_past_ttl(fresh_etcd_server, etcd_prefix):
    key = etcd_prefix + "presence"
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        events: list[object] = []
        async with TransientKeyValue(client, key, b"x", lease_ttl=2) as tkv:
            tkv.add_lease_listener(events.append)
            fresh_etcd_server.pause()
            await asyncio.sleep(3.5)
            fresh_etcd_server.resume()
            await eventually(lambda: any(isinstance(e, LeaseRestored) for e in events), timeout=15)
            kinds = [type(e).__name__ for e in events]
            assert "LeaseExpired" in kinds
            assert kinds.index("LeaseExpired") < kinds.index("LeaseRestored")
            await eventually(lambda: _has_key(client, key), what="key re-created")


async def _has_key(client, key) -> bool:
    return await client.get(key) is not None


_OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from etcd_recipes import connect
    from etcd_recipes.keyvalue import TransientKeyValue

    async def main(endpoint, key):
        async with connect(endpoint) as client:
            async with TransientKeyValue(client, key, b"pid", lease_ttl=2):
                print("ready", flush=True)
                await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.slow
async def test_disappears_within_ttl_after_sigkill(etcd_client, etcd_server, etcd_prefix):
    key = etcd_prefix + "presence"
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER, etcd_server.endpoint, key],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.strip() == "ready"
        assert await etcd_client.get(key) is not None
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await eventually(lambda: _gone(etcd_client, key), timeout=6, what="key expiry")
        # The TTL is 2 s; etcd may grant a little more. Never "kept alive" by anyone else.
        assert time.monotonic() - killed_at < 4.5
    finally:
        proc.kill()
        proc.wait()


async def _gone(client, key) -> bool:
    return await client.get(key) is None


async def test_lease_events_stream_expiry_then_restoration(etcd_client, etcd_prefix):
    key = etcd_prefix + "presence"
    tkv = TransientKeyValue(etcd_client, key, b"x", lease_ttl=2)
    events = tkv.lease_events()  # before start: nothing is missed
    seen: list[object] = []
    tkv.add_lease_listener(seen.append)
    await tkv.start()
    old = tkv.lease_id
    await etcd_client.lease_revoke(old)
    got = [e for e in await take(events, 2) if not isinstance(e, LeaseSuspended)]
    assert [type(e) for e in got] == [LeaseExpired, LeaseRestored]
    assert got[0].lease_id == old and got[1].new_lease_id == tkv.lease_id
    await eventually(lambda: len(seen) == 2, what="the listeners")
    assert seen == got  # the stream yields what the listeners get
    # Breaking out of a loop unregisters its stream; aclose() ends the others.
    consumer = asyncio.create_task(first_item_then_break(tkv.lease_events()))
    await eventually(lambda: tkv._lease_events.stream_count == 2, what="registered")
    await etcd_client.lease_revoke(tkv.lease_id)
    assert isinstance(await asyncio.wait_for(consumer, 10), LeaseExpired)
    del consumer
    gc.collect()
    assert tkv._lease_events.stream_count == 1
    await eventually(lambda: events.buffered >= 2, what="the second heal")
    await tkv.aclose()
    rest = [type(e) async for e in events if not isinstance(e, LeaseSuspended)]
    assert rest == [LeaseExpired, LeaseRestored]  # buffered ones still come, then the end
    assert await etcd_client.get(key) is None
