"""Code blocks of the docs that the contrib tests run (so the page shows what is tested)."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def snippet(page: str, title: str) -> str:
    """The body of the fenced block of ``docs/<page>`` whose info string has ``title="..."``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    pattern = rf'^```\w+ title="{re.escape(title)}"\n(.*?)^```$'
    found = re.findall(pattern, text, re.MULTILINE | re.DOTALL)
    assert len(found) == 1, f"docs/{page} should have one block titled {title!r}"
    return str(found[0])
