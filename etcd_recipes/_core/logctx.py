"""Structured log fields: which recipe, path, client, lease, revision and fencing token a
library log record belongs to.

Every library logger (:func:`library_logger`) carries a filter that copies the fields of the
recipe whose code is running into the record, as attributes (the same place ``extra=`` puts
them), so a JSON formatter or ``%(etcd_path)s`` sees them without any set-up:

=========================  ========================================================
``etcd_recipe``            the recipe's identity, ``"DistributedMutex[/locks/x]"``
``etcd_path``              its key path
``etcd_client_id``         its ``client_id`` (who acts: names the winner of an election)
``etcd_lease_id``          the lease its keys live on, where it has one (an ``int``)
``etcd_revision``          the revision it has seen, where it tracks one (an ``int``)
``etcd_fencing_token``     the fencing token of its current hold or term (an ``int``)
=========================  ========================================================

A field is set only where it exists (a record from outside any recipe has none of them; a
mutex that holds nothing has no fencing token), and never overrides a value the call passed
in ``extra``. Install :class:`RecipeContextFilter` on a *handler* to get ``"-"`` for the
missing ones, so a format string naming them never fails::

    handler = logging.StreamHandler()
    handler.addFilter(RecipeContextFilter())
    handler.setFormatter(logging.Formatter("%(etcd_recipe)s %(etcd_client_id)s %(message)s"))

The fields are read when the record is made, from the recipe's state at that moment.

What it does **not** do: it logs no secret at any level (passwords, auth tokens, TLS keys and
payloads never reach a record; a test logs a whole authenticated session at DEBUG and looks
for them), and it does not know the recipe of code that runs in the caller's task outside a
recipe call (a record from there carries what the call passed in ``extra``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar

__all__ = [
    "LOG_FIELDS",
    "RecipeContextFilter",
    "current_recipe",
    "library_logger",
    "recipe_context",
]

LOG_FIELDS = (
    "etcd_recipe",
    "etcd_path",
    "etcd_client_id",
    "etcd_lease_id",
    "etcd_revision",
    "etcd_fencing_token",
)
"""The structured fields a library log record may carry (attributes of the record)."""

FieldSource = Callable[[], Mapping[str, object]]

current_recipe: ContextVar[str | None] = ContextVar("etcd_recipe", default=None)
"""The identity of the recipe whose code is running (``None`` outside recipes)."""

_current_fields: ContextVar[FieldSource | None] = ContextVar("etcd_log_fields", default=None)


@contextlib.contextmanager
def recipe_context(identity: str, fields: FieldSource | None = None) -> Iterator[None]:
    """Set :data:`current_recipe` (and the source of the other fields) for the block."""
    token = current_recipe.set(identity)
    fields_token = _current_fields.set(fields)
    try:
        yield
    finally:
        _current_fields.reset(fields_token)
        current_recipe.reset(token)


class _FieldsFilter(logging.Filter):
    """Adds the running recipe's fields to every record of the logger it is installed on."""

    def filter(self, record: logging.LogRecord) -> bool:
        attrs = record.__dict__
        identity = current_recipe.get()
        if identity is not None:
            attrs.setdefault("etcd_recipe", identity)
        source = _current_fields.get()
        if source is not None:
            try:
                fields = source()
            except Exception:  # a field that cannot be read is left out, never raised
                fields = {}
            for name, value in fields.items():
                if value is not None:
                    attrs.setdefault(name, value)
        return True


_FILTER = _FieldsFilter()


# The logging HOWTO's rule for libraries: a NullHandler on the top logger, so that records
# never reach Python's last-resort handler (stderr) in an application that configured no
# logging; an application that does configure it sees them as usual.
logging.getLogger("etcd_recipes").addHandler(logging.NullHandler())


def library_logger(name: str) -> logging.Logger:
    """The logger ``name`` with the structured-fields filter installed (once).

    Every module of the library gets its logger here rather than from ``logging.getLogger``,
    so every record it makes carries the fields above.
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


class RecipeContextFilter(logging.Filter):
    """A handler filter that gives every record all the structured fields (``"-"`` where a
    record has none), so a format string can name them; it also adds the running recipe's
    fields to records of loggers outside the library core (``etcd_recipes.contrib.*``, your
    own code inside a recipe callback).

    Example::

        import logging

        from etcd_recipes import RecipeContextFilter

        handler = logging.StreamHandler()
        handler.addFilter(RecipeContextFilter())
        handler.setFormatter(logging.Formatter("%(etcd_recipe)s %(etcd_path)s %(message)s"))
    """

    def filter(self, record: logging.LogRecord) -> bool:
        _FILTER.filter(record)  # the fields, for records of loggers outside the library too
        attrs = record.__dict__
        for name in LOG_FIELDS:
            attrs.setdefault(name, "-")
        return True
