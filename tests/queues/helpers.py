"""Helpers shared by the queue tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from etcd_recipes import EtcdClient


async def keys(client: EtcdClient, prefix: str) -> list[str]:
    """Every key under ``prefix`` (sorted), as text."""
    return [kv.key_text for kv in await client.get_prefix(prefix)]


async def server_leases(client: EtcdClient) -> set[int]:
    """The ids of the leases that exist on the server (a raw LeaseLeases call)."""
    from aetcd import rpc as pb

    stub = pb.LeaseStub(client._channel_or_raise())
    resp = await stub.LeaseLeases(pb.LeaseLeasesRequest(), metadata=client._runner.metadata())
    return {int(lease.ID) for lease in resp.leases}


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c script args...`` with its output piped."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> Any:
    """Wait for ``proc`` to exit 0 and return the JSON on its last output line."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


class Transactions:
    """The transactions a client sent while :func:`transactions` ran: each request's
    protobuf, and whether etcd applied its success branch."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, bool]] = []
        self.other: list[str] = []  # other unary RPCs, by method

    @staticmethod
    def _writes(request: Any) -> bool:
        for op in [*request.success, *request.failure]:
            kind = op.WhichOneof("request")
            if kind in ("request_put", "request_delete_range"):
                return True
            if kind == "request_txn" and Transactions._writes(op.request_txn):
                return True
        return False

    @staticmethod
    def nested(request: Any) -> bool:
        return any(
            op.WhichOneof("request") == "request_txn" for op in [*request.success, *request.failure]
        )

    @property
    def writes(self) -> list[tuple[Any, bool]]:
        """The transactions that may write (each one a raft proposal in etcd)."""
        return [(req, ok) for req, ok in self.sent if self._writes(req)]

    @property
    def failed_writes(self) -> int:
        return sum(1 for _, ok in self.writes if not ok)


@contextmanager
def transactions(client: EtcdClient) -> Iterator[Transactions]:
    """Record the transactions ``client`` sends while the block runs (a wrapper around the
    client's one RPC funnel; no timing)."""
    seen = Transactions()
    call = client._call

    async def recording(op: str, method: str, stub: Any, request: Any, *a: Any, **k: Any) -> Any:
        response = await call(op, method, stub, request, *a, **k)
        if method == "Txn":
            seen.sent.append((request, bool(response.succeeded)))
        else:
            seen.other.append(method)
        return response

    client._call = recording  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del client._call
