"""The library's warnings never reach stderr through Python's last-resort handler in a program
that configured no logging (issue 32, item 14): the ``etcd_recipes`` logger has a
``NullHandler``. A program that configures logging still sees them (the control case, so the
test can fail)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import asyncio, logging, sys
from etcd_recipes import DistributedMutex, connect

async def main(endpoint):
    async with connect(endpoint) as client:
        mutex = DistributedMutex(client, "/nullhandler/lock")
        assert await mutex.acquire()
        await client.lease_revoke(mutex.hold.lease_id)  # the hold is lost: a WARNING
        for _ in range(200):
            if mutex.hold.is_lost:
                break
            await asyncio.sleep(0.05)
        assert mutex.hold.is_lost
        await mutex.aclose()

if sys.argv[2] == "configured":
    logging.basicConfig(level=logging.WARNING)
asyncio.run(main(sys.argv[1]))
print("done")
"""


@pytest.mark.parametrize("logging_mode", ["unconfigured", "configured"])
def test_library_warnings_reach_stderr_only_when_logging_is_configured(etcd_server, logging_mode):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, etcd_server.endpoint, logging_mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    if logging_mode == "unconfigured":
        assert done.stderr == "", done.stderr
    else:
        assert "hold lost" in done.stderr, done.stderr
