"""The cancellation contract's machinery, without etcd: run_shielded and abort_guard finish
their cleanup whatever cancels them, then re-raise the caller's cancellation unchanged."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from etcd_recipes._core.shield import abort_guard, run_shielded


async def _slow_cleanup(done: list[str]) -> None:
    await asyncio.sleep(0.2)
    done.append("cleaned")


async def test_run_shielded_survives_repeated_native_cancels():
    done: list[str] = []
    started = asyncio.Event()

    async def victim() -> None:
        started.set()
        await run_shielded(lambda: _slow_cleanup(done))

    task = asyncio.create_task(victim())
    await started.wait()
    for _ in range(10):
        await asyncio.sleep(0.01)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == ["cleaned"]


async def test_run_shielded_survives_anyio_cancellation():
    done: list[str] = []
    with anyio.move_on_after(0.05) as scope:
        await run_shielded(lambda: _slow_cleanup(done))
    assert done == ["cleaned"]
    assert scope.cancel_called


async def test_run_shielded_is_bounded_and_swallows_errors():
    async def hangs() -> None:
        await asyncio.sleep(3600)

    async def fails() -> None:
        raise RuntimeError("boom")

    with anyio.fail_after(2):
        await run_shielded(hangs, timeout=0.1)
    await run_shielded(fails)  # logged, not raised


@pytest.mark.parametrize("how", ["task-cancel", "fail_after", "asyncio-timeout", "error"])
async def test_abort_guard_cleans_up_and_reraises_unchanged(how):
    done: list[str] = []

    async def body() -> None:
        async with abort_guard(lambda: _slow_cleanup(done)):
            if how == "error":
                raise KeyError("original")
            await asyncio.sleep(3600)

    if how == "task-cancel":
        task = asyncio.create_task(body())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif how == "fail_after":
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.05):
                await body()
    elif how == "asyncio-timeout":
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await body()
    else:
        with pytest.raises(KeyError, match="original"):
            await body()
    assert done == ["cleaned"]


async def test_abort_guard_runs_nothing_on_success():
    done: list[str] = []
    async with abort_guard(lambda: _slow_cleanup(done)):
        pass
    assert done == []
