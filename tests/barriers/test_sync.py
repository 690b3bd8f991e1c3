"""The generated blocking twins of the counted barriers, used from threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from etcd_recipes.sync import DistributedBarrierWithCount, DistributedDoubleBarrier, connect


@pytest.fixture
def client(etcd_server: Any) -> Iterator[Any]:
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_blocking_counted_barriers(client, etcd_prefix):
    results: list[bool] = []

    def member(path: str, n: int) -> None:
        results.append(DistributedBarrierWithCount(client, path, n).wait_on_barrier(timeout=10))

    threads = [threading.Thread(target=member, args=(etcd_prefix + "b", 3)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert results == [True, True, True]

    def double(log: list[str]) -> None:
        with DistributedDoubleBarrier(client, etcd_prefix + "d", 2) as barrier:
            assert barrier.enter(timeout=10)
            log.append("in")
            assert barrier.leave(timeout=10)
            log.append("out")

    log: list[str] = []
    threads = [threading.Thread(target=double, args=(log,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert log == ["in", "in", "out", "out"]
    assert client.get_prefix(etcd_prefix).kvs == []
