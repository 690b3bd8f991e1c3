"""Client misuse fails fast with a specific error instead of hanging: another event loop,
after aclose(), before open(), and in a child process after fork()."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest

from etcd_recipes import (
    ClientClosedError,
    ForkedProcessError,
    UsageError,
    WrongEventLoopError,
    connect,
)


def _in_new_loop_in_thread(make_coro) -> BaseException | None:
    """Run ``make_coro()`` with ``asyncio.run`` in a fresh thread; return what it raised."""
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            asyncio.run(make_coro())
        except BaseException as exc:
            box[0] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the call hung"
    return box[0]


async def test_client_used_from_another_loop_in_a_thread(etcd_client, etcd_prefix):
    key = etcd_prefix + "k"
    await etcd_client.put(key, b"v")

    async def use_get():
        await etcd_client.get(key)

    async def use_put():
        await etcd_client.put(key, b"other")

    async def use_watch():
        etcd_client.watch(key)

    async def use_lease():
        await etcd_client.lease(5).grant()

    for make in (use_get, use_put, use_watch, use_lease):
        err = _in_new_loop_in_thread(make)
        assert isinstance(err, WrongEventLoopError), repr(err)
        assert isinstance(err, RuntimeError)  # also a built-in RuntimeError
    # The client still works on its own loop and nothing was written.
    assert (await etcd_client.get(key)).value == b"v"  # type: ignore[union-attr]


def test_client_created_in_one_asyncio_run_used_in_another(etcd_server):
    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(connect(**etcd_server.client_kwargs()).open())

        async def use():
            await client.status()

        # Another loop in a thread, and another asyncio.run in this thread.
        err = _in_new_loop_in_thread(use)
        assert isinstance(err, WrongEventLoopError), repr(err)
        with pytest.raises(WrongEventLoopError):
            asyncio.run(use())
        # The owning loop can still use and close it.
        loop.run_until_complete(use())
        loop.run_until_complete(client.aclose())
    finally:
        loop.close()


async def test_calls_after_aclose(etcd_server, etcd_prefix):
    client = connect(**etcd_server.client_kwargs())
    with pytest.raises(ClientClosedError, match="not open"):
        await client.get(etcd_prefix + "k")  # before open()
    await client.open()
    assert client.is_open
    async with client.watch(etcd_prefix + "k") as watch:
        lease = await client.lease(10).grant()
        await client.aclose()
        assert not client.is_open
        # Open watches end with the client (no hang).
        with pytest.raises(ClientClosedError):
            await asyncio.wait_for(watch.__anext__(), 5)
    for call in (
        lambda: client.get(etcd_prefix + "k"),
        lambda: client.put(etcd_prefix + "k", b"v"),
        lambda: client.txn([], []),
        lambda: client.status(),
        lambda: client.lease_grant(5),
        lambda: client.lease(5).grant(),
        lambda: client.lease_keep_alive_once(lease.id),
    ):
        with pytest.raises(ClientClosedError):
            await asyncio.wait_for(call(), 5)
    with pytest.raises(ClientClosedError):
        client.watch(etcd_prefix + "k")
    with pytest.raises(ClientClosedError):
        await client.open()  # a closed client cannot be reopened
    await client.aclose()  # idempotent
    assert issubclass(ClientClosedError, UsageError)


_FORK_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from etcd_recipes import connect

    async def parent():
        client = await connect(sys.argv[1]).open()
        await client.put("/fork/k", b"parent")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                asyncio.run(client.get("/fork/k"))
                result = "no error"
            except BaseException as exc:
                result = type(exc).__name__ + ": " + str(exc)
            os.write(w, result.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            child = f.read()
        _, status = os.waitpid(pid, 0)
        # The parent's client is unaffected by the child.
        kv = await client.get("/fork/k")
        await client.aclose()
        print(child)
        print("parent:", kv.value.decode(), "child-exit:", os.waitstatus_to_exitcode(status))

    asyncio.run(parent())
    """
)


def test_client_used_after_fork(etcd_server):
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, etcd_server.url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    child, parent = proc.stdout.strip().splitlines()[-2:]
    assert child.startswith(ForkedProcessError.__name__ + ":"), child
    assert "fork" in child
    assert parent == "parent: parent child-exit: 0"
