"""The election's key layout (shared with the Kotlin library): ``<path>/LEADER`` holds
``"<client_id>:<7 random chars>"``; ``<path>/participants/<client_id>`` holds ``client_id``.
This library adds ``<path>/LEADER/value``: the value a leader proclaimed, on its term's lease
(the JVM library neither writes nor reads it).

Private to the election family.
"""

from __future__ import annotations

from .._core.keys import TOKEN_LENGTH, append_to_path
from ..types import EventType, WatchEvent

_SUFFIX = 1 + TOKEN_LENGTH  # ":" + the random token of a LEADER value


def leader_key(path: str) -> str:
    return append_to_path(path, "LEADER")


def proclaimed_key(path: str) -> str:
    """Where a term's proclaimed value lives (on the term's lease; valid only while its lease
    is the LEADER key's and it was written after the LEADER key was created)."""
    return append_to_path(path, "LEADER/value")


def participants_prefix(path: str) -> str:
    return append_to_path(path, "participants/")


def leader_name(value: bytes) -> str:
    """The client id in a LEADER value ``"<client_id>:<7 chars>"`` (the Kotlin library strips 8)."""
    text = value.decode("utf-8", errors="replace")
    if len(text) > _SUFFIX and text[-_SUFFIX] == ":":
        return text[:-_SUFFIX]
    return text


def is_delete(event: WatchEvent) -> bool:
    return event.type is EventType.DELETE
