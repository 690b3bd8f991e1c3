"""The blocking twins of SharedValue and SharedCount, per thread: compare-and-set loops in
threads lose no update, and a thread iterating the changes sees every one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from etcd_recipes import JSON, Versioned
from etcd_recipes.sync import DistributedAtomicLong, SharedCount, SharedValue, connect


@pytest.fixture
def client(etcd_server: Any) -> Iterator[Any]:
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_threads_compare_and_set_without_losing_updates(client, etcd_prefix):
    path = etcd_prefix + "n"
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with SharedCount(client, path) as count:
                for _ in range(10):
                    while True:
                        seen = count.get()
                        if count.try_set(seen.value + 1, seen.version):
                            break
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert DistributedAtomicLong(client, path).get() == 40
    assert DistributedAtomicLong(client, path).compare_and_set(40, 0)


def test_a_thread_iterates_the_changes(client, etcd_prefix):
    path = etcd_prefix + "cfg"
    got: list[Versioned[Any]] = []
    with SharedValue(client, path, {"v": 0}, codec=JSON) as shared:
        changes = shared.changes()
        first = next(changes)
        assert first == shared.current and first.value == {"v": 0}

        def reader() -> None:
            for item in changes:
                got.append(item)
                if len(got) == 3:
                    return

        thread = threading.Thread(target=reader)
        thread.start()
        written = [shared.set({"v": i}) for i in (1, 2, 3)]
        thread.join(20)
        assert not thread.is_alive()
        assert got == written
        assert shared.get() == written[-1]
