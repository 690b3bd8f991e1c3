"""Fixtures of the client's tests."""

from __future__ import annotations

import pytest

import etcd_recipes.client.watch_hub as watch_hub


@pytest.fixture
def ordered_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat the test server (etcd 3.5.1) as one that orders its progress answers after the
    events they cover, as etcd 3.5.8 and later do: the trusted path of stream-wide progress,
    which no server on these machines takes by itself. Only the version predicate is replaced;
    the server and its answers are real. Tests using it keep the stream free of events in
    flight when they ask (3.5.1 may send the answer early only past queued events)."""
    monkeypatch.setattr(watch_hub, "progress_is_ordered", lambda version: True)
