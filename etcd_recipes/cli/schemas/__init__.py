"""The JSON Schemas of the command's ``-o json`` documents, one file per command.

A command ``etcd-recipes queue stats`` prints ``{"schema": "etcd-recipes/cli/v1", "command":
"queue stats", "data": {...}}``; its schema is ``queue.stats.json`` in this directory (the
command's words joined by dots) and describes the whole document. Scripts may rely on every
field a schema marks ``required``; new optional fields may appear without a schema change.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["load", "names"]


def _file_name(command: str) -> str:
    return ".".join(command.split()) + ".json"


def load(command: str) -> dict[str, Any]:
    """The schema of ``command`` (``"queue stats"``); ``FileNotFoundError`` when it has none."""
    text = resources.files(__name__).joinpath(_file_name(command)).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def names() -> list[str]:
    """Every command that has a schema, sorted (``["barrier status", "counter get", ...]``)."""
    found = [
        entry.name[: -len(".json")].replace(".", " ")
        for entry in resources.files(__name__).iterdir()
        if entry.name.endswith(".json")
    ]
    return sorted(found)
