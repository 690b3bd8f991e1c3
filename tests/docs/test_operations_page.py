"""docs/guide/operations.md is executed: its sessions run, in page order, and their output is
compared with the real output.

How the page is read (generic: any session added to the page is run the same way):

* A ```python block is started in the background with ``HOLD_SECONDS=600`` in its environment
  (a worker holding locks and leaderships while the commands look at them); the runner waits
  until it prints a line ``ready`` (or exits 0), and stops it when the page is done. An
  ``export NAME=VALUE`` line it prints before ``ready`` is applied to later commands.
* ``$NAME`` in a command is replaced by that variable (one set by an ``export`` line), as a
  shell would; an unset one fails the test.
* A ```console block is a session: ``$ etcd-recipes ...`` lines are commands, the lines up to
  the next ``$`` are what they print (stdout, then stderr). A command that exits non-zero must
  show ``(exit code N)`` as its last line. Any other ``$`` line, a block with no command, or a
  page with no session fails the test: nothing on the page goes unchecked.
* A command ending in ``&`` runs in the background: the runner goes on once it has printed
  something or, when an etcd is known (``$ETCDCTL_ENDPOINTS``), once that etcd counts one
  more watcher than before it started (its watch is in place: what follows is seen), and
  compares its output at the end of the block; an
  ``export NAME=VALUE`` line it prints (``etcd-recipes dev``) is applied to later commands,
  as a reader would paste it. Background commands are stopped (SIGTERM) when the page is done.
* Before comparing, volatile values are normalised on both sides (ports, pids, temporary
  paths, member, cluster and lease ids, sizes, lease TTLs, raft terms and indexes, ages and
  other timings);
  table columns are compared with their spacing collapsed; output that starts with ``{`` is
  compared as JSON documents (one per line on the real side, any layout on the page).

Every command of the ``etcd-recipes`` app must appear on the page, in its table and its JSON
form (``dev`` and ``lock run`` at least once), and the page's exit-code table lists exactly the
codes of :class:`etcd_recipes.cli.Exit`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("typer")

import typer

from etcd_recipes.cli import Exit, app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "operations.md"
TIMEOUT = 60.0
ONE_FORM = {"dev", "lock run"}  # shown once: a server, and a child command's own output
_FENCE = re.compile(r"^```(\w*)")
_TEXT_RULES = [
    (re.compile(r"/tmp/[^\s),\"]+"), "<tmp>"),
    (re.compile(r"(127\.0\.0\.1|localhost):\d+"), r"\1:<port>"),
    (re.compile(r"\bpid \d+"), "pid <n>"),
    (re.compile(r"\b[0-9a-f]{12,16}\b"), "<hex>"),
    (re.compile(r"<hex>…"), "<hex>"),  # a table column cropped to the terminal's width
    (re.compile(r"(/holders/[^:/\"\s]+):[0-9A-Za-z]+"), r"\1:<token>"),  # a semaphore's key
    (re.compile(r"\b\d+(\.\d+)? (B|KiB|MiB|GiB)\b"), "<size>"),
    (re.compile(r"\b\d+(\.\d+)?%"), "<pct>%"),
    (re.compile(r"\b\d{19}-[0-9A-Za-z]+\b"), "<dead-letter-id>"),
    (re.compile(r"(<hex>)\s+\d+\s*$"), r"\1 <ttl>"),  # a lock's lease and its TTL left
    (re.compile(r"raft term \d+"), "raft term <n>"),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<seconds>s"),  # an age, a delay
    (re.compile(r"^etcd stopped \(exit code [-\d, ]+\)"), "etcd stopped (exit code <n>)"),
]
_VALUED = {"--endpoints", "--cacert", "--cert", "--key", "--user", "--password", "--namespace",
           "-o", "--output"}  # fmt: skip
_VOLATILE_KEYS = {
    "pid",
    "pids",
    "raft_term",
    "raft_index",
    "db_size",
    "db_size_in_use",
    "quota_percent",
    "ttl_left",
    "age",
    "oldest_age",
    "due_in",
}


def _text(value: str) -> str:
    for pattern, replacement in _TEXT_RULES:
        value = pattern.sub(replacement, value)
    return value


def _norm_json(value: Any, key: str = "") -> Any:
    if key in _VOLATILE_KEYS and value is not None:
        return "<n>"
    if isinstance(value, dict):
        return {k: _norm_json(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm_json(v, key) for v in value]
    if isinstance(value, str):
        return _text(value)
    return value


def _json_docs(text: str) -> list[Any]:
    decoder, docs, i = json.JSONDecoder(), [], 0
    text = text.strip()
    while i < len(text):
        doc, i = decoder.raw_decode(text, i)
        docs.append(doc)
        while i < len(text) and text[i].isspace():
            i += 1
    return docs


def normalise(text: str) -> Any:
    """What is compared: JSON documents, or lines with volatile values and spacing masked."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return [_norm_json(d) for d in _json_docs(stripped)]
        except json.JSONDecodeError:
            pass
    return [re.sub(r"\s+", " ", _text(line)).strip() for line in stripped.splitlines()]


@dataclass
class Command:
    line: int
    argv: list[str]
    background: bool
    expected: list[str] = field(default_factory=list)
    raw: str = ""  # the line after "$ ", for expanding $NAME as a shell would

    def runs(self, name: str) -> bool:
        """Whether this is the command ``name`` (``"lock show"``), after the global options."""
        words = self.argv[1:]
        while words and words[0].startswith("-"):
            words = words[2:] if words[0] in _VALUED and "=" not in words[0] else words[1:]
        return words[: len(name.split())] == name.split()

    @property
    def json(self) -> bool:
        return "json" in self.argv and any(a in ("-o", "--output") for a in self.argv)


@dataclass
class Block:
    kind: str  # "python" or "console"
    line: int
    body: list[str]
    commands: list[Command] = field(default_factory=list)


def parse(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        kind, start, body = m.group(1), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if kind in ("python", "console"):
            blocks.append(Block(kind, start, body))
    for block in blocks:
        if block.kind != "console":
            continue
        for n, raw in enumerate(block.body):
            if raw.startswith("$ "):
                argv = shlex.split(raw[2:])
                where = f"operations.md:{block.line + n + 1}"
                assert argv and argv[0] == "etcd-recipes", f"{where}: not an etcd-recipes command"
                background = argv[-1] == "&"
                block.commands.append(
                    Command(
                        block.line + n + 1,
                        argv[:-1] if background else argv,
                        background,
                        raw=raw[2:],
                    )
                )
            else:
                assert block.commands, (
                    f"operations.md:{block.line + n + 1}: output before a command"
                )
                block.commands[-1].expected.append(raw)
        assert block.commands, f"operations.md:{block.line}: a console block with no command"
    return blocks


def leaf_commands() -> set[str]:
    found: set[str] = set()

    def walk(command: object, words: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            found.add(" ".join(words))
            return
        for name, sub in subcommands.items():
            walk(sub, (*words, name))

    walk(typer.main.get_command(app), ())
    return found


BLOCKS = parse(PAGE.read_text(encoding="utf-8")) if PAGE.exists() else []


class Background:
    """A background process and the lines it printed (stdout and stderr, as they come)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_lines(self, n: int, what: str) -> list[str]:
        deadline = time.monotonic() + TIMEOUT
        while len(self.lines) < n and self.proc.poll() is None:
            assert time.monotonic() < deadline, f"{what}: printed only {self.lines}"
            time.sleep(0.05)
        if self.proc.poll() is not None:
            time.sleep(0.2)  # the reader drains the pipe
        return self.lines[:n] if len(self.lines) >= n else list(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def _argv(command: Command) -> list[str]:
    return [sys.executable, "-m", "etcd_recipes.cli", *command.argv[1:]]


def _check(command: Command, actual: list[str]) -> None:
    expected = "\n".join(command.expected)
    real = "\n".join(actual)
    assert normalise(real) == normalise(expected), (
        f"operations.md:{command.line}: $ {shlex.join(command.argv)}\n"
        f"--- the page ---\n{expected}\n--- the real output ---\n{real}"
    )


def _watchers(env: dict[str, str]) -> int | None:
    """How many watchers the etcd in ``$ETCDCTL_ENDPOINTS`` has (its own gauge), or ``None``
    when no etcd is known yet."""
    endpoint = env.get("ETCDCTL_ENDPOINTS", "").split(",")[0].strip()
    if not endpoint:
        return None
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    m = re.search(r"^etcd_debugging_mvcc_watcher_total (\S+)$", text, re.MULTILINE)
    assert m, f"{url}/metrics has no watcher gauge"
    return int(float(m.group(1)))


def _started(command: Command, bg: Background, env: dict[str, str], before: int | None) -> None:
    """Wait until ``bg`` printed something or its etcd counts a new watcher (or it ended)."""
    deadline = time.monotonic() + TIMEOUT
    while not bg.lines and bg.proc.poll() is None:
        if before is not None and (_watchers(env) or 0) > before:
            return
        assert time.monotonic() < deadline, f"line {command.line}: never started"
        time.sleep(0.05)


def _expand(command: Command, env: dict[str, str]) -> Command:
    """``command`` with ``$NAME``/``${NAME}`` replaced from ``env``, outside single quotes."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in env, f"operations.md:{command.line}: ${name} is not set"
        return shlex.quote(env[name])

    parts = re.findall(r"'[^']*'|[^']+", command.raw)
    line = "".join(
        part if part.startswith("'") else re.sub(r"\$\{(\w+)\}|\$(\w+)", value, part)
        for part in parts
    )
    argv = shlex.split(line)
    argv = argv[:-1] if command.background else argv
    return Command(command.line, argv, command.background, command.expected, command.raw)


def _exports(lines: list[str], env: dict[str, str]) -> None:
    for line in lines:
        m = re.match(r"^export (\w+)=(\S+)$", line)
        if m:
            env[m.group(1)] = m.group(2)


def test_the_page_has_sessions_for_every_command() -> None:
    assert BLOCKS, f"{PAGE} has no sessions"
    commands = [c for b in BLOCKS for c in b.commands]
    assert any(b.kind == "python" for b in BLOCKS)
    missing = []
    for name in sorted(leaf_commands()):
        forms = {c.json for c in commands if c.runs(name)}
        need = {False} if name in ONE_FORM else {False, True}
        if name in ONE_FORM and forms:
            continue
        if not need <= forms:
            missing.append(name)
    assert missing == [], f"no table and JSON session on the page for {missing}"


@pytest.mark.timeout(600)  # some 70 commands, each a Python start: 100 s alone, more when loaded
def test_the_page_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    running: list[Background] = []
    try:
        for n, block in enumerate(BLOCKS):
            if block.kind == "python":
                script = tmp_path / f"block{n}.py"
                script.write_text("\n".join(block.body) + "\n", encoding="utf-8")
                worker = Background(
                    [sys.executable, str(script)], {**env, "HOLD_SECONDS": "600"}, tmp_path
                )
                running.append(worker)
                deadline = time.monotonic() + TIMEOUT
                while "ready" not in worker.lines:
                    if worker.proc.poll() is not None:
                        assert worker.proc.returncode == 0, worker.lines
                        break
                    assert time.monotonic() < deadline, (
                        f"block at line {block.line}: {worker.lines}"
                    )
                    time.sleep(0.05)
                _exports(worker.lines, env)
                continue
            pending: list[tuple[Command, Background]] = []
            for command in block.commands:
                command = _expand(command, env)
                if command.background:
                    before = _watchers(env)
                    bg = Background(_argv(command), dict(env), tmp_path)
                    running.append(bg)
                    pending.append((command, bg))
                    _started(command, bg, env, before)
                    continue
                proc = subprocess.run(
                    _argv(command), capture_output=True, text=True, env=env, cwd=tmp_path,
                    timeout=TIMEOUT,
                )  # fmt: skip
                actual = (proc.stdout + proc.stderr).rstrip("\n").splitlines()
                if proc.returncode:
                    actual.append(f"(exit code {proc.returncode})")
                _check(command, actual)
            for command, bg in pending:
                _check(command, bg.wait_lines(len(command.expected), f"line {command.line}"))
                _exports(bg.lines, env)
    finally:
        for bg in reversed(running):
            bg.stop()


def test_the_exit_code_table_is_the_commands() -> None:
    text = PAGE.read_text(encoding="utf-8")
    codes = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", text, re.MULTILINE)]
    assert codes == [int(code) for code in Exit]


def test_normalising_keeps_what_matters() -> None:
    # Volatile values match whatever they are ...
    assert normalise("etcd 127.0.0.1:2379 (pid 7, data /tmp/x/data)") == normalise(
        "etcd 127.0.0.1:40111 (pid 12345, data /tmp/etcd-recipes-dev-q/data)"
    )
    assert normalise('{"pid": 1, "value": 41}') == normalise('{"value": 41,\n "pid": 9}')
    # ... but what a command reports does not.
    assert normalise("41") != normalise("42")
    assert normalise('{"value": 41}') != normalise('{"value": 42}')
    assert normalise("holder /demo/lock/694d7d2c4e5b3a01") != normalise("waiter /demo/lock/1")
    assert normalise("ready 1 oldest 0.5s") == normalise("ready 1 oldest 12.0s")
    assert normalise("/l/4de4a23af1475…  9  x") == normalise("/l/f02a23bcc0faf1a 9 x")
    assert normalise("/l/4de4a23af1475…  9  x") != normalise("/l/f02a23bcc0faf1a 10 x")
    assert normalise('{"age": 0.5, "id": "a"}') != normalise('{"age": 0.5, "id": "b"}')
    with pytest.raises(AssertionError, match="no command"):
        parse("```console\n```\n")
    with pytest.raises(AssertionError, match="output before a command"):
        parse("```console\njust output\n```\n")
    with pytest.raises(AssertionError, match="not an etcd-recipes command"):
        parse("```console\n$ rm -rf /\n```\n")
