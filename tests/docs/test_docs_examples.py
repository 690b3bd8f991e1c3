"""Every ```python block of the documentation (and of the README) is a complete program, and runs here.

Each block is written to ``example.py`` in a temporary directory and run with
``sys.executable`` in a subprocess, with ``ETCD_ENDPOINTS`` pointing at a private, freshly
started etcd (so ``connect()`` with no arguments reaches it, and revisions start at 1 for
every example). The test asserts exit code 0 and, when the block is followed by an output
block, that stdout matches it (and that etcd never answered the client's keepalive pings
with ``GOAWAY too_many_pings``)::

    ```python
    print("hello")
    ```

    Output:

    ```text
    hello
    ```

(The ``Output:`` line is optional; only blank lines may separate the blocks.) Trailing
whitespace is ignored on every line. A block whose info string contains ``title="not-run"``
is skipped; no page uses that today, keep it that way if you can.

Tests are parametrized per page and block index, e.g. ``basics/kv.md#3``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The README's example is the first code a new user runs: it is checked like the pages.
README = ROOT / "README.md"
TIMEOUT = 60.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_OUTPUT_LABEL = re.compile(r"^[*_]*output\b[^\n]*:[*_]*$", re.IGNORECASE)

# Blocks that show the documented contract but fail today because of a library bug, keyed by
# (page, a snippet of the block's code). strict=True: once the bug is fixed the test XPASSes,
# fails, and the entry must go.
KNOWN_BUGS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Example:
    page: str
    index: int
    line: int
    code: str
    expected: str | None

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"


def _dedent(lines: list[str], indent: str) -> str:
    out = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines]
    return "\n".join(out) + "\n"


def _blocks(text: str) -> list[tuple[str, int, int, str, int]]:
    """Fenced blocks as (info, first line, index after the closing fence, body, opening line)."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            body.append(lines[j])
            j += 1
        found.append((info, i + 1, j + 1, _dedent(body, indent), i))
        i = j + 1
    return found


def _expected_after(lines: list[str], start: int, blocks_by_line: dict[int, str]) -> str | None:
    """The body of a ```text block right after line index ``start`` (blanks/"Output:" only)."""
    k = start
    while k < len(lines) and (not lines[k].strip() or _OUTPUT_LABEL.match(lines[k].strip())):
        k += 1
    return blocks_by_line.get(k)


def collect() -> list[Example]:
    examples: list[Example] = []
    for path in [*sorted(DOCS.rglob("*.md")), README]:
        page = "../README.md" if path == README else path.relative_to(DOCS).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        blocks = _blocks(text)
        text_blocks = {
            opening: body for info, _, _, body, opening in blocks if info.split()[:1] == ["text"]
        }
        index = 0
        for info, first, after, body, _ in blocks:
            words = info.split()
            if not words or words[0] != "python":
                continue
            if 'title="not-run"' in info:
                continue
            expected = _expected_after(lines, after, text_blocks)
            examples.append(Example(page, index, first, body, expected))
            index += 1
    return examples


EXAMPLES = collect()


def _params() -> list[object]:
    params: list[object] = []
    for ex in EXAMPLES:
        marks = [
            pytest.mark.xfail(reason=reason, strict=True)
            for (page, snippet), reason in KNOWN_BUGS.items()
            if ex.page == page and snippet in ex.code
        ]
        params.append(pytest.param(ex, id=ex.id, marks=marks))
    return params


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def test_the_docs_have_examples() -> None:
    pages = {ex.page for ex in EXAMPLES}
    assert len(EXAMPLES) >= 30, [ex.id for ex in EXAMPLES]
    for page in ("index.md", "getting-started.md", "connecting.md", "basics/kv.md", "../README.md"):
        assert page in pages
    for page, snippet in KNOWN_BUGS:
        matches = [ex.id for ex in EXAMPLES if ex.page == page and snippet in ex.code]
        assert len(matches) == 1, f"KNOWN_BUGS entry {(page, snippet)} matches {matches}"


@pytest.mark.parametrize("example", _params())
def test_example_runs(example: Example, fresh_etcd_server, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    env = dict(os.environ)
    env["ETCD_ENDPOINTS"] = fresh_etcd_server.endpoint
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("ETCD_RECIPES_TEST_ENDPOINTS", None)
    for name in [n for n in env if n.startswith("ETCDCTL_")]:  # they would win over ours
        del env[name]
    where = f"docs/{example.page}, block starting at line {example.line}"
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where}: still running after {TIMEOUT}s\nstdout:\n{exc.stdout}")
    report = f"{where}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    # The keepalive pitfall the docs warn about must not happen in the docs themselves.
    assert "too_many_pings" not in proc.stderr, report
    assert proc.stdout.strip(), f"{where}: an example should print something\n{report}"
    if example.expected is not None:
        assert _normalise(proc.stdout) == _normalise(example.expected), report


def _builtin_bases(cls: type) -> set[str]:
    found = {
        b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (object, BaseException)
    }
    found.discard(Exception)
    # Keep the most specific ones: TimeoutError, not also its base OSError.
    return {b.__name__ for b in found if not any(o is not b and issubclass(o, b) for o in found)}


def test_the_errors_page_matches_the_hierarchy() -> None:
    import etcd_recipes.errors as errors

    text = (DOCS / "errors.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| ([^|]+) \|", text, re.MULTILINE)
    table = {name: (parent, builtin.strip()) for name, parent, builtin in rows}
    missing = sorted(set(errors.__all__) - set(table))
    assert not missing, f"docs/errors.md does not list {missing}"
    for name in errors.__all__:
        cls = getattr(errors, name)
        parent, builtin = table[name]
        assert cls.__bases__[0].__name__ == parent, name
        documented = set() if builtin == "—" else {b.strip(" `") for b in builtin.split(",")}
        assert documented == _builtin_bases(cls), name
