"""The value type of a queue follows its codec, and is ``bytes`` without one (PEP 696 defaults,
no ``@overload`` stack). mypy checks this file (``mypy tests/queues/test_typing.py``); under
pytest the functions are only defined, never awaited (their bodies are type assertions)."""

from __future__ import annotations

import subprocess
import sys
import uuid
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
    WorkItem,
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
    assert_type(await raw.receive(), WorkItem[bytes])
    assert_type((await raw.receive()).value, bytes)
    await raw.enqueue("text is UTF-8 encoded")  # str is accepted where T is bytes
    await raw.enqueue_all([b"a", "b"])
    text = DistributedWorkQueue(client, "/wq", codec=UTF8)
    assert_type(text, DistributedWorkQueue[str])
    assert_type(await text.dead_letters(), list[DeadLetter[str]])
    assert_type((await text.dead_letters())[0].value, str)
    assert_type(await text.try_receive(), WorkItem[str] | None)
    assert_type((await text.receive(1.0)), WorkItem[str] | None)
    async for item in text:
        assert_type(item, WorkItem[str])
    numbers = DistributedWorkQueue(client, "/wq", codec=INT64)
    await numbers.enqueue(5, delay=1.0)
    await numbers.enqueue_all([1, 2])


async def iteration(client: EtcdClient) -> None:
    async for value in DistributedQueue(client, "/q", codec=UTF8):
        assert_type(value, str)
    async for job in DistributedPriorityQueue(client, "/pq"):
        assert_type(job, bytes)
    for blocking_value in blocking.DistributedQueue(blocking.connect(), "/q", codec=INT64):
        assert_type(blocking_value, int)


def codecs() -> None:
    assert_type(as_codec(None), Codec[bytes])
    assert_type(as_codec(UTF8), Codec[str])


def facade(client: blocking.EtcdClient) -> None:
    raw = blocking.DistributedQueue(client, "/q")
    assert_type(raw, blocking.DistributedQueue[bytes])
    assert_type(raw.dequeue(), bytes)
    text = blocking.DistributedWorkQueue(client, "/wq", codec=UTF8)
    assert_type(text, blocking.DistributedWorkQueue[str])
    assert_type(text.receive().value, str)
    raw.enqueue("text")


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


# Each line must be rejected by mypy: a value of the wrong type for the queue's codec.
REJECTED = """
import pydantic
from etcd_recipes import (
    INT64, DistributedPriorityQueue, DistributedQueue, DistributedWorkQueue, EtcdClient,
    PydanticCodec,
)
from etcd_recipes import sync as blocking

class Order(pydantic.BaseModel):
    id: int

async def wrong(client: EtcdClient, facade: blocking.EtcdClient) -> None:
    orders = DistributedQueue(client, "/q", codec=PydanticCodec(Order))
    await orders.enqueue("oops")  # rejected
    await orders.enqueue_all([Order(id=1), "oops"])  # rejected
    await DistributedPriorityQueue(client, "/p", codec=INT64).enqueue("1", 0)  # rejected
    await DistributedWorkQueue(client, "/w", codec=PydanticCodec(Order)).enqueue(b"x")  # rejected
    blocking.DistributedQueue(facade, "/q", codec=INT64).enqueue("1")  # rejected
    item = await DistributedWorkQueue(client, "/w", codec=INT64).receive()
    item.value.upper()  # rejected: an int has no upper()
"""


def test_mypy_rejects_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    # A module name of its own per run: mypy's incremental cache remembers a module's file by
    # name, and a second run would otherwise read the first run's (deleted) temporary path.
    snippet = tmp_path / f"wrong_types_{uuid.uuid4().hex}.py"
    snippet.write_text(REJECTED.lstrip("\n"), encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(snippet)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = {
        int(line.split(":")[1])
        for line in done.stdout.splitlines()
        if line.startswith(str(snippet)) and ": error:" in line
    }
    marked = {
        n for n, line in enumerate(snippet.read_text().splitlines(), 1) if "# rejected" in line
    }
    assert len(marked) == 6
    assert lines == marked, done.stdout
