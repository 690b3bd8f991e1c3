"""client.check() (readiness, a tight-deadline ping) and client.is_live() (liveness, no RPC)."""

from __future__ import annotations

import time

import pytest

from etcd_recipes import connect


@pytest.mark.slow
async def test_a_paused_server_flips_readiness_within_the_deadline_while_liveness_stays(
    fresh_etcd_server,
) -> None:
    async with connect(**fresh_etcd_server.client_kwargs()) as client:
        assert await client.check(timeout=0.5) and client.is_live()
        fresh_etcd_server.pause()
        try:
            t0 = time.monotonic()
            assert await client.check(timeout=0.5) is False
            assert time.monotonic() - t0 < 1.5  # the deadline, not the retry policy
            assert client.is_live()  # etcd's outage is not this process's death
        finally:
            fresh_etcd_server.resume()
        assert await client.check(timeout=2)
    assert not client.is_live()  # closed
    assert await client.check() is False  # never raises


async def test_check_rejects_a_bad_timeout(etcd_client) -> None:
    from etcd_recipes import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="timeout"):
        await etcd_client.check(timeout=-1)
