"""The value type of a queue follows its codec, and is ``bytes`` without one (PEP 696 defaults,
no ``@overload`` stack). mypy checks this file (``mypy tests/queues/test_typing.py``); under
pytest the functions are only defined, never awaited (their bodies are type assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from typing_extensions import assert_type

from etcd_recipes import (
    INT64,
    JSON,
    UTF8,
    Codec,
    DeadLetter,
    DistributedPriorityQueue,
    DistributedQueue,
    DistributedWorkQueue,
    EtcdClient,
    as_codec,
)
from etcd_recipes import sync as blocking


async def fifo(client: EtcdClient) -> None:
    raw = DistributedQueue(client, "/q")
    assert_type(raw, DistributedQueue[bytes])
    assert_type(await raw.dequeue(), bytes)
    assert_type(await raw.try_dequeue(), bytes | None)
    text = DistributedQueue(client, "/q", codec=UTF8)
    assert_type(text, DistributedQueue[str])
    assert_type(await text.poll(1.0), str | None)
    numbers = DistributedQueue(client, "/q", codec=INT64)
    assert_type(await numbers.dequeue(), int)
    assert_type(DistributedQueue(client, "/q", codec=JSON), DistributedQueue[Any])


async def priority(client: EtcdClient) -> None:
    raw = DistributedPriorityQueue(client, "/pq", minimum_wait_time=0.1)
    assert_type(raw, DistributedPriorityQueue[bytes])
    assert_type(await raw.dequeue(), bytes)
    text = DistributedPriorityQueue(client, "/pq", codec=UTF8)
    assert_type(await text.dequeue(), str)


async def work(client: EtcdClient) -> None:
    raw = DistributedWorkQueue(client, "/wq")
    assert_type(raw, DistributedWorkQueue[bytes])
    assert_type(await raw.dead_letters(), list[DeadLetter[bytes]])
    text = DistributedWorkQueue(client, "/wq", codec=UTF8)
    assert_type(text, DistributedWorkQueue[str])
    assert_type(await text.dead_letters(), list[DeadLetter[str]])


def codecs() -> None:
    assert_type(as_codec(None), Codec[bytes])
    assert_type(as_codec(UTF8), Codec[str])


def facade(client: blocking.EtcdClient) -> None:
    raw = blocking.DistributedQueue(client, "/q")
    assert_type(raw, blocking.DistributedQueue[bytes])
    assert_type(raw.dequeue(), bytes)
    text = blocking.DistributedWorkQueue(client, "/wq", codec=UTF8)
    assert_type(text, blocking.DistributedWorkQueue[str])


def test_the_value_type_defaults_to_bytes() -> None:
    # At run time the default is visible on the type parameter itself.
    (param,) = vars(DistributedQueue)["__parameters__"]
    assert param.__default__ is bytes


def test_mypy_accepts_these_assertions() -> None:
    # The assertions above are only checked by mypy: run it here, so the suite enforces them.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(Path(__file__))],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
