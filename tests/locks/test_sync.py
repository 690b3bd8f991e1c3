"""The blocking facade of the locks: ``with mutex:`` from threads, timeouts, loss, and Ctrl-C
while waiting (in a child process, then etcd is read back)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from etcd_recipes import INT64
from etcd_recipes.sync import (
    DistributedMutex,
    DistributedReadWriteLock,
    DistributedSemaphore,
    LockHold,
    LockLostError,
    Op,
    connect,
)

from .helpers import lease_of


@pytest.fixture
def client(etcd_server):
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


@pytest.fixture
def other(etcd_server):
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


def test_with_mutex_from_four_threads(client, etcd_prefix):
    mutex = DistributedMutex(client, etcd_prefix + "m")
    counter = etcd_prefix + "counter"
    inside, overlaps = [0], []

    def worker() -> None:
        for _ in range(5):
            with mutex:
                inside[0] += 1
                overlaps.append(inside[0])
                assert mutex.is_held and mutex.hold is not None
                kv = client.get(counter)
                value = INT64.decode(kv.value) if kv else 0
                time.sleep(0.002)
                client.put(counter, INT64.encode(value + 1))
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert client.get_value(counter, INT64) == 20
    assert max(overlaps) == 1
    assert not mutex.is_held
    mutex.close()


def test_sync_with_lock_timeout_split_form_and_fencing(client, etcd_prefix):
    path = etcd_prefix + "m"
    holder, other = DistributedMutex(client, path), DistributedMutex(client, path)
    entered = False
    with holder.with_lock(timeout=5) as hold:
        assert isinstance(hold, LockHold)
        assert holder.guarded_txn([Op.put(etcd_prefix + "d", b"1")]).succeeded
        with pytest.raises(TimeoutError):
            with other.with_lock(timeout=0.5):
                entered = True
    assert not entered
    # acquire() and release() are separate calls (separate tasks) here: still paired.
    assert other.acquire(timeout=5)
    assert other.is_held and other.fencing_token > hold.fencing_token
    assert other.release() is True
    holder.close()
    other.close()


def test_sync_loss_raises_at_the_end_of_the_block(client, etcd_prefix):
    mutex = DistributedMutex(client, etcd_prefix + "m")
    with pytest.raises(LockLostError):
        with mutex.with_lock() as hold:
            client.lease_revoke(hold.lease_id)
            time.sleep(0.5)
    assert not hold.guarded_txn([Op.put(etcd_prefix + "d", b"x")]).succeeded
    mutex.close()


def test_sync_read_write_lock_and_semaphore(client, etcd_prefix):
    rw = DistributedReadWriteLock(client, etcd_prefix + "rw")
    with rw.read_lock:
        other = DistributedReadWriteLock(client, etcd_prefix + "rw")
        assert other.read_lock.acquire(timeout=2)
        assert other.read_lock.release()
        assert not other.write_lock.acquire(timeout=0.3)  # rw's read lock is held
        other.close()
    sem = DistributedSemaphore(client, etcd_prefix + "sem", 2)
    with sem.with_permit(timeout=2) as permit, sem:
        assert sem.held_permits == 2 and permit.fencing_token > 0
        assert sem.available_permits() == 0
    rw.close()
    sem.close()


CHILD = textwrap.dedent(
    """
    import json, sys
    from etcd_recipes.sync import DistributedMutex, connect

    try:
        with connect(sys.argv[1]) as client:
            mutex = DistributedMutex(client, sys.argv[2])
            print("ready", flush=True)
            try:
                with mutex:
                    print("acquired?!", flush=True)
            except KeyboardInterrupt:
                left = [kv.key.decode() for kv in client.get_prefix(sys.argv[2] + "/")]
                print(json.dumps({"keys": left}), flush=True)
                raise
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
def test_ctrl_c_while_waiting_leaves_no_waiter_key_and_no_lease(
    client, other, etcd_server, etcd_prefix
):
    path = etcd_prefix + "m"
    # next_in_line on another client: a key in etcd of its own, behind the child's.
    holder, next_in_line = DistributedMutex(client, path), DistributedMutex(other, path)
    holder.acquire()
    proc = subprocess.Popen(
        [sys.executable, "-W", "default", "-c", CHILD, etcd_server.url, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while len(client.get_prefix(path + "/").kvs) < 2:  # the child is queued
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child_key = client.get_prefix(path + "/").kvs[1].key
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(next_in_line.acquire(timeout=10)))
        waiter.start()
        while len(client.get_prefix(path + "/").kvs) < 3:  # queued behind the child
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err == ""  # no traceback, no warning
    facts = json.loads(out.splitlines()[-1])
    # Read inside the child's KeyboardInterrupt handler: its waiter key was already gone.
    assert child_key.decode() not in facts["keys"] and len(facts["keys"]) == 2
    assert client.lease_time_to_live(lease_of(child_key)).ttl == -1
    released = time.monotonic()
    holder.release()
    waiter.join(10)
    assert result == [True] and time.monotonic() - released < 1.0
    next_in_line.release()
    holder.close()
    next_in_line.close()


def test_threads_of_one_client_wait_in_its_local_line(client, etcd_prefix):
    """Per thread, as per task: the mutexes of one client on one path take turns in the
    process, in the order their threads asked, behind one key in etcd."""
    path = etcd_prefix + "line"
    holder = DistributedMutex(client, path)
    holder.acquire()
    order: list[int] = []
    mutexes = [DistributedMutex(client, path) for _ in range(4)]

    def take(i: int) -> None:
        with mutexes[i]:
            order.append(i)

    threads = []
    for i in range(4):
        thread = threading.Thread(target=take, args=(i,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10
        while "acquiring" not in repr(mutexes[i]):  # parked before the next one asks
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert [kv.key for kv in client.get_prefix(path + "/").kvs] == [holder.hold.key]
    holder.release()
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3]
    assert client.get_prefix(path + "/").kvs == []
    for m in (holder, *mutexes):
        m.close()
