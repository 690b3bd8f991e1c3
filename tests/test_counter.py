"""DistributedAtomicLong against a real etcd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from etcd_recipes import INT64, InvalidArgumentError, RecipeClosedError
from etcd_recipes.counter import DistributedAtomicLong


async def test_lazy_creation_and_mutators(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    counter = DistributedAtomicLong(etcd_client, path, default=10)
    assert await etcd_client.get(path) is None  # constructor did no I/O
    assert await counter.get() == 10
    assert await counter.increment() == 11
    assert await counter.decrement() == 10
    assert await counter.add(5) == 15
    assert await counter.subtract(20) == -5
    raw = await etcd_client.get(path)
    assert raw.value == INT64.encode(-5) == b"\xff" * 7 + b"\xfb"  # 8-byte big-endian
    other = DistributedAtomicLong(etcd_client, path, default=999)  # first creator's default wins
    assert await other.get() == -5
    assert await DistributedAtomicLong.delete(etcd_client, path) is True
    assert await DistributedAtomicLong.delete(etcd_client, path) is False
    assert await counter.increment() == 11  # re-created lazily with its default
    await counter.aclose()
    with pytest.raises(RecipeClosedError):
        await counter.get()


async def test_concurrent_increments_return_exactly_1_to_n(etcd_client, etcd_prefix):
    path = etcd_prefix + "n"
    counters = [DistributedAtomicLong(etcd_client, path) for _ in range(8)]
    results = await asyncio.gather(*(c.increment() for c in counters for _ in range(5)))
    assert sorted(results) == list(range(1, 41))
    assert await counters[0].get() == 40


async def test_overflow_and_bad_input(etcd_client, etcd_prefix):
    counter = DistributedAtomicLong(etcd_client, etcd_prefix + "n", default=INT64.MAX - 1)
    assert await counter.increment() == INT64.MAX
    with pytest.raises(InvalidArgumentError):
        await counter.increment()
    assert await counter.get() == INT64.MAX  # nothing written
    with pytest.raises(InvalidArgumentError):
        await counter.add(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DistributedAtomicLong(etcd_client, etcd_prefix + "m", default=2**63)


_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from etcd_recipes import connect
    from etcd_recipes.counter import DistributedAtomicLong

    async def main(endpoint, path, tasks, each):
        async with connect(endpoint) as client:
            counters = [DistributedAtomicLong(client, path) for _ in range(tasks)]
            out = await asyncio.gather(*(c.increment() for c in counters for _ in range(each)))
            print(json.dumps(out))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    """
)


@pytest.mark.slow
def test_eight_incrementers_in_two_processes(etcd_server, etcd_prefix):
    path = etcd_prefix + "n"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, etcd_server.endpoint, path, "4", "10"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    committed: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        committed += json.loads(out)
    assert sorted(committed) == list(range(1, 81))
