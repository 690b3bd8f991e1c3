"""Watches via ``for``, leases via ``with``, listeners off the loop thread, hooks in threads."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from etcd_recipes.sync import (
    Cmp,
    EtcdClient,
    EventType,
    LeaseEvent,
    LeaseExpired,
    LeaseRestored,
    Op,
    WatchEvent,
    WatchRecoveryEvent,
    WatchResubscribed,
    WatchResynced,
    WatchSuspended,
    connect,
    fail_after,
)


def test_for_loop_over_a_watch(client: EtcdClient, etcd_prefix: str) -> None:
    rev = client.range(etcd_prefix, prefix=True, count_only=True).revision
    with client.watch(etcd_prefix, prefix=True, start_revision=rev + 1, prev_kv=True) as watch:
        writer = threading.Thread(
            target=lambda: (
                [client.put(etcd_prefix + "a", str(i)) for i in range(3)]
                + [client.delete(etcd_prefix + "a")]
            )
        )
        writer.start()
        seen: list[WatchEvent] = []
        for item in watch:
            assert isinstance(item, WatchEvent)
            seen.append(item)
            if item.type is EventType.DELETE:
                break
        writer.join()
    assert [e.kv.value for e in seen[:3]] == [b"0", b"1", b"2"]
    assert seen[3].prev_kv is not None
    assert seen[3].prev_kv.value == b"2"
    assert watch.is_closed


def test_closed_watch_iteration_stops(client: EtcdClient, etcd_prefix: str) -> None:
    rev = client.put(etcd_prefix + "k", "1").revision
    watch = client.watch(etcd_prefix + "k", start_revision=rev)
    watch.start()
    assert next(watch).kv.value == b"1"
    watch.close()
    assert list(watch) == []


def test_recovery_listener_runs_off_the_loop_thread(fresh_etcd_server: Any) -> None:
    calls: list[tuple[WatchRecoveryEvent, threading.Thread]] = []
    with connect(**fresh_etcd_server.client_kwargs()) as client:
        rev = client.put("/r", "0").revision
        with client.watch("/r", start_revision=rev + 1) as watch:
            watch.add_recovery_listener(lambda e: calls.append((e, threading.current_thread())))
            fresh_etcd_server.restart()
            client.put("/r", "1")
            in_band = []
            for item in watch.items():
                in_band.append(item)
                if isinstance(item, WatchEvent):
                    break
        deadline = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        loop_thread = client._rt.loop_thread
    assert [type(i) for i in in_band] == [WatchSuspended, WatchResubscribed, WatchEvent]
    assert [type(e) for e, _ in calls] == [WatchSuspended, WatchResubscribed]
    threads = {t for _, t in calls}
    assert len(threads) == 1  # one ordered listener thread per client
    (listener_thread,) = threads
    assert listener_thread not in (loop_thread, threading.main_thread())
    assert listener_thread.name.endswith("-listeners")
    assert not listener_thread.is_alive()  # stopped with the client


def test_lease_with_block_and_listener(client: EtcdClient, etcd_prefix: str) -> None:
    events: list[tuple[LeaseEvent, int]] = []
    gate = threading.Event()

    def listener(event: LeaseEvent) -> None:
        events.append((event, threading.get_ident()))
        # A blocking listener that calls back into the facade stalls nobody else.
        assert client.get(etcd_prefix + "k") is None
        gate.wait(5)

    with client.lease(2) as lease:
        lease.add_listener(listener)
        client.put(etcd_prefix + "k", "held", lease=lease.id)
        client.lease_revoke(lease.id)  # out of band: the keeper reports it lost
        lease.wait_lost()
        assert lease.is_lost
        assert lease.lost_cause is not None
        started = time.monotonic()
        assert client.get(etcd_prefix + "other") is None  # not stalled by the listener
        assert time.monotonic() - started < 1
        gate.set()
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [type(e) for e, _ in events] == [LeaseExpired]
    assert events[0][1] not in (threading.get_ident(), client._rt.loop_thread.ident)


def test_remove_listener(client: EtcdClient) -> None:
    calls: list[LeaseEvent] = []
    with client.lease(2) as lease:
        lease.add_listener(calls.append)
        lease.remove_listener(calls.append)  # the same wrapper is found again
        client.lease_revoke(lease.id)
        lease.wait_lost()
    time.sleep(0.1)
    assert calls == []
    assert len(lease._a.listeners) == 0


def test_listener_errors_are_logged(client: EtcdClient, caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: LeaseEvent) -> None:
        raise RuntimeError("listener bug")

    with caplog.at_level(logging.WARNING, logger="etcd_recipes"), client.lease(2) as lease:
        lease.add_listener(broken)
        client.lease_revoke(lease.id)
        lease.wait_lost()
        deadline = time.monotonic() + 5
        while "listener bug" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "listener bug" in caplog.text


def test_self_healing_hook_calls_back_into_the_facade(client: EtcdClient, etcd_prefix: str) -> None:
    key = etcd_prefix + "me"
    hook_threads: list[threading.Thread] = []
    events: list[LeaseEvent] = []

    def establish(lease_id: int) -> bool:
        hook_threads.append(threading.current_thread())
        return client.txn([Cmp.missing(key)], [Op.put(key, b"me", lease=lease_id)]).succeeded

    with client.self_healing_lease(2, establish) as lease:
        lease.add_listener(events.append)
        first = lease.current_lease_id
        client.lease_revoke(first)  # the key goes with it; the lease heals and re-establishes
        deadline = time.monotonic() + 10
        while not any(isinstance(e, LeaseRestored) for e in events):
            assert time.monotonic() < deadline, events
            time.sleep(0.02)
        kv = client.get(key)
        assert kv is not None
        assert kv.lease == lease.current_lease_id != first
        assert lease.is_healthy
    assert client.get(key) is None
    assert len(hook_threads) == 2
    assert not {threading.main_thread(), client._rt.loop_thread} & set(hook_threads)


def test_self_healing_lease_declined(client: EtcdClient, etcd_prefix: str) -> None:
    lease = client.self_healing_lease(2, lambda lease_id: False)
    assert lease.start() is False
    assert lease.current_lease_id == 0
    lease.close()


def test_resync_hook_is_a_plain_function(fresh_etcd_server: Any) -> None:
    with connect(**fresh_etcd_server.client_kwargs()) as client:
        rev = client.put("/c", "0").revision
        client.put("/c", "1")
        client.compact(rev + 1)
        calls: list[threading.Thread] = []

        def resync() -> int:
            calls.append(threading.current_thread())
            return client.range("/c").revision + 1

        items: list[Any] = []
        with fail_after(3), client.watch("/c", start_revision=rev, resync=resync) as watch:
            for item in watch.items():
                items.append(item)
                if isinstance(item, WatchResynced):
                    client.put("/c", "2")
                if isinstance(item, WatchEvent):
                    break
    assert calls
    assert calls[0] not in (threading.main_thread(), client._rt.loop_thread)
    assert [type(i) for i in items] == [WatchResynced, WatchEvent]
    assert items[-1].kv.value == b"2"
