"""Server processes for the contrib tests (see ``servers.py``), started and reaped here."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


class Server:
    def __init__(self, proc: asyncio.subprocess.Process, ident: str, port: int) -> None:
        self.proc, self.id, self.port = proc, ident, port

    def __repr__(self) -> str:
        return f"Server({self.id}, port={self.port}, pid={self.proc.pid})"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    async def leave(self) -> None:
        """SIGTERM: unregister, drain, stop with grace; wait for a clean exit."""
        self.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.proc.wait(), START_TIMEOUT) == 0


class Servers:
    """Starts servers that register themselves as instances of ``name`` under ``path``."""

    def __init__(self, endpoint: str, path: str, name: str) -> None:
        self.endpoint, self.path, self.name = endpoint, path, name
        self.started: list[Server] = []

    async def start(self, kind: str, ident: str, *flags: str) -> Server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.contrib.servers",
            kind,
            self.endpoint,
            self.path,
            self.name,
            ident,
            *flags,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        assert line.startswith(b"REGISTERED "), (ident, line, await proc.wait())
        server = Server(proc, ident, int(line.split()[1]))
        self.started.append(server)
        return server

    async def aclose(self) -> None:
        for server in self.started:
            if server.proc.returncode is None:
                server.kill()
            await server.proc.wait()


class SyncServers:
    """:class:`Servers` for blocking tests (no event loop)."""

    def __init__(self, endpoint: str, path: str, name: str) -> None:
        self.endpoint, self.path, self.name = endpoint, path, name
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, kind: str, ident: str, *flags: str) -> int:
        args = [kind, self.endpoint, self.path, self.name, ident, *flags]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.contrib.servers", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server exits (EOF) rather than hang on failure
        assert line.startswith(b"REGISTERED "), (ident, line)
        return int(line.split()[1])

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
