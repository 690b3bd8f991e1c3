"""The blocking facade of the groups family, per thread: a partitioner per thread dividing the
items, events read by blocking iterators and listeners run off the loop, a member's view and
events from a thread, and a blocking wait cut by ``fail_after`` leaving nothing behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from etcd_recipes.sync import (
    EtcdClient,
    EtcdTimeoutError,
    GroupMember,
    ItemAssigned,
    MemberJoined,
    MemberLeft,
    PartitionState,
    SetPartitioner,
    connect,
    fail_after,
)

ITEMS = [f"i{n}" for n in range(9)]


@pytest.fixture
def client(etcd_server: Any) -> Iterator[EtcdClient]:
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_one_partitioner_per_thread_divides_the_items(client: EtcdClient, etcd_prefix: str) -> None:
    path = etcd_prefix + "p"
    owned: dict[str, dict[str, int]] = {}
    tracked: dict[str, dict[str, int]] = {n: {} for n in "abc"}
    seen: dict[str, dict[str, int]] = {}
    listener_threads: dict[str, set[str]] = {n: set() for n in "abc"}
    joined, stop = threading.Barrier(3), threading.Event()
    errors: list[BaseException] = []

    def listener(name: str, event: Any) -> None:
        listener_threads[name].add(threading.current_thread().name)
        if isinstance(event, ItemAssigned):
            tracked[name][event.item] = event.fencing_token
        else:
            tracked[name].pop(event.item, None)

    def worker(name: str) -> None:
        try:
            p = SetPartitioner(client, path, ITEMS, member_id=name)
            p.add_listener(lambda e: listener(name, e))  # before start: sees every event
            with p:
                joined.wait(10)
                deadline = time.monotonic() + 20
                while not (p.wait_stable(timeout=10) and len(p.member.member_ids()) == 3):
                    assert time.monotonic() < deadline, repr(p)
                    time.sleep(0.05)
                joined.wait(10)
                time.sleep(0.5)  # everyone's hand-overs are done, the listeners caught up
                owned[name] = p.assigned()
                seen[name] = dict(tracked[name])
                stop.wait(10)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            joined.abort()

    threads = [threading.Thread(target=worker, args=(n,), name=f"w-{n}") for n in "abc"]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(owned) < 3 and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    on_server = {
        kv.key_text.rsplit("/", 1)[1]: (kv.value.decode(), kv.create_revision)
        for kv in client.get_prefix(f"{path}/owners/")
    }
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(item for mine in owned.values() for item in mine) == ITEMS  # each once
    for name, mine in owned.items():
        assert mine == {i: rev for i, (m, rev) in on_server.items() if m == name}
        # Each thread's listener saw the same, and ran off the worker thread:
        assert seen[name] == mine
        assert tracked[name] == {}  # closing gave everything back, and said so
        assert f"w-{name}" not in listener_threads[name]
    assert client.count(path + "/") == 0  # every worker left


def test_a_member_view_and_events_from_a_thread(client: EtcdClient, etcd_prefix: str) -> None:
    path = etcd_prefix + "g"
    with GroupMember(client, path, b"a", member_id="a") as a:
        events = a.events()
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.extend(events))  # until a closes
        reader.start()
        with GroupMember(client, path, b"b", member_id="b") as b:
            a.wait_for_revision(b.joined_revision)
            assert a.members() == {"a": b"a", "b": b"b"}
            b.update(b"b2")
            assert client.get(b.key).value == b"b2"
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    reader.join(10)
    assert not reader.is_alive()
    assert [type(e) for e in got][:1] == [MemberJoined] and isinstance(got[2], MemberLeft)
    assert client.count(path + "/") == 0


def test_a_blocking_wait_cut_by_fail_after_leaves_nothing(
    client: EtcdClient, etcd_prefix: str
) -> None:
    path = etcd_prefix + "p"
    with client.lease(30) as foreign:
        client.put(f"{path}/owners/x", b"ghost", lease=foreign.id)
        p = SetPartitioner(client, path, ["x", "y"], member_id="a")
        p.start()
        with pytest.raises(EtcdTimeoutError), fail_after(0.5):
            p.wait_stable()  # x stays held by the ghost
        assert p.state is PartitionState.ACQUIRING
        p.close()
        assert [kv.key_text for kv in client.get_prefix(path + "/")] == [f"{path}/owners/x"]


def test_on_release_is_a_plain_function_run_before_the_key_goes(
    client: EtcdClient, etcd_prefix: str
) -> None:
    path = etcd_prefix + "p"
    seen: list[tuple[str, bool, str]] = []

    def on_release(item: str, token: int) -> None:  # a hook thread, not the loop
        kv = client.get(f"{path}/owners/{item}")
        seen.append(
            (item, kv is not None and kv.create_revision == token, threading.current_thread().name)
        )

    with SetPartitioner(client, path, ["x", "y"], member_id="a", on_release=on_release) as p:
        assert p.wait_stable(timeout=10)
    assert sorted(item for item, _, _ in seen) == ["x", "y"]
    assert all(held for _, held, _ in seen)  # each ran while the key was still ours
    assert threading.current_thread().name not in {name for _, _, name in seen}
    assert client.count(path + "/") == 0
