"""Fixtures for the blocking facade tests (real etcd from the ``etcd_recipes.testing`` plugin)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from etcd_recipes.sync import EtcdClient, connect


@pytest.fixture
def client(etcd_server: Any) -> Iterator[EtcdClient]:
    """A connected sync client, closed after the test.

    Example::

        def test_put(client, etcd_prefix):
            client.put(etcd_prefix + "k", "v")
    """
    with connect(**etcd_server.client_kwargs()) as c:
        yield c


class Trace:
    """Records which facade entry points ran and on which thread their target executed (for
    ``direct`` calls the target is the ``Unary`` plan, made in the calling thread)."""

    def __init__(self, client: EtcdClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, threading.Thread]] = []
        rt = client._rt
        for kind in ("call", "call_closing", "call_sync", "next", "direct"):
            monkeypatch.setattr(rt, kind, self._wrap(kind, getattr(rt, kind)))

    def _wrap(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def traced(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            name = getattr(fn, "__name__", repr(fn))

            if kind in ("call_sync", "direct"):

                def target(*a: Any, **k: Any) -> Any:
                    calls.append((kind, name, threading.current_thread()))
                    return fn(*a, **k)

            else:

                async def target(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                    calls.append((kind, name, threading.current_thread()))
                    return await fn(*a, **k)

            return original(target, *args, **kwargs)

        return traced

    def names(self) -> list[str]:
        """Names of the async functions that ran, in order."""
        return [name for _, name, _ in self.calls]

    def threads(self, name: str | None = None) -> set[threading.Thread]:
        """The threads the async functions (or those called ``name``) ran on."""
        return {thread for _, n, thread in self.calls if name is None or n == name}


@pytest.fixture
def trace(client: EtcdClient, monkeypatch: pytest.MonkeyPatch) -> Trace:
    """Spy on ``client``'s runtime: which async functions ran, and on which thread.

    Example::

        def test_get(client, trace):
            client.get("/k")
            assert trace.names() == ["get"]
    """
    return Trace(client, monkeypatch)


def raised_by_closing(
    client: EtcdClient, blocked: Callable[[], object], after: float
) -> BaseException:
    """Run ``blocked()`` in a thread, close ``client`` ``after`` seconds later, and return what
    the thread raised (asserting that it ended, and raised)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            blocked()
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(after)
    client.close()
    thread.join(15)
    assert not thread.is_alive()
    assert len(caught) == 1
    return caught[0]
