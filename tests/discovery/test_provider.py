"""ServiceProvider: strategies, filters, the down-instance policy (a hypothesis test over
note_error sequences and a fake clock), empty-snapshot protection when every registrant's
lease is revoked at once, convergence after a compaction while disconnected, and
cancellation of start()."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etcd_recipes import (
    NoInstancesError,
    NotStartedError,
    RandomStrategy,
    ServiceInstance,
    ServiceProvider,
    ServiceRegistry,
    StickyStrategy,
    connect,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


async def _registered(client, path, count, name="orders"):
    registry = ServiceRegistry(client, path)
    instances = [ServiceInstance(name, "", port=8000 + i) for i in range(count)]
    for instance in instances:
        await registry.register(instance)
    return registry, instances


async def test_round_robin_random_sticky_and_filters(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    registry, instances = await _registered(etcd_client, path, 3)
    ids = sorted(i.id for i in instances)
    async with registry:
        async with ServiceProvider(etcd_client, path, "orders") as provider:
            assert [provider.get_instance().id for _ in range(6)] == ids + ids
            assert [i.id for i in provider.instances()] == ids
        async with ServiceProvider(
            etcd_client, path, "orders", strategy=StickyStrategy(RandomStrategy())
        ) as sticky:
            assert len({sticky.get_instance().id for _ in range(20)}) == 1
        odd = lambda i: i.port % 2 == 1  # noqa: E731
        async with ServiceProvider(etcd_client, path, "orders", instance_filter=odd) as only:
            assert {only.get_instance().port for _ in range(5)} == {8001}
        # A disabled instance takes no traffic (drain it with an update).
        async with ServiceProvider(etcd_client, path, "orders") as provider:
            target = instances[0]
            head = await _update(etcd_client, registry, dataclasses.replace(target, enabled=False))
            await provider._cache.wait_for_revision(head)
            assert target.id not in {provider.get_instance().id for _ in range(6)}
            assert len(provider.all_instances()) == 3


async def _update(client, registry, instance) -> int:
    await registry.update(instance)
    return (await client.get(registry.key_of(instance))).mod_revision


async def test_not_started_and_no_instances(etcd_client, etcd_prefix):
    provider = ServiceProvider(etcd_client, etcd_prefix + "s", "nobody")
    with pytest.raises(NotStartedError):
        provider.get_instance()
    async with provider:
        with pytest.raises(NoInstancesError) as info:
            provider.get_instance()
        assert info.value.service == "nobody" and isinstance(info.value, LookupError)


async def test_down_instances_come_back_after_the_down_period(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    registry, instances = await _registered(etcd_client, path, 2)
    async with (
        registry,
        ServiceProvider(
            etcd_client, path, "orders", error_threshold=2, down_period=0.5
        ) as provider,
    ):
        lists = provider.instance_lists()
        assert len(await anext(lists)) == 2
        victim = instances[0]
        provider.note_error(victim)
        assert provider.get_instance() is not None and not provider.is_down(victim)
        provider.note_error(victim)
        assert provider.is_down(victim)
        assert [i.id for i in await asyncio.wait_for(anext(lists), 5)] == [instances[1].id]
        assert all(provider.get_instance().id == instances[1].id for _ in range(5))
        back = await asyncio.wait_for(anext(lists), 5)  # published by the follower, unasked
        assert len(back) == 2 and not provider.is_down(victim)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


ops = st.lists(
    st.one_of(
        st.tuples(st.just("error"), st.integers(0, 2)),
        st.tuples(st.just("tick"), st.sampled_from([0, 1, 2, 5, 10, 20, 30])),
        st.tuples(st.just("get"), st.just(0)),
    ),
    max_size=60,
)


async def test_get_instance_never_returns_an_instance_inside_its_down_window(
    etcd_client, etcd_prefix
):
    path = etcd_prefix + "services"
    registry, instances = await _registered(etcd_client, path, 3)
    threshold, window, period = 3, 10, 20
    async with (
        registry,
        ServiceProvider(
            etcd_client,
            path,
            "orders",
            error_threshold=threshold,
            error_window=window,
            down_period=period,
        ) as provider,
    ):

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(ops)
        def check(steps):
            clock = FakeClock()
            provider._clock = clock
            provider._down.clear()
            provider._error_times.clear()
            provider._refresh(clock.now)
            errors: dict[str, list[float]] = {}
            down: dict[str, float] = {}  # the model: the specification, independently
            for op, arg in steps:
                if op == "tick":
                    clock.now += arg
                elif op == "error":
                    iid = instances[arg].id
                    seen = [t for t in errors.get(iid, []) if t > clock.now - window]
                    seen.append(clock.now)
                    if len(seen) >= threshold:
                        down[iid], seen = clock.now + period, []
                    errors[iid] = seen
                    provider.note_error(instances[arg])
                up = [i.id for i in instances if down.get(i.id, 0) <= clock.now]
                if up:
                    for _ in range(3):
                        picked = provider.get_instance()
                        assert down.get(picked.id, 0) <= clock.now, (picked.id, down, clock.now)
                    assert sorted(i.id for i in provider.instances()) == sorted(up)
                else:
                    with pytest.raises(NoInstancesError):
                        provider.get_instance()

        check()


async def test_empty_protection_when_every_lease_is_revoked_at_once(etcd_client, etcd_prefix):
    """Three registrants' records, each on its own lease; the leases are revoked server-side
    in one burst and nobody re-registers: the list really goes empty."""
    path = etcd_prefix + "services"
    mine = []
    for port in (8000, 8001, 8002):
        instance = ServiceInstance("orders", "", port=port)
        lease = await etcd_client.lease_grant(30)
        await etcd_client.put(
            f"{path}/names/orders/{instance.id}", instance.to_json(), lease=lease.id
        )
        mine.append((lease.id, instance))
    grace = 2.0
    async with (
        ServiceProvider(etcd_client, path, "orders", empty_grace=grace) as protected,
        ServiceProvider(etcd_client, path, "orders", empty_grace=0) as bare,
    ):
        lists = protected.instance_lists()
        assert len(await anext(lists)) == 3
        await asyncio.gather(*(etcd_client.lease_revoke(lease) for lease, _ in mine))
        loop = asyncio.get_running_loop()
        revoked = loop.time()
        await eventually(lambda: _raises(bare), what="the bare provider to go empty")
        # The two providers' caches apply the burst independently: wait for this one's view
        # (while it catches up it may serve a shrinking list, but never an empty one).
        await eventually(lambda: protected.is_stale, timeout=5, what="the protected provider")
        assert not _raises(protected)
        seen = {protected.get_instance().id for _ in range(6)}
        assert seen == {i.id for _, i in mine}  # the whole list before the burst
        assert len(protected.instances()) == 3
        while await asyncio.wait_for(anext(lists), grace + 5):  # the stale list, then ()
            pass
        assert loop.time() - revoked >= grace * 0.9  # () only after the grace
        assert not protected.is_stale and _raises(protected)


def _raises(provider) -> bool:
    try:
        provider.get_instance()
    except NoInstancesError:
        return True
    return False


async def test_protection_ends_when_an_instance_comes_back(etcd_client, etcd_prefix):
    path = etcd_prefix + "services"
    base = f"{path}/names/orders/"
    first = ServiceInstance("orders", "", port=80)
    await etcd_client.put(base + first.id, first.to_json())
    async with ServiceProvider(etcd_client, path, "orders", empty_grace=30) as provider:
        await etcd_client.delete(base + first.id)
        await eventually(lambda: provider.is_stale, what="stale")
        assert provider.get_instance().id == first.id
        second = ServiceInstance("orders", "", port=81)
        await etcd_client.put(base + second.id, second.to_json())
        await eventually(lambda: not provider.is_stale, what="fresh again")
        assert {provider.get_instance().id for _ in range(3)} == {second.id}


@pytest.mark.slow
async def test_converges_after_a_compaction_while_disconnected(fresh_etcd_server):
    server = fresh_etcd_server
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            registry, old = await _registered(direct, "/svc", 2)
            async with registry, ServiceProvider(through, "/svc", "orders") as provider:
                lists = provider.instance_lists()
                assert len(await anext(lists)) == 2
                proxy.blackhole()
                await eventually(lambda: not provider._cache.is_synced, timeout=8, what="noticed")
                await registry.unregister(old[0])
                new = ServiceInstance("orders", "", port=9000)
                await registry.register(new)
                await direct.compact((await direct.status()).revision)
                proxy.restore()
                want = sorted([old[1].id, new.id])
                await eventually(
                    lambda: sorted(i.id for i in provider.instances()) == want,
                    timeout=20,
                    what="the new list",
                )
                assert provider._cache._cache.resync_count >= 1
                assert not provider.is_stale
    finally:
        proxy.stop()


@pytest.mark.slow
async def test_a_cancelled_start_leaves_nothing_running(fresh_etcd_server):
    server = fresh_etcd_server
    async with connect(**server.client_kwargs(), **FAST) as client:
        provider = ServiceProvider(client, "/svc", "orders")
        server.pause()
        try:
            task = asyncio.create_task(provider.start())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            server.resume()
        assert not provider.is_started and provider._tasks == set()
        await provider.start()  # the same provider starts once the server answers
        with pytest.raises(NoInstancesError):
            provider.get_instance()
        await provider.aclose()
        assert provider._cache._cache._tasks == set()
        assert await client.count("/svc/") == 0  # a provider never writes
