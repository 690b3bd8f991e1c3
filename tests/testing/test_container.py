"""EtcdContainer (testcontainers). This machine has no container engine: the tests that need
one skip naming it; the ones that check what a user without an engine sees run everywhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from etcd_recipes import connect
from etcd_recipes.errors import NotStartedError, UsageError
from etcd_recipes.testing import ContainerEngineUnavailableError, EtcdContainer


def _engine() -> str | None:
    """Why no engine is usable, or None when one answers."""
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__}: {exc})"
    return None


NO_ENGINE = _engine()
needs_engine = pytest.mark.skipif(NO_ENGINE is not None, reason=NO_ENGINE or "")


def test_repr_and_endpoint_before_start() -> None:
    container = EtcdContainer("quay.io/coreos/etcd:v3.5.17")
    assert repr(container) == "<EtcdContainer quay.io/coreos/etcd:v3.5.17 not started>"
    with pytest.raises(NotStartedError):
        _ = container.endpoint
    assert not container.is_running


@pytest.mark.skipif(NO_ENGINE is None, reason="a container engine is available here")
def test_without_an_engine_start_names_what_is_missing() -> None:
    with pytest.raises(ContainerEngineUnavailableError, match="Docker") as info:
        EtcdContainer().start()
    assert isinstance(info.value, UsageError)
    assert "EtcdServer" in str(info.value)  # says what to use instead


@pytest.mark.skipif(NO_ENGINE is None, reason="a container engine is available here")
def test_the_pytest_option_stops_with_the_engine_named(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            def test_uses_etcd(etcd_server):
                assert etcd_server.endpoint
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--etcd-container"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "--etcd-container: no container engine" in out, out
    assert "Docker" in out


@needs_engine
async def test_a_container_serves_and_survives_kill_and_restart() -> None:
    with EtcdContainer() as server:
        async with connect(**server.client_kwargs()) as client:
            await client.put("/c/k", "v")
        server.kill()
        server.restart()
        async with connect(**server.client_kwargs()) as client:
            assert (await client.get("/c/k")).text == "v"
        server.pause()
        assert server.is_paused
        server.resume()
