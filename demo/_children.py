"""Helpers for demo episodes that run parts of themselves as child processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys


async def spawn(module: str, *args: str) -> asyncio.subprocess.Process:
    """Start ``python -m <module> <args>`` with its stdout piped back to us."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=subprocess.PIPE
    )


async def reap(*procs: asyncio.subprocess.Process) -> None:
    """Terminate what is still running and wait for every process."""
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
    for proc in procs:
        await proc.wait()
