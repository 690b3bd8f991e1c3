"""Key helpers: bytes conversion, prefix ranges, path joining, padding and random tokens.

Layouts follow the Kotlin library so that Python and JVM processes share recipes.
"""

from __future__ import annotations

import secrets
import string

from ..errors import EmptyKeyError, InvalidArgumentError

__all__ = [
    "TOKEN_LENGTH",
    "append_to_path",
    "client_id",
    "ensure_suffix",
    "key_bytes",
    "pad",
    "prefix_range_end",
    "random_token",
]

TOKEN_LENGTH = 7
_ALPHABET = string.ascii_letters + string.digits


def key_bytes(key: bytes | str, *, allow_empty: bool = False) -> bytes:
    """Convert a key to bytes (``str`` as UTF-8); reject empty keys with :class:`EmptyKeyError`."""
    if isinstance(key, str):
        try:
            out = key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(
                f"a key must be valid text: {key!r} has a lone surrogate at position "
                f"{exc.start} (pass bytes for keys that are not UTF-8)"
            ) from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        out = bytes(key)
    else:
        raise InvalidArgumentError(f"a key must be bytes or str, not {type(key).__name__}")
    if not out and not allow_empty:
        raise EmptyKeyError("etcd keys must not be empty")
    return out


def prefix_range_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix`` (etcd's convention).

    >>> prefix_range_end(b"/a/")
    b'/a0'
    """
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every key


def append_to_path(path: str, suffix: str) -> str:
    """Join like the Kotlin library: ``"/a/".append("/b")`` -> ``"/a/b"``."""
    return path.removesuffix("/") + "/" + suffix.removeprefix("/")


def ensure_suffix(path: str, suffix: str = "/") -> str:
    """Add a trailing ``suffix`` when missing (prefix reads always use a trailing ``/``)."""
    return path if path.endswith(suffix) else path + suffix


def random_token(length: int = TOKEN_LENGTH) -> str:
    """A random ``[a-zA-Z0-9]`` string from a CSPRNG."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def client_id(prefix: str) -> str:
    """A fresh client id in the Kotlin library's shape: ``"<prefix>:<7 random chars>"``."""
    return f"{prefix}:{random_token()}"


def pad(number: int, width: int) -> str:
    """Zero-pad a non-negative integer (``%0<width>d``)."""
    if number < 0:
        raise InvalidArgumentError(f"cannot pad a negative number: {number}")
    return f"{number:0{width}d}"
