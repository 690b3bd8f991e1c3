"""Structured log fields: every library logger adds the running recipe's fields; no secret is
ever logged, at any level."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterator

import pytest

import etcd_recipes
from etcd_recipes import (
    LOG_FIELDS,
    DistributedMutex,
    DistributedQueue,
    LeaderLatch,
    RecipeContextFilter,
    connect,
)
from etcd_recipes._core.logctx import library_logger, recipe_context
from etcd_recipes.testing import EtcdServer


class Capture(logging.Handler):
    """Keeps every record of the ``etcd_recipes`` loggers, at every level."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[Capture]:
    root = logging.getLogger("etcd_recipes")
    handler = Capture()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _library_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(etcd_recipes.__path__, "etcd_recipes."):
        # sync/ is generated (it logs nothing itself); contrib/ and cli/ are optional extras
        # whose loggers get the fields through RecipeContextFilter on a handler.
        if info.name.split(".")[1] in ("sync", "contrib", "cli", "testing"):
            continue
        names.append(info.name)
    return names


def test_every_library_logger_adds_the_fields() -> None:
    loggers = {}
    for name in _library_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, logging.Logger):
                loggers[f"{name}.{attr}"] = value
    assert len(loggers) >= 20  # the check below looked at the library's loggers, not none
    bare = [where for where, logger in loggers.items() if not logger.filters]
    assert bare == [], "loggers made with logging.getLogger instead of library_logger"


def test_fields_come_from_the_running_recipe_and_extra_wins(captured: Capture) -> None:
    log = library_logger("etcd_recipes.test_fields")
    fields = {"etcd_path": "/p", "etcd_client_id": "me", "etcd_lease_id": 7, "etcd_revision": None}
    with recipe_context("Kind[/p]", lambda: fields):
        log.info("inside")
        log.info("overridden", extra={"etcd_lease_id": 8})
    log.info("outside")
    inside, overridden, outside = captured.records
    assert (inside.etcd_recipe, inside.etcd_path, inside.etcd_client_id) == ("Kind[/p]", "/p", "me")  # type: ignore[attr-defined]
    assert inside.etcd_lease_id == 7  # type: ignore[attr-defined]
    assert not hasattr(inside, "etcd_revision")  # a field that does not exist is left out
    assert overridden.etcd_lease_id == 8  # type: ignore[attr-defined]
    assert not any(hasattr(outside, name) for name in LOG_FIELDS)


def test_a_field_that_raises_is_left_out_and_the_record_still_logged(captured: Capture) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("no")

    with recipe_context("Kind[/p]", broken):
        library_logger("etcd_recipes.test_fields").warning("still here")
    (record,) = captured.records
    assert record.getMessage() == "still here"
    assert record.etcd_recipe == "Kind[/p]"  # type: ignore[attr-defined]


def test_context_filter_on_a_handler_fills_every_field() -> None:
    record = logging.LogRecord("other", logging.INFO, __file__, 1, "m", None, None)
    with recipe_context("Kind[/p]", lambda: {"etcd_path": "/p"}):
        assert RecipeContextFilter().filter(record)
    assert record.etcd_recipe == "Kind[/p]"  # type: ignore[attr-defined]
    assert record.etcd_path == "/p"  # type: ignore[attr-defined]
    assert record.etcd_fencing_token == "-"  # type: ignore[attr-defined]
    line = logging.Formatter(" ".join(f"%({n})s" for n in LOG_FIELDS)).format(record)
    assert line == "Kind[/p] /p - - - -"


async def test_an_election_log_names_the_winner_and_its_term(
    etcd_client, etcd_prefix, captured: Capture
) -> None:
    async with LeaderLatch(etcd_client, etcd_prefix + "e", client_id="node-a") as latch:
        assert await latch.await_leadership(timeout=10)
        token = latch.fencing_token
    elected = [r for r in captured.records if "elected" in r.getMessage()]
    assert len(elected) == 1
    record = elected[0]
    assert "node-a" in record.getMessage()  # who won, not only that someone did
    assert record.etcd_recipe == f"LeaderLatch[{etcd_prefix}e]"  # type: ignore[attr-defined]
    assert record.etcd_path == etcd_prefix + "e"  # type: ignore[attr-defined]
    assert record.etcd_client_id == "node-a"  # type: ignore[attr-defined]
    assert record.etcd_fencing_token == token  # type: ignore[attr-defined]
    assert isinstance(record.etcd_lease_id, int)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def auth_server() -> Iterator[EtcdServer]:
    with EtcdServer(auth=True) as server:
        yield server


async def test_no_secret_is_logged_at_any_level(auth_server: EtcdServer, captured: Capture) -> None:
    kwargs = auth_server.client_kwargs()
    password = str(kwargs["password"])
    payload = b"payload-that-must-not-be-logged"
    tokens: set[str] = set()
    async with connect(**kwargs) as client:
        await client.put("/secrets/k", payload)
        async with DistributedMutex(client, "/secrets/lock"):
            pass
        queue = DistributedQueue(client, "/secrets/q")
        await queue.enqueue(payload)
        assert await queue.poll(5) == payload
        auth = client._auth
        assert auth is not None and auth.token
        tokens.add(auth.token)
        auth.token = "expired-token-that-must-not-be-logged"  # forces a re-authentication
        tokens.add(auth.token)
        assert (await client.get("/secrets/k")).value == payload  # type: ignore[union-attr]
        tokens.add(str(auth.token))
    assert any("re-authenticating" in r.getMessage() for r in captured.records)
    secrets = {password, payload.decode(), *tokens}
    assert len(secrets) >= 4
    formatter = logging.Formatter("%(message)s")
    for record in captured.records:
        text = formatter.format(record) + repr(vars(record))
        leaked = [s for s in secrets if s in text]
        assert leaked == [], f"{record.name}: {record.getMessage()!r} leaks {leaked}"
