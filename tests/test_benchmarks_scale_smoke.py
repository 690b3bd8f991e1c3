"""Smoke test of ``benchmarks/scale.py`` (the growth curves): one cheap family at N = 10, 100
writes its JSON and PNG; and the growth arithmetic the README's verdicts rest on.

Benchmarks are not part of the suite; this only proves the driver runs end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))  # last: its scripts' names shadow nothing

from scale_families._api import FamilyResult, Row, growth  # noqa: E402


def test_growth_is_the_largest_ratio_per_tenfold() -> None:
    assert growth({100: 1.0, 1000: 1.0, 10000: 1.0}) == pytest.approx(1.0)
    # 2x between 10^2 and 10^3, flat after: the worst step counts
    assert growth({100: 1.0, 1000: 2.0, 10000: 2.0}) == pytest.approx(2.0)
    # 4x over a 100-fold step is 2x per 10x
    assert growth({100: 1.0, 10000: 4.0}) == pytest.approx(2.0)
    assert math.isnan(growth({100: 1.0}))
    assert math.isnan(growth({100: 0.0, 1000: 1.0}))  # a zero is not usable


def test_a_row_growing_with_its_floor_is_explained_and_one_without_is_a_finding() -> None:
    import scale  # benchmarks/scale.py

    rows = [
        Row("op", "ms", {100: 1.0, 1000: 3.0}, floor="floor"),
        Row("floor", "ms", {100: 0.5, 1000: 1.5}),
        Row("lone", "ms", {100: 1.0, 1000: 3.0}),
        Row("flat", "ms", {100: 1.0, 1000: 1.2}),
    ]
    by_name = {r.name: r for r in rows}
    assert scale.verdict(rows[0], by_name)[2] == "follows floor"
    assert scale.verdict(rows[2], by_name)[2] == "FINDING"
    assert scale.verdict(rows[3], by_name)[2] == "flat"
    assert "FINDING" in scale.table(FamilyResult("t", rows))


def test_the_driver_writes_json_and_png_for_one_family(etcd_server: Any, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    endpoint = etcd_server.endpoint
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale.py"),
            "--family",
            "barriers",
            "--sizes",
            "10,100",
            "--repeats",
            "1",
            "--endpoint",
            endpoint,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "scale-barriers.json").read_text())
    names = {row["name"] for row in data["rows"]}
    assert {"enter, per member", "leave, per member", "floor: put + keys-only range"} <= names
    for row in data["rows"]:
        assert set(row["points"]) == {"10", "100"}, row
    assert len(data["loadavg_before"]) == 3
    png = (tmp_path / "scale-barriers.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert "growth/10x" in done.stdout
