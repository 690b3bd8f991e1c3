"""Server limits and learners: a full database is a typed quota error, a request over the
server's size limit is refused before it is sent, and the client sends no calls to a learner."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    Cmp,
    EtcdConnectionError,
    EtcdMetrics,
    EtcdServerError,
    Op,
    QuotaExceededError,
    ResilienceConfig,
    RetryPolicy,
    RpcResilience,
    ValueTooLargeError,
    connect,
)
from etcd_recipes.sync import connect as sync_connect
from etcd_recipes.testing import EtcdServer
from etcd_recipes.testing._process import free_ports
from etcd_recipes.testing.server import _MemberSpec

NEVER = ResilienceConfig(rpc=RpcResilience(retry_policy=RetryPolicy.never()))


class _Rpcs(EtcdMetrics):
    def __init__(self) -> None:
        self.ops: list[str] = []

    def record_rpc(self, op: str, duration: float, attempts: int, failed: bool) -> None:
        self.ops.append(op)


# --------------------------------------------------------------------------- quota


@pytest.mark.slow
async def test_a_full_database_is_a_typed_quota_error():
    with EtcdServer(extra_args=["--quota-backend-bytes", str(256 * 1024)]) as server:
        async with connect(server.url) as client:
            written = 0
            with pytest.raises(QuotaExceededError) as info:
                for i in range(200):
                    await client.put(f"/quota/{i}", b"x" * 20_000)
                    written += 1
            assert isinstance(info.value, EtcdServerError)  # code and details kept
            assert "database space exceeded" in info.value.details
            assert "quota" in str(info.value) and "alarm disarm" in str(info.value)
            # The write that crossed the quota may have been applied (etcd applies a committed
            # write, then reports the error); no later one is. Reads and deletes still work.
            assert await client.count("/quota/") in (written, written + 1)
            with pytest.raises(QuotaExceededError):
                await client.put("/quota/more", b"x")
            assert await client.get("/quota/more") is None
            assert (await client.delete("/quota/0")).deleted == 1
            with pytest.raises(QuotaExceededError):
                await client.lease_grant(5)


# --------------------------------------------------------------------------- request size


async def test_a_put_over_the_request_limit_is_refused_before_it_is_sent(etcd_server, etcd_prefix):
    rpcs = _Rpcs()
    config = ResilienceConfig().with_metrics(rpcs)
    async with connect(**etcd_server.client_kwargs(), resilience=config) as client:
        big = b"x" * (1536 * 1024)  # the value alone is the default limit; with the key, over
        with pytest.raises(ValueTooLargeError) as info:
            await client.put(etcd_prefix + "big", big)
        message = str(info.value)
        assert "--max-request-bytes" in message and "nothing was sent" in message
        assert str(1536 * 1024) in message
        with pytest.raises(ValueTooLargeError):
            await client.put_value(etcd_prefix + "big", big, _bytes_codec())
        half = b"y" * (800 * 1024)  # two halves fit one put each, not one transaction
        with pytest.raises(ValueTooLargeError, match="txn"):
            await client.txn(
                [Cmp.missing(etcd_prefix + "a")],
                [Op.put(etcd_prefix + "a", half), Op.put(etcd_prefix + "b", half)],
            )
        assert rpcs.ops == []  # refused client-side: not one RPC was sent
        assert await client.count(etcd_prefix) == 0  # and nothing was written
        await client.put(etcd_prefix + "a", half)  # under the limit: fine


async def test_max_request_bytes_follows_the_server(etcd_prefix):
    limit = 64 * 1024
    with EtcdServer(extra_args=["--max-request-bytes", str(limit)]) as server:
        async with connect(server.url, max_request_bytes=limit) as client:
            with pytest.raises(ValueTooLargeError, match=str(limit)):
                await client.put("/small/k", b"x" * limit)
            await client.put("/small/k", b"x" * (limit - 1024))
        async with connect(server.url, max_request_bytes=None) as client:
            # No client-side check: the server refuses it, with the same error type.
            with pytest.raises(ValueTooLargeError):
                await client.put("/small/k", b"x" * (2 * limit))
    with pytest.raises(ValueError, match="max_request_bytes"):
        connect("127.0.0.1:2379", max_request_bytes=0)


def _bytes_codec():
    from etcd_recipes import BYTES

    return BYTES


# --------------------------------------------------------------------------- learners


@pytest.fixture
def voter_and_learner():
    """A one-member cluster (n1) plus a learner (n2) added with ``etcdctl member add``."""
    with EtcdServer(name="n1") as voter:
        client_port, peer_port = free_ports(2)
        peer = f"http://127.0.0.1:{peer_port}"
        voter.etcdctl("member", "add", "n2", "--learner", f"--peer-urls={peer}", check=True)
        learner = EtcdServer(
            name="n2",
            extra_args=["--initial-cluster-state", "existing"],
            _member=_MemberSpec(
                initial_cluster=f"n1={voter.peer_url},n2={peer}",
                token=voter._token,
                client_port=client_port,
                peer_port=peer_port,
            ),
        )
        with learner:
            yield voter, learner


@pytest.mark.slow
async def test_no_calls_go_to_a_learner(voter_and_learner):
    voter, learner = voter_and_learner
    async with connect(learner.url, resilience=NEVER) as direct:
        assert (await direct.get("/learner/k", serializable=True)) is None  # it is up
        with pytest.raises(EtcdConnectionError, match="learner") as info:  # its only answer
            await direct.put("/learner/k", b"v")
        assert "voting members" in str(info.value)
    # Both endpoints given, the learner first; one attempt per call: none may hit the learner.
    async with connect([learner.url, voter.url], resilience=NEVER) as client:
        for i in range(30):
            await client.put(f"/learner/{i}", b"v")
            assert (await client.get(f"/learner/{i}")).value == b"v"
        served = {(await client.status()).member_id for _ in range(10)}
        members = await client.member_list()
        assert sorted(m.is_learner for m in members) == [False, True]
        assert served == {m.id for m in members if not m.is_learner}

    # The blocking facade's plain KV calls go out on a channel of their own, built from the
    # same endpoints minus the learner: none of them may hit it either.
    def blocking_calls() -> None:
        with sync_connect([learner.url, voter.url], resilience=NEVER) as blocking:
            for i in range(30):
                blocking.put(f"/learner/sync/{i}", b"v")
                assert blocking.get(f"/learner/sync/{i}").value == b"v"  # type: ignore[union-attr]

    await asyncio.to_thread(blocking_calls)  # (the facade refuses a running event loop)
