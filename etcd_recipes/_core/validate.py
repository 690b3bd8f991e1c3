"""Argument validation shared by the client and every recipe (the one place for it).

Every public entry point calls these checks in its first lines, before any I/O and before its
lifecycle checks, so a bad argument is reported as such and nothing is written. Each check
returns the value normalised (``float`` seconds, ``int`` TTLs) or raises
:class:`~etcd_recipes.errors.InvalidArgumentError` (a ``ValueError``) whose message names the
argument and the bad value; a value of the wrong type raises its subclass
:class:`~etcd_recipes.errors.InvalidArgumentTypeError` (also a ``TypeError``). The rules, once
for all recipes:

* ``bool`` is never a number here (``True`` is not one second, nor one permit);
* timeouts are seconds > 0; ``nan`` is rejected everywhere; ``inf`` means "no bound" where a
  timeout may be ``None`` and is rejected where a finite duration is needed
  (:func:`check_duration`). ``timeout=0`` means "try once, do not wait" where waiting is the
  point (lock and permit acquisition, ``poll``, ``receive``); for a client RPC it is rejected
  (a call that may not take any time can only fail; ``None`` means "no deadline", as for
  :func:`asyncio.wait_for`);
* lease TTLs are whole seconds in ``1..9_000_000_000`` (etcd's maximum): ``2`` and ``2.0`` are
  accepted, ``2.5`` is **rejected** rather than silently truncated or rounded (etcd leases
  have one-second resolution; the recipes' default TTL is 2 s);
* counts (members, permits, attempts, batch sizes) are ``int`` within the stated bounds;
  revisions, limits, lease ids and counter values are ``int`` within etcd's int64;
* a recipe path is a ``str`` that starts with ``/``, is not only slashes
  (:class:`~etcd_recipes.errors.EmptyPathError`), and has no empty segment (``//``) and no NUL
  character (:class:`~etcd_recipes.errors.InvalidPathError`): a relative path, or one joined
  with a doubled slash, is a mistake, and is never silently rewritten to somewhere else. One
  trailing ``/`` is accepted and each recipe keeps its documented layout under it (the queues
  join like the Kotlin library, so ``"/a/"`` and ``"/a"`` share their children; the mutex
  keeps etcd's ``<path>/<lease hex>`` exactly as ``etcdctl lock`` does; single-key recipes use
  the path as given). The raw service calls (``server_lock``, ``election_*``) take etcd names,
  which need no ``/``, as ``etcdctl`` does.

Not public: recipes import it, users see only the errors.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from typing import Any, TypeVar

from ..errors import (
    EmptyPathError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidPathError,
)

__all__ = [
    "INT64_MAX",
    "MAX_TTL",
    "check_choice",
    "check_count",
    "check_delay",
    "check_duration",
    "check_int64",
    "check_int_range",
    "check_key_name",
    "check_lease",
    "check_lease_id",
    "check_metrics_name",
    "check_path",
    "check_path_segment",
    "check_port",
    "check_reason",
    "check_revision",
    "check_rpc_timeout",
    "check_timeout",
    "check_ttl",
    "check_values",
]

INT64_MAX = 2**63 - 1
MAX_TTL = 9_000_000_000  # etcd's MaxLeaseTTL


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_timeout(
    timeout: Any, *, what: str = "timeout", optional: bool = True, zero: bool = False
) -> float | None:
    """Seconds > 0 (``inf`` allowed: no bound); ``None`` when ``optional`` (no bound either);
    ``0`` too when ``zero`` ("try once, do not wait").

    >>> check_timeout(2)
    2.0
    >>> check_timeout(None) is None
    True
    >>> check_timeout(0, zero=True)
    0.0
    """
    if timeout is None and optional:
        return None
    if zero and _is_number(timeout) and timeout == 0:
        return 0.0
    if not _is_number(timeout):
        raise InvalidArgumentTypeError(
            f"{what} must be a number of seconds{' or None' if optional else ''}, "
            f"not {type(timeout).__name__} {timeout!r}"
        )
    if math.isnan(timeout) or not timeout > 0:
        allowed = (" or None" if optional else "") + (" (0: try once)" if zero else "")
        raise InvalidArgumentError(
            f"{what} must be a number of seconds > 0{allowed}, got {timeout!r}"
        )
    return float(timeout)


def check_rpc_timeout(timeout: Any) -> Any:
    """A client call's ``timeout=``: seconds > 0 per attempt, ``None`` or ``inf`` for none;
    ``...`` (the client's default) passes through.

    >>> check_rpc_timeout(2), check_rpc_timeout(None), check_rpc_timeout(float("inf"))
    (2.0, None, None)
    """
    if timeout is ...:
        return timeout
    checked = check_timeout(timeout)
    return None if checked is None or math.isinf(checked) else checked


def check_duration(
    value: Any, *, what: str, minimum: float = 0.0, inclusive: bool = False
) -> float:
    """A finite number of seconds above ``minimum`` (or equal to it when ``inclusive``).

    >>> check_duration(0.5, what="interval")
    0.5
    """
    if not _is_number(value):
        raise InvalidArgumentTypeError(
            f"{what} must be a number of seconds, not {type(value).__name__} {value!r}"
        )
    ok = math.isfinite(value)
    if ok:
        ok = value >= minimum if inclusive else value > minimum
    if not ok:
        op = ">=" if inclusive else ">"
        raise InvalidArgumentError(
            f"{what} must be a finite number of seconds {op} {minimum}, got {value!r}"
        )
    return float(value)


def check_ttl(ttl: Any, *, what: str = "ttl") -> int:
    """Whole seconds in ``1..MAX_TTL`` (``2.0`` is accepted as ``2``; ``2.5`` is rejected, not
    truncated nor rounded).

    >>> check_ttl(5)
    5
    """
    if not _is_number(ttl):
        raise InvalidArgumentTypeError(
            f"{what} must be a whole number of seconds, not {type(ttl).__name__} {ttl!r}"
        )
    if not math.isfinite(ttl):
        raise InvalidArgumentError(f"{what} must be a whole number of seconds, not {ttl!r}")
    if isinstance(ttl, float) and not ttl.is_integer():
        raise InvalidArgumentError(
            f"{what} must be a whole number of seconds (etcd leases have 1 s resolution), "
            f"got {ttl!r}"
        )
    if not 1 <= ttl <= MAX_TTL:
        raise InvalidArgumentError(f"{what} must be 1..{MAX_TTL} seconds, got {ttl!r}")
    return int(ttl)


def check_int_range(
    value: Any,
    *,
    what: str,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[InvalidArgumentError] = InvalidArgumentError,
) -> int:
    """An ``int`` (not a ``bool``) within ``[minimum, maximum]``; ``error`` is raised otherwise.

    >>> check_int_range(3, what="priority", minimum=0, maximum=9)
    3
    """
    lo = "" if minimum is None else str(minimum)
    hi = "" if maximum is None else str(maximum)
    bounds = f" in {lo}..{hi}" if lo or hi else ""
    if not isinstance(value, int) or isinstance(value, bool):
        message = f"{what} must be an int{bounds}, got {type(value).__name__} {value!r}"
        if error is InvalidArgumentError:
            raise InvalidArgumentTypeError(message)
        raise error(message)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise error(f"{what} must be an int{bounds}, got {value} (it is never wrapped into range)")
    return value


def check_count(value: Any, *, what: str, minimum: int = 1) -> int:
    """An ``int`` >= ``minimum`` (members, permits, batch sizes).

    >>> check_count(3, what="member count")
    3
    """
    return check_int_range(value, what=what, minimum=minimum)


def check_int64(value: Any, *, what: str, minimum: int = -INT64_MAX - 1) -> int:
    """An ``int`` that etcd can store (int64), at least ``minimum``.

    >>> check_int64(-5, what="delta")
    -5
    """
    return check_int_range(value, what=what, minimum=minimum, maximum=INT64_MAX)


def check_revision(revision: Any, *, what: str = "revision") -> int:
    """A revision (or a range limit): an int64 >= 0, ``0`` meaning "latest" / "none".

    >>> check_revision(0)
    0
    """
    return check_int_range(revision, what=what, minimum=0, maximum=INT64_MAX)


def check_lease(lease: Any, *, what: str = "lease") -> int:
    """A lease to attach a key to: a lease id, or ``0`` for none.

    >>> check_lease(0)
    0
    """
    return check_int_range(lease, what=what, minimum=0, maximum=INT64_MAX)


def check_lease_id(lease_id: Any, *, what: str = "lease_id", call: str = "") -> int:
    """The id of a granted lease: an ``int`` in ``1..INT64_MAX`` (lease 0 would make etcd
    attach one of its own).

    >>> check_lease_id(0x1234, call="server_lock()")
    4660
    """
    if not isinstance(lease_id, int):  # True is refused below, with False (lease 0)
        raise InvalidArgumentTypeError(
            f"{call + ': ' if call else ''}{what} must be the int id of a granted lease, "
            f"not {type(lease_id).__name__} {lease_id!r}"
        )
    if isinstance(lease_id, bool) or not 0 < lease_id <= INT64_MAX:
        raise InvalidArgumentError(
            f"{call + ': ' if call else ''}{what} must be the id of a granted lease, not "
            f"{lease_id!r} (with lease 0 etcd attaches a 60 s lease of its own that nobody "
            "keeps alive or revokes)"
        )
    return lease_id


def check_path(path: Any, *, what: str = "path") -> str:
    """A recipe path: a ``str`` starting with ``/``, not only slashes, without ``//`` or NUL.

    >>> check_path("/locks/job")
    '/locks/job'
    """
    if not isinstance(path, str):
        raise InvalidArgumentTypeError(
            f"{what} must be a str recipe path such as '/app/lock', not {type(path).__name__}"
        )
    if not path or not path.strip("/"):
        raise EmptyPathError(f"{what} must not be empty (or only '/'), got {path!r}")
    if not path.startswith("/"):
        raise InvalidPathError(
            f"{what} must be absolute (start with '/'), got {path!r}: did you mean {'/' + path!r}?"
        )
    if "//" in path:
        raise InvalidPathError(f"{what} must not contain an empty segment ('//'), got {path!r}")
    if "\x00" in path:
        raise InvalidPathError(f"{what} must not contain a NUL character, got {path!r}")
    return path


def check_key_name(name: Any, *, what: str) -> str:
    """An etcd key name or prefix that need not be a recipe path (a Go naming target such as
    ``"services/echo"``, a cache over another program's keys): a non-empty ``str`` without
    NUL. Recipes that *write* at a path of their own choosing use :func:`check_path`.

    >>> check_key_name("services/echo", what="target")
    'services/echo'
    """
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise EmptyPathError(f"{what} must not be empty")
    if "\x00" in name:
        raise InvalidPathError(f"{what} must not contain a NUL character, got {name!r}")
    return name


_METRICS_NAME = re.compile(r"[A-Za-z0-9_.:-]{0,64}")


def check_metrics_name(name: Any, *, what: str = "metrics_name") -> str:
    """A recipe's metrics ``name`` label: at most 64 of ``A-Z a-z 0-9 _ . : -``.

    It is a label value, so it must come from a small fixed set (one per role, such as
    ``"orders"``), never from a key, path or id."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{what} must be a str, got {type(name).__name__}")
    if not _METRICS_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"{what} must be at most 64 characters of letters, digits and _ . : - "
            f"(a low-cardinality label, never a path), got {name!r}"
        )
    return name


def check_delay(delay: Any, *, what: str = "delay") -> float:
    """A delay in finite seconds, or ``None``; ``None`` and values <= 0 mean "now" (``0.0``).

    >>> check_delay(None), check_delay(-1), check_delay(1.5)
    (0.0, 0.0, 1.5)
    """
    if delay is None:
        return 0.0
    if not _is_number(delay) or not math.isfinite(delay):
        raise InvalidArgumentError(f"{what} must be a finite number of seconds, got {delay!r}")
    return max(float(delay), 0.0)


def check_reason(reason: Any, *, limit: int = 4096) -> str:
    """A failure reason: a ``str`` of at most ``limit`` UTF-8 bytes.

    >>> check_reason("bad input")
    'bad input'
    """
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a str, not {type(reason).__name__}")
    try:
        size = len(reason.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError("reason must be encodable as UTF-8") from None
    if size > limit:
        raise InvalidArgumentError(f"reason must be at most {limit} bytes of UTF-8, got {size}")
    return reason


_E = TypeVar("_E", bound=enum.Enum)


def check_choice(value: Any, kind: type[_E], *, what: str) -> _E:
    """A member of the enum ``kind`` (or a value of one: ``2`` for ``SortTarget.CREATE``);
    anything else raises :class:`~etcd_recipes.errors.InvalidArgumentError` naming the members.

    >>> from etcd_recipes import SortTarget
    >>> check_choice(2, SortTarget, what="sort_target") is SortTarget.CREATE
    True
    """
    if type(value) is kind:
        return value
    try:
        return kind(value)
    except (ValueError, TypeError):
        names = ", ".join(m.name for m in kind)
        raise InvalidArgumentError(
            f"{what} must be a {kind.__name__} ({names}), not {value!r}"
        ) from None


def check_values(values: Any, *, what: str = "values") -> list[Any]:
    """A batch: any iterable of values but a ``str``/``bytes`` (which would be split into
    characters) or ``None``; returned as a list.

    >>> check_values(iter([b"a", b"b"]))
    [b'a', b'b']
    """
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(values, Iterable):
        raise InvalidArgumentTypeError(
            f"{what} must be an iterable of values (a list, a tuple, ...), "
            f"not {type(values).__name__}"
        )
    return list(values)


def check_port(port: Any, *, what: str = "port") -> int:
    """A TCP port: an ``int`` in ``1..65535``, or ``-1`` for "none" (the Kotlin library's default).

    >>> check_port(8080)
    8080
    >>> check_port(-1)
    -1
    """
    if port == -1 and isinstance(port, int) and not isinstance(port, bool):
        return -1
    return check_int_range(port, what=f"{what} (-1: none)", minimum=1, maximum=65535)


def check_path_segment(value: Any, *, what: str) -> str:
    """One segment of a key path (a service name, an instance id): a non-empty ``str``
    without ``/`` (a slash would nest the key under another one).

    >>> check_path_segment("orders", what="a service name")
    'orders'
    """
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
    if not value or "/" in value:
        raise InvalidArgumentError(f"{what} must be non-empty and contain no '/', got {value!r}")
    return value
