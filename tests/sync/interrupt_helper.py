"""A child process for the Ctrl-C tests: it blocks in a facade call until SIGINT arrives.

Usage: ``python interrupt_helper.py SCENARIO ENDPOINT_URL KEY_PREFIX``. It prints ``ready`` just
before blocking, then one JSON line of evidence gathered *in the KeyboardInterrupt handler* (so
it shows the state the caller sees when the interrupt reaches it), then ``exited``. The
scenario ``timeout`` needs no signal: it blocks under ``fail_after`` instead.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from typing import Any

from etcd_recipes.sync import (
    Cmp,
    DistributedBarrier,
    EtcdClient,
    EtcdTimeoutError,
    Op,
    PrefixCache,
    connect,
    fail_after,
)


def watchers(url: str) -> int:
    """etcd's count of server-side watchers (its /metrics endpoint)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no watcher metric")


def watchers_settled(url: str, expected: int) -> int:
    """The watcher count once it reaches ``expected`` (a cancel is sent, then processed)."""
    deadline = time.monotonic() + 3
    count = watchers(url)
    while count != expected and time.monotonic() < deadline:
        time.sleep(0.01)
        count = watchers(url)
    return count


def ready() -> None:
    print("ready", flush=True)


def evidence(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


def establish_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """Interrupted while a slow ``establish`` hook runs: the lease must be revoked (and its key
    gone) *before* the KeyboardInterrupt reaches us."""
    key = prefix + "establish"
    granted: list[int] = []

    def establish(lease_id: int) -> bool:
        granted.append(lease_id)
        client.txn([Cmp.missing(key)], [Op.put(key, b"me", lease=lease_id)])
        ready()
        time.sleep(1.0)  # SIGINT arrives meanwhile
        return True

    lease = client.self_healing_lease(30, establish)
    started = time.monotonic()
    try:
        lease.start()
    except KeyboardInterrupt:
        evidence(
            scenario="establish",
            waited=time.monotonic() - started,
            key_present=client.get(key) is not None,
            lease_ttl=client.lease_time_to_live(granted[0]).ttl,
            lease_id=granted[0],
        )
        raise


def barrier_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """Interrupted in ``wait_on_barrier()``: the wait's watch is cancelled on the server; leaving
    the ``with`` blocks removes the barrier (the test checks etcd afterwards)."""
    with DistributedBarrier(client, prefix + "gate") as setter:
        setter.set_barrier()
        waiter = DistributedBarrier(client, prefix + "gate")
        base = watchers(url)
        ready()
        try:
            waiter.wait_on_barrier()
        except KeyboardInterrupt:
            evidence(
                scenario="barrier",
                watchers_before=base,
                watchers_after=watchers_settled(url, base),
                barrier_set=setter.is_barrier_set(),
                client_open=client.is_open,
            )
            raise


def lease_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """Interrupted in ``lease.wait_lost()`` inside ``with client.lease(...)``."""
    with client.lease(30) as lease:
        client.put(prefix + "leased", "x", lease=lease.id)
        ready()
        try:
            lease.wait_lost()
        except KeyboardInterrupt:
            evidence(scenario="lease", lease_id=lease.id, lost=lease.is_lost)
            raise


def watch_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """Interrupted while iterating a watch with ``for``."""
    base = watchers(url)
    with client.watch(prefix, prefix=True) as watch:
        ready()
        try:
            for _ in watch:
                pass
        except KeyboardInterrupt:
            during = watchers(url)
            watch.close()
            evidence(
                scenario="watch",
                watchers_during=during,
                watchers_after_close=watchers_settled(url, base),
                watchers_before=base,
            )
            raise


def cache_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """Interrupted while iterating a cache's events with ``for``; leaving the ``with`` block
    closes the cache: its watch is gone from the server."""
    base = watchers(url)
    try:
        with PrefixCache(client, prefix + "cfg/") as cache:
            stream = cache.events()
            ready()
            for _ in stream:
                pass
    except KeyboardInterrupt:
        evidence(
            scenario="cache",
            closed=cache.is_closed,
            watchers_after=watchers_settled(url, base),
            watchers_before=base,
        )
        raise


def timeout_scenario(client: EtcdClient, url: str, prefix: str) -> None:
    """``fail_after`` instead of Ctrl-C: same cleanup, then ``EtcdTimeoutError``."""
    with DistributedBarrier(client, prefix + "gate") as setter:
        setter.set_barrier()
        base = watchers(url)
        started = time.monotonic()
        try:
            with fail_after(0.5):
                DistributedBarrier(client, prefix + "gate").wait_on_barrier()
        except EtcdTimeoutError:
            evidence(
                scenario="timeout",
                waited=time.monotonic() - started,
                watchers_before=base,
                watchers_after=watchers_settled(url, base),
            )


SCENARIOS = {
    "barrier": barrier_scenario,
    "cache": cache_scenario,
    "establish": establish_scenario,
    "lease": lease_scenario,
    "timeout": timeout_scenario,
    "watch": watch_scenario,
}


def main() -> int:
    scenario, url, prefix = sys.argv[1:4]
    try:
        with connect(url) as client:
            SCENARIOS[scenario](client, url, prefix)
    except KeyboardInterrupt:
        print(f"exited threads={len(threading.enumerate())}", flush=True)
        return 130
    print("exited", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
