"""Project-wide test set-up (the fixtures come from the ``etcd_recipes.testing`` plugin).

Ctrl-C tests send SIGINT to child processes and expect Python's ``KeyboardInterrupt``. A
child inherits an *ignored* SIGINT, and Python then installs no handler: a suite started in
the background of a non-interactive shell (``pytest ... &``, where POSIX shells ignore SIGINT
for asynchronous commands) made every such child ignore Ctrl-C and time out. Reset it here, in
every pytest process (xdist workers too), so the tests see what a terminal gives a program.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from etcd_recipes import EtcdClient, ResilienceConfig, connect
from tests.queues.metrics_sink import EventSink


def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
async def metered(etcd_server: Any) -> AsyncIterator[tuple[EtcdClient, EventSink]]:
    """A client whose metrics go to a fresh recording :class:`EventSink`: ``(client, sink)``."""
    sink = EventSink()
    config = ResilienceConfig(metrics=sink)
    async with connect(**etcd_server.client_kwargs(), resilience=config) as client:
        yield client, sink
