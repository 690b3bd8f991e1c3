"""The generated blocking twins: a selector whose ``take_leadership`` runs in a thread, the
observer's events as a plain iterator, and Ctrl-C in a blocked
campaign (the candidacy is withdrawn before the KeyboardInterrupt reaches the caller)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etcd_recipes import Elected, LeadershipLostError, LeadershipTerm, Vacated
from etcd_recipes.sync import LeaderLatch, LeaderObserver, LeaderSelector, Op, connect

HELPER = Path(__file__).with_name("proc_helper.py")


@pytest.fixture
def client(etcd_server: Any) -> Iterator[Any]:
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_blocking_selector_runs_take_leadership_in_a_thread(client, etcd_prefix):
    path, data = etcd_prefix + "election", etcd_prefix + "data"
    seen: list[tuple[int, bool, bool]] = []
    relinquished: list[int] = []
    flags: list[bool] = []
    caller = threading.current_thread()

    def take_leadership(term: LeadershipTerm) -> None:
        # A plain function in a worker thread; it may call the facade.
        committed = client.txn([term.compare()], [Op.put(data, b"led")]).succeeded
        seen.append((term.fencing_token, committed, threading.current_thread() is caller))

    def relinquish(term: LeadershipTerm) -> None:
        relinquished.append(term.fencing_token)

    with LeaderSelector(client, path, take_leadership, relinquish=relinquish) as selector:
        selector.add_leadership_listener(flags.append)
        term = selector.run()
        assert term is not None and not term.is_current
        assert seen == [(term.fencing_token, True, False)]
        assert relinquished == [term.fencing_token]
        assert client.get(data).value == b"led"
        deadline = time.monotonic() + 5
        while flags != [True, False] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flags == [True, False]
    assert client.get_prefix(etcd_prefix + "election/").kvs == []


def test_blocking_take_leadership_polls_is_current_after_a_loss(client, etcd_prefix):
    path = etcd_prefix + "election"
    entered = threading.Event()

    def take_leadership(term: LeadershipTerm) -> None:
        entered.set()
        while term.is_current:  # a thread cannot be cancelled: it watches the term instead
            time.sleep(0.02)

    selector = LeaderSelector(client, path, take_leadership)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            selector.run()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(5)
    client.lease_revoke(selector.term.lease_id)
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LeadershipLostError)
    assert not selector.is_leader
    selector.close()


def test_blocking_observer_and_latch(client, etcd_prefix):
    path = etcd_prefix + "election"
    with LeaderObserver(client, path) as observer:
        events = observer.events()
        assert next(events) == Vacated()
        with LeaderLatch(client, path, client_id="sync-latch") as latch:
            assert latch.await_leadership(timeout=5)
            assert next(events) == Elected("sync-latch", latch.fencing_token)
            assert observer.current_leader == "sync-latch"
            assert [p.client_id for p in latch.participants()] == ["sync-latch"]
        assert next(events) == Vacated()
        events.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("mode", ["sync-latch", "sync-selector"])
def test_ctrl_c_in_a_blocked_campaign_withdraws_it(client, etcd_server, etcd_prefix, mode):
    path = etcd_prefix + "election"
    with LeaderLatch(client, path, client_id="holder") as holder:
        assert holder.await_leadership(timeout=5)
        leader = client.get(path + "/LEADER")
        proc = subprocess.Popen(
            [sys.executable, "-W", "default", str(HELPER), mode, etcd_server.url, path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert "ready" in ready, ready + (proc.stderr.read() if proc.stderr else "")
            # Wait until the campaign is registered and blocked.
            deadline = time.monotonic() + 10
            while client.get(f"{path}/participants/{mode}") is None:
                assert time.monotonic() < deadline, "the candidate never registered"
                time.sleep(0.02)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:  # pragma: no cover - only on failure
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err
        assert err == "", err
        lines = out.splitlines()
        assert lines[-1] == "exited", out
        facts = json.loads(lines[-2])
        # Seen from inside the KeyboardInterrupt handler: the candidacy was already withdrawn.
        assert facts["participant"] is False
        assert facts["mine"] is False and facts["leader"] == leader.text
        assert client.get(f"{path}/participants/{mode}") is None
        assert client.get(path + "/LEADER") == leader
