"""Fixtures of the metrics tests: a fresh recording sink and a client reporting to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from etcd_recipes import EtcdClient, ResilienceConfig, connect

from .recording import RecordingMetrics


@pytest.fixture
def sink() -> RecordingMetrics:
    return RecordingMetrics()


@pytest.fixture
async def client(etcd_server: Any, sink: RecordingMetrics) -> AsyncIterator[EtcdClient]:
    config = ResilienceConfig(metrics=sink)
    async with connect(**etcd_server.client_kwargs(), resilience=config) as c:
        yield c
