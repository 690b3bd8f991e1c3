"""Shared values: :class:`~etcd_recipes.SharedValue` and :class:`~etcd_recipes.SharedCount`,
Apache Curator's versioned, watchable values with compare-and-set.

:Status: Beta

Key layout: ``<path>`` holds the value, encoded by the recipe's codec (``SharedCount``: the
8-byte big-endian integer of :class:`~etcd_recipes.DistributedAtomicLong`, so both read the
same key), with **no lease** -- the value is durable; closing deletes nothing.

Guarantees:

* a value's **version** is its key's mod revision: it grows with every write, a delete and a
  re-creation included, so a compare on it cannot be fooled by a value that went away and
  came back (ABA); ``version == 0`` means "the key does not exist" (the seed stands in);
* ``try_set(value, expected_version)`` is one transaction comparing that version: it writes
  only if nobody wrote since the version was read;
* the watch is anchored at ``start()``'s read and resumes after a reconnect where it stopped,
  so every change is reported once, in order; when the history it needs was compacted, the
  key is re-read and the value found reported (intermediate values may be missed then, and a
  :class:`~etcd_recipes.WatchResynced` on :meth:`~etcd_recipes.SharedValue.recovery_events`
  says so).

Not guaranteed: ``current`` is what the watch last delivered -- already stale when read; use
``get()`` for a linearizable read and ``try_set`` to act on a version.
"""
