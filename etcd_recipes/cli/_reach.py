"""A refused endpoint fails the command at once: a plain TCP connect to each endpoint runs
beside the client's own connection, and when every endpoint refuses it (nothing listens
there), the command stops with ``cannot reach etcd at HOST:PORT: connection refused`` instead
of waiting out ``--dial-timeout``.

Guaranteed: the probe only ever decides "refused"; an endpoint that accepts, times out, is
not a ``host:port`` (a ``unix://`` socket) or fails in any other way leaves the decision to
the client. Not guaranteed: an endpoint that starts listening within the probe's moment is
still reported refused.
"""

from __future__ import annotations

import asyncio
import contextlib


def _address(endpoint: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``, ``http(s)://host:port`` or ``[v6]:port``, else None."""
    text = endpoint.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in text:
        return None
    return host.strip("[]"), int(port)


async def _refuses(host: str, port: int, timeout: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return True
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


async def all_refuse(endpoints: str, timeout: float) -> bool:
    """Whether every endpoint in ``endpoints`` (comma-separated) refuses a TCP connection."""
    addresses = [_address(e) for e in endpoints.split(",") if e.strip()]
    if not addresses or any(a is None for a in addresses):
        return False
    found = await asyncio.gather(*(_refuses(h, p, timeout) for h, p in filter(None, addresses)))
    return all(found)
