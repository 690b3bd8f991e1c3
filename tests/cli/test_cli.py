"""The etcd-recipes command, in-process (typer's runner) and as a subprocess, against real etcd
servers and real recipes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("typer")

from typer.testing import CliRunner

from etcd_recipes import (
    DistributedAtomicLong,
    DistributedMutex,
    DistributedWorkQueue,
    LeaderLatch,
    WorkQueueConfig,
    connect,
)
from etcd_recipes.cli import Exit, app
from etcd_recipes.testing import find_etcdctl_binary

runner = CliRunner()


def cli(server, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--endpoints", server.endpoint, *args])
    return result.exit_code, result.stdout, result.stderr


def doc(out: str) -> dict:
    data = json.loads(out)
    assert data["schema"] == "etcd-recipes/cli/v1"
    return data["data"]


def test_status(etcd_server) -> None:
    code, out, _ = cli(etcd_server, "-o", "json", "status")
    assert code == 0
    data = doc(out)
    assert data["revision"] > 0 and [m["role"] for m in data["members"]] == ["leader"]
    code, out, _ = cli(etcd_server, "status")
    assert code == 0 and "revision" in out and "leader" in out


async def test_lock_show_sees_the_library_mutex_and_etcdctl_lock(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}lk"
    async with connect(etcd_server.endpoint) as client:
        mutex = DistributedMutex(client, path)
        assert await mutex.acquire()
        # An etcdctl lock waiting behind it, on the same path.
        waiter = subprocess.Popen(
            [find_etcdctl_binary(), f"--endpoints={etcd_server.endpoint}", "lock", path, "true"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while (await client.count(path + "/")) < 2:
                assert time.monotonic() < deadline, "etcdctl lock never queued"
                await asyncio.sleep(0.05)
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "lock", "show", path
            )
            assert code == 0, out
            data = doc(out)
            assert data["holder"]["fencing_token"] == mutex.fencing_token
            assert data["holder"]["lease"] == f"{mutex.hold.lease_id:x}"
            assert len(data["waiters"]) == 1 and data["waiters"][0]["role"] == "waiter"
            assert 0 < data["holder"]["ttl_left"] <= 2
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "lock", "ls", etcd_prefix
            )
            assert doc(out)["locks"] == [
                {"path": path, "contenders": 2, "fencing_token": mutex.fencing_token}
            ]
        finally:
            await mutex.release()
            waiter.wait(10)
            await mutex.aclose()
        assert waiter.returncode == 0  # etcdctl got the lock after our release
        code, _, err = await asyncio.to_thread(cli, etcd_server, "lock", "show", path)
        assert code == Exit.NOT_FOUND and "nobody" in err


async def test_lock_break_needs_yes_and_revokes_the_holder(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}lk"
    async with connect(etcd_server.endpoint) as client:
        mutex = DistributedMutex(client, path)
        assert await mutex.acquire()
        code, _, err = await asyncio.to_thread(cli, etcd_server, "lock", "break", path)
        assert code == Exit.REFUSED and "--yes" in err
        assert mutex.is_held
        code, out, _ = await asyncio.to_thread(cli, etcd_server, "lock", "break", path, "--yes")
        assert code == 0 and "revoked lease" in out
        deadline = time.monotonic() + 5
        while not mutex.hold.is_lost:
            assert time.monotonic() < deadline, "the holder never noticed"
            await asyncio.sleep(0.05)
        assert await client.count(path + "/") == 0
        await mutex.aclose()


def test_lock_run_holds_exports_a_growing_token_and_a_second_waits(
    etcd_server, etcd_prefix, tmp_path
) -> None:
    path = f"{etcd_prefix}run"
    log = tmp_path / "log"
    script = f"echo start $ETCD_RECIPES_FENCING_TOKEN >> {log}; sleep 1; echo end >> {log}"
    base = [sys.executable, "-m", "etcd_recipes.cli", "--endpoints", etcd_server.endpoint]
    first = subprocess.Popen([*base, "lock", "run", path, "--", "sh", "-c", script])
    time.sleep(0.3)
    second = subprocess.Popen([*base, "lock", "run", path, "--", "sh", "-c", script])
    assert first.wait(30) == 0 and second.wait(30) == 0
    lines = log.read_text().split("\n")
    assert [ln.split()[0] for ln in lines if ln] == ["start", "end", "start", "end"]  # no overlap
    tokens = [int(ln.split()[1]) for ln in lines if ln.startswith("start")]
    assert tokens[1] > tokens[0]


def test_lock_run_kills_its_child_when_the_lock_is_lost(etcd_server, etcd_prefix, tmp_path) -> None:
    path = f"{etcd_prefix}lost"
    marker = tmp_path / "child.pid"
    script = f"echo $$ > {marker}; trap 'exit 0' TERM; while true; do sleep 0.1; done"
    base = [sys.executable, "-m", "etcd_recipes.cli", "--endpoints", etcd_server.endpoint]
    proc = subprocess.Popen(
        [*base, "lock", "run", path, "--grace", "1", "--", "sh", "-c", script],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text().strip():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(marker.read_text())
    code, _, _ = cli(etcd_server, "lock", "break", path, "--yes")  # the lease is revoked: lost
    assert code == 0
    assert proc.wait(20) == Exit.ERROR
    assert "lock lost" in proc.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


async def test_election_show_and_observe(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}el"
    async with connect(etcd_server.endpoint) as client:
        code, _, _err = await asyncio.to_thread(cli, etcd_server, "election", "show", path)
        assert code == Exit.NOT_FOUND
        async with LeaderLatch(client, path, client_id="node-1") as latch:
            assert await latch.await_leadership(timeout=10)
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "election", "show", path
            )
            data = doc(out)
            assert data["leader"] == "node-1" and data["fencing_token"] == latch.fencing_token
            assert data["participants"] == [{"client_id": "node-1", "is_leader": True}]
            assert data["value"] is None and data["value_encoding"] is None
            await latch.proclaim("10.0.0.7:8080")
            code, out, _ = await asyncio.to_thread(cli, etcd_server, "election", "show", path)
            assert code == 0 and "value: 10.0.0.7:8080" in out.splitlines()
            await latch.proclaim(b"\xff\x00")
            code, out, _ = await asyncio.to_thread(
                cli, etcd_server, "-o", "json", "election", "show", path
            )
            shown = doc(out)
            assert (shown["value"], shown["value_encoding"]) == ("/wA=", "base64")
            observed = asyncio.create_task(
                asyncio.to_thread(cli, etcd_server, "election", "observe", path, "--count", "1")
            )
            await asyncio.sleep(1.0)
        code, out, _ = await asyncio.wait_for(observed, 20)
        assert code == 0
        assert out.splitlines() == [
            f"elected node-1 (fencing token {data['fencing_token']})",
            "vacated",
        ]


async def test_counter_get_set(etcd_server, etcd_prefix) -> None:
    path = f"{etcd_prefix}n"
    code, _, _ = await asyncio.to_thread(cli, etcd_server, "counter", "get", path)
    assert code == Exit.NOT_FOUND
    async with connect(etcd_server.endpoint) as client:
        assert await client.get(path) is None  # the read created nothing
        counter = DistributedAtomicLong(client, path)
        await counter.add(41)
        code, out, _ = await asyncio.to_thread(cli, etcd_server, "counter", "get", path)
        assert (code, out.strip()) == (0, "41")
        code, _, _ = await asyncio.to_thread(cli, etcd_server, "counter", "set", path, "--", "-7")
        assert code == 0 and await counter.get() == -7
        await client.put(f"{etcd_prefix}text", "hello")
        code, _, err = await asyncio.to_thread(
            cli, etcd_server, "counter", "get", f"{etcd_prefix}text"
        )
        assert code == Exit.REFUSED and "not a counter" in err
        await counter.aclose()


async def test_dlq_requeue_delivers_once_and_dry_run_writes_nothing(
    etcd_server, etcd_prefix
) -> None:
    path = f"{etcd_prefix}jobs"
    config = WorkQueueConfig(visibility_timeout=1, max_deliveries=1)
    async with connect(etcd_server.endpoint) as client:
        async with DistributedWorkQueue(client, path, config) as queue:
            await queue.enqueue(b"poison")
            await queue.receive()
            await client.lease_revoke(queue.lease_id)  # a crashed consumer
        other = DistributedWorkQueue(client, path, config)
        assert await other.try_receive() is None
        [dead] = await other.dead_letters()
        code, out, _ = await asyncio.to_thread(cli, etcd_server, "-o", "json", "dlq", "ls", path)
        assert doc(out)["dead_letters"] == [
            {"id": dead.id, "attempts": dead.attempts, "size": 6, "reason": dead.reason}
        ]
        before = (await client.status()).revision
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "dlq", "requeue", path, "--all", "--dry-run"
        )
        assert code == 0 and "would requeue 1" in out
        assert (await client.status()).revision == before  # nothing written
        code, _, _err = await asyncio.to_thread(cli, etcd_server, "dlq", "requeue", path, "--all")
        assert code == Exit.REFUSED
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "dlq", "requeue", path, "--id", dead.id, "--yes"
        )
        assert code == 0 and "requeued 1" in out
        rev = (await client.status()).revision
        code, out, _ = await asyncio.to_thread(
            cli, etcd_server, "dlq", "requeue", path, "--id", dead.id, "--yes"
        )
        assert (code, out.strip()) == (
            0,
            f"requeued 0 item(s): -; already requeued (back in the queue): {dead.id}",
        )
        assert (await client.status()).revision == rev  # twice: no change
        item = await other.receive(timeout=5)
        assert item is not None and item.value == b"poison"
        await item.ack()
        assert await other.try_receive() is None  # exactly once
        await other.aclose()


async def test_watch_prints_events(etcd_server, etcd_prefix) -> None:
    async with connect(etcd_server.endpoint) as client:
        task = asyncio.create_task(
            asyncio.to_thread(cli, etcd_server, "-o", "json", "watch", etcd_prefix, "--count", "2")
        )
        await asyncio.sleep(1.0)
        await client.put(f"{etcd_prefix}a", "1")
        await client.delete(f"{etcd_prefix}a")
        code, out, _ = await asyncio.wait_for(task, 20)
    assert code == 0
    events = [json.loads(line)["data"] for line in out.splitlines()]
    assert [(e["event"], e["key"]) for e in events] == [
        ("PUT", f"{etcd_prefix}a"),
        ("DELETE", f"{etcd_prefix}a"),
    ]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["lock", "show", "relative/path"], Exit.USAGE, "starts with '/'"),
        (["lock", "show"], Exit.USAGE, "Missing argument"),
        (["counter", "set", "/x", "99999999999999999999"], Exit.USAGE, "int64"),
        (["dlq", "purge", "/q"], Exit.USAGE, "--id"),
        (["lock", "frobnicate"], Exit.USAGE, "No such command"),
    ],
)
def test_bad_input_is_one_line_and_the_right_code(etcd_server, args, code, message) -> None:
    result = runner.invoke(app, ["--endpoints", etcd_server.endpoint, *args])
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_closed_port_is_an_error_not_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "etcd_recipes.cli", "--endpoints", "127.0.0.1:1", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == Exit.ERROR
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("etcd-recipes: error:")


def test_dev_starts_answers_and_stops_on_sigterm(tmp_path) -> None:
    psutil = pytest.importorskip("psutil")
    proc = subprocess.Popen(
        [sys.executable, "-m", "etcd_recipes.cli", "dev", "--port", "0", "--ephemeral"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not any(line.startswith("export ETCDCTL_ENDPOINTS=") for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, lines
        time.sleep(0.05)
    endpoint = next(line for line in lines if line.startswith("export")).split("=", 1)[1].strip()
    etcd_pid = int(re.search(r"pid (\d+)", lines[0]).group(1))

    async def use() -> str:
        async with connect(endpoint) as client:
            await client.put("/dev/k", "v")
            return (await client.get("/dev/k")).text

    assert asyncio.run(use()) == "v"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert (
        not psutil.pid_exists(etcd_pid) or psutil.Process(etcd_pid).status() == psutil.STATUS_ZOMBIE
    )
    assert "etcd stopped" in proc.stderr.read()
