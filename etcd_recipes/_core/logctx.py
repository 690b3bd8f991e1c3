"""The recipe logging context: which recipe a log record (or background task) belongs to.

Every recipe runs its background work with :data:`current_recipe` set to its identity
(``"DistributedBarrier[/barriers/x]"``). Install :class:`RecipeContextFilter` on a handler to
get it into records as ``record.etcd_recipe``::

    handler = logging.StreamHandler()
    handler.addFilter(RecipeContextFilter())
    handler.setFormatter(logging.Formatter("%(etcd_recipe)s %(message)s"))
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["RecipeContextFilter", "current_recipe", "recipe_context"]

current_recipe: ContextVar[str | None] = ContextVar("etcd_recipe", default=None)
"""The identity of the recipe whose code is running (``None`` outside recipes)."""


@contextlib.contextmanager
def recipe_context(identity: str) -> Iterator[None]:
    """Set :data:`current_recipe` for the duration of the block (restoring the old value)."""
    token = current_recipe.set(identity)
    try:
        yield
    finally:
        current_recipe.reset(token)


class RecipeContextFilter(logging.Filter):
    """A logging filter that adds ``record.etcd_recipe`` (``"-"`` outside any recipe).

    Example::

        import logging

        from etcd_recipes import RecipeContextFilter

        handler = logging.StreamHandler()
        handler.addFilter(RecipeContextFilter())
        handler.setFormatter(logging.Formatter("%(etcd_recipe)s %(message)s"))
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.etcd_recipe = current_recipe.get() or "-"
        return True
