"""``get_value``/``put_value`` are typed by their codec, async and blocking. mypy checks this
file (``mypy tests/client/test_typing.py``); under pytest the functions are only defined, never
awaited (their bodies are type assertions), and a second run proves mypy rejects a value of the
wrong type."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from typing_extensions import assert_type

from etcd_recipes import BYTES, INT64, JSON, UTF8, EtcdClient
from etcd_recipes import sync as blocking

ROOT = Path(__file__).resolve().parents[2]


async def typed_reads(client: EtcdClient) -> None:
    assert_type(await client.get_value("/k", INT64), int | None)
    assert_type(await client.get_value("/k", INT64, default=0), int)
    assert_type(await client.get_value("/k", UTF8, default=None), str | None)
    assert_type(await client.get_value("/k", BYTES), bytes | None)
    assert_type(await client.get_value("/k", JSON), Any | None)
    await client.put_value("/k", 7, INT64)
    await client.put_value("/k", "text", UTF8)


def facade(client: blocking.EtcdClient) -> None:
    assert_type(client.get_value("/k", INT64), int | None)
    assert_type(client.get_value("/k", INT64, default=0), int)
    client.put_value("/k", 7, INT64)


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_mypy_accepts_these_assertions() -> None:
    done = _mypy(Path(__file__))
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_rejects_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        textwrap.dedent(
            """
            from etcd_recipes import INT64, EtcdClient
            from etcd_recipes import sync as blocking

            async def f(client: EtcdClient) -> None:
                await client.put_value("/k", "oops", INT64)
                n: str = await client.get_value("/k", INT64, default=0)

            def g(client: blocking.EtcdClient) -> None:
                client.put_value("/k", "oops", INT64)
            """
        )
    )
    done = _mypy(wrong)
    assert done.returncode != 0
    lines = [line for line in done.stdout.splitlines() if "error:" in line]
    assert sorted({int(line.split(":")[1]) for line in lines}) == [6, 7, 10], done.stdout
