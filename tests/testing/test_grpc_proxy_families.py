"""Every family through ``etcd grpc-proxy`` (issue 31, item 5): the proxy coalesces watches,
numbers a stream's watches itself, answers no progress request and forwards leases, locks and
elections -- each recipe must keep its guarantees through it. Two clients of the proxy play
the contending processes; a direct client reads etcd afterwards to prove what was left."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    INT64,
    DistributedAtomicLong,
    DistributedBarrier,
    DistributedMutex,
    DistributedQueue,
    DistributedSemaphore,
    DistributedWorkQueue,
    GroupMember,
    LeaderLatch,
    ServiceCache,
    ServiceInstance,
    ServiceRegistry,
    SetPartitioner,
    SharedCount,
    TransientKeyValue,
    connect,
    run_stm,
)


@pytest.fixture
async def proxied(etcd_grpc_proxy):
    async with (
        connect(**etcd_grpc_proxy.client_kwargs()) as a,
        connect(**etcd_grpc_proxy.client_kwargs()) as b,
    ):
        yield a, b


async def test_mutex_and_semaphore(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    path = etcd_prefix + "lock"
    first, second = DistributedMutex(a, path), DistributedMutex(b, path)
    await first.acquire()
    waiter = asyncio.ensure_future(second.acquire(timeout=10))
    await asyncio.sleep(0.3)
    assert not waiter.done()  # the second waits behind the first, through the proxy's watch
    await first.release()
    assert await waiter
    await second.release()
    sem = DistributedSemaphore(a, etcd_prefix + "sem", 1)
    async with sem:
        assert not await DistributedSemaphore(b, etcd_prefix + "sem", 1).acquire(timeout=0.3)
    for m in (first, second):
        await m.aclose()
    await sem.aclose()
    assert (await etcd_client.range(path, prefix=True)).kvs == []


async def test_leader_latch_hands_over(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    path = etcd_prefix + "election"
    one, two = LeaderLatch(a, path), LeaderLatch(b, path)
    await one.start()
    await one.await_leadership(timeout=10)
    await two.start()
    await asyncio.sleep(0.2)
    assert one.has_leadership and not two.has_leadership
    await one.aclose()
    await two.await_leadership(timeout=10)  # the delete's event reached it through the proxy
    await two.aclose()
    assert (await etcd_client.range(path, prefix=True)).kvs == []


async def test_barrier_lifts(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    path = etcd_prefix + "barrier"
    setter = DistributedBarrier(a, path)
    await setter.set_barrier()
    waiting = asyncio.ensure_future(DistributedBarrier(b, path).wait_on_barrier(timeout=10))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await setter.remove_barrier()
    assert await waiting
    assert (await etcd_client.range(path, prefix=True)).kvs == []


async def test_queues_deliver_each_item_once(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    fifo_a, fifo_b = DistributedQueue(a, etcd_prefix + "q"), DistributedQueue(b, etcd_prefix + "q")
    parked = asyncio.ensure_future(fifo_b.poll(timeout=10))  # parked on the proxy's watch
    await asyncio.sleep(0.2)
    await fifo_a.enqueue(b"x")
    assert await parked == b"x"
    async with (
        DistributedWorkQueue(a, etcd_prefix + "w") as producer,
        DistributedWorkQueue(b, etcd_prefix + "w") as consumer,
    ):
        ids = [await producer.enqueue(str(i).encode()) for i in range(5)]
        got = []
        for _ in ids:
            item = await consumer.receive(timeout=10)
            assert item is not None and await item.ack()
            got.append(item.value)
        assert sorted(got) == [str(i).encode() for i in range(5)]
        assert await consumer.size() == 0
    await fifo_a.aclose()
    await fifo_b.aclose()


async def test_discovery_counter_and_transient_values(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    base = etcd_prefix + "svc"
    async with (
        ServiceRegistry(a, base) as registry,
        ServiceCache(b, base, "api") as cache,
    ):
        await registry.register(ServiceInstance("api", b"", address="10.0.0.1", port=80))
        for _ in range(100):
            if cache.instances():
                break
            await asyncio.sleep(0.05)
        assert [i.address for i in cache.instances()] == ["10.0.0.1"]
    counter = DistributedAtomicLong(a, etcd_prefix + "n")
    await asyncio.gather(*(counter.increment() for _ in range(10)))
    assert await DistributedAtomicLong(b, etcd_prefix + "n").get() == 10
    async with TransientKeyValue(a, etcd_prefix + "tkv", b"on", lease_ttl=5):
        assert (await etcd_client.get(etcd_prefix + "tkv")).value == b"on"
    assert await etcd_client.get(etcd_prefix + "tkv") is None


async def test_stm_transfers_keep_the_total(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    for n in range(3):
        await etcd_client.put(f"{etcd_prefix}acct/{n}", b"100")

    def transfer(src: int, dst: int):
        async def apply(stm):
            x = int(await stm.get(f"{etcd_prefix}acct/{src}") or b"0")
            y = int(await stm.get(f"{etcd_prefix}acct/{dst}") or b"0")
            stm.put(f"{etcd_prefix}acct/{src}", str(x - 7))
            stm.put(f"{etcd_prefix}acct/{dst}", str(y + 7))

        return apply

    runs = [
        run_stm(c, transfer(i % 3, (i + 1) % 3), max_retries=None)
        for i in range(10)
        for c in (a, b)
    ]
    await asyncio.gather(*runs)
    balances = [int(kv.value) for kv in (await etcd_client.get_prefix(etcd_prefix + "acct/")).kvs]
    assert sum(balances) == 300 and balances != [100, 100, 100]


async def test_shared_values_compare_and_set_and_watch(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    path = etcd_prefix + "shared"
    async with SharedCount(a, path) as mine, SharedCount(b, path) as theirs:
        changes = mine.changes()
        assert (await anext(changes)).value == 0

        async def bump(count: SharedCount) -> None:
            for _ in range(5):
                while not await count.try_set((seen := await count.get()).value + 1, seen.version):
                    pass

        await asyncio.gather(bump(mine), bump(theirs))
        seen = [(await anext(changes)).value for _ in range(10)]
        assert seen == list(range(1, 11))  # every write, once, in order, through the proxy
    kv = await etcd_client.get(path)
    assert kv is not None and kv.lease == 0 and INT64.decode(kv.value) == 10


async def test_groups_divide_the_items_once(proxied, etcd_client, etcd_prefix):
    a, b = proxied
    path, items = etcd_prefix + "group", [f"s{i}" for i in range(6)]
    one = await SetPartitioner(a, path, items, member_id="one").start()
    two = await SetPartitioner(b, path, items, member_id="two").start()
    for _ in range(200):  # both see both, and own their share
        stable = [await p.wait_stable(timeout=10) for p in (one, two)]
        views = [len(p.member.member_ids()) for p in (one, two)]
        if all(stable) and views == [2, 2] and len({**one.assigned(), **two.assigned()}) == 6:
            break
        await asyncio.sleep(0.05)
    assert sorted([*one.assigned(), *two.assigned()]) == items  # each item once
    owners = await etcd_client.get_prefix(f"{path}/owners/")
    assert {kv.key_text.rsplit("/", 1)[1]: kv.create_revision for kv in owners} == {
        **one.assigned(),
        **two.assigned(),
    }
    async with GroupMember(b, path, b"x", member_id="watcher") as watcher:
        await watcher.wait_for_revision(watcher.joined_revision)
        assert watcher.member_ids() == ["one", "two", "watcher"]
    await one.aclose()
    for _ in range(200):  # two takes one's items once their owner keys are gone
        if sorted(two.assigned()) == items:
            break
        await asyncio.sleep(0.05)
    assert sorted(two.assigned()) == items
    await two.aclose()
    assert (await etcd_client.range(path, prefix=True)).kvs == []
