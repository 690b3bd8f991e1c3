"""Argument validation shared by the client and every recipe (the one place for it).

Each check returns the value normalised (``float`` seconds, ``int`` TTLs) or raises
:class:`~etcd_recipes.errors.InvalidArgumentError` (also a ``ValueError``) naming the argument
and the bad value. The rules, once for all recipes:

* ``bool`` is never a number here (``True`` is not one second, nor one permit);
* timeouts are seconds > 0; ``nan`` is rejected everywhere; ``inf`` means "no bound" where a
  timeout may be ``None`` and is rejected where a finite duration is needed
  (:func:`check_duration`);
* lease TTLs are whole seconds >= 1: ``2`` and ``2.0`` are accepted, ``2.5`` is rejected
  rather than silently truncated;
* counts (members, permits, attempts, batch sizes) are ``int`` within the stated bounds.

Not public: recipes import it, users see only the errors.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import EmptyPathError, InvalidArgumentError

__all__ = [
    "check_count",
    "check_duration",
    "check_int_range",
    "check_lease_id",
    "check_path",
    "check_path_segment",
    "check_port",
    "check_timeout",
    "check_ttl",
]


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
    if not _is_number(timeout) or math.isnan(timeout) or not timeout > 0:
        allowed = (" or None" if optional else "") + (" (0: try once)" if zero else "")
        raise InvalidArgumentError(
            f"{what} must be a number of seconds > 0{allowed}, got {timeout!r}"
        )
    return float(timeout)


def check_duration(
    value: Any, *, what: str, minimum: float = 0.0, inclusive: bool = False
) -> float:
    """A finite number of seconds above ``minimum`` (or equal to it when ``inclusive``).

    >>> check_duration(0.5, what="interval")
    0.5
    """
    ok = _is_number(value) and math.isfinite(value)
    if ok:
        ok = value >= minimum if inclusive else value > minimum
    if not ok:
        op = ">=" if inclusive else ">"
        raise InvalidArgumentError(
            f"{what} must be a finite number of seconds {op} {minimum}, got {value!r}"
        )
    return float(value)


def check_ttl(ttl: Any, *, what: str = "a lease TTL") -> int:
    """Whole seconds >= 1 (``2.0`` is accepted as ``2``; ``2.5`` is rejected, not truncated).

    >>> check_ttl(5)
    5
    """
    if not _is_number(ttl) or not math.isfinite(ttl):
        raise InvalidArgumentError(f"{what} must be a whole number of seconds, not {ttl!r}")
    if isinstance(ttl, float) and not ttl.is_integer():
        raise InvalidArgumentError(
            f"{what} must be a whole number of seconds (etcd leases have 1 s resolution), "
            f"got {ttl!r}"
        )
    if ttl < 1:
        raise InvalidArgumentError(f"{what} must be at least 1 second, got {ttl!r}")
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
        raise error(f"{what} must be an int{bounds}, got {type(value).__name__}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise error(f"{what} must be an int{bounds}, got {value} (it is never wrapped into range)")
    return value


def check_count(value: Any, *, what: str, minimum: int = 1) -> int:
    """An ``int`` >= ``minimum`` (members, permits, batch sizes).

    >>> check_count(3, what="member count")
    3
    """
    return check_int_range(value, what=what, minimum=minimum)


def check_lease_id(lease_id: Any, *, what: str) -> int:
    """The id of a granted lease: an ``int`` > 0 (lease 0 would make etcd attach one of its own).

    >>> check_lease_id(0x1234, what="server_lock()")
    4660
    """
    if not isinstance(lease_id, int) or isinstance(lease_id, bool) or lease_id <= 0:
        raise InvalidArgumentError(
            f"{what} needs the id of a granted lease, not {lease_id!r} (with lease 0 etcd "
            "attaches a 60 s lease of its own that nobody keeps alive or revokes)"
        )
    return lease_id


def check_path(path: Any) -> str:
    """A recipe path: a non-empty ``str`` that is not only slashes.

    >>> check_path("/locks/job")
    '/locks/job'
    """
    if not isinstance(path, str):
        raise InvalidArgumentError(f"a recipe path must be a str, not {type(path).__name__}")
    if not path or not path.strip("/"):
        raise EmptyPathError("a recipe path must not be empty (or only '/')")
    return path


def check_port(port: Any, *, what: str = "port") -> int:
    """A TCP port: an ``int`` in ``1..65535``, or ``-1`` for "none" (the reference's default).

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
