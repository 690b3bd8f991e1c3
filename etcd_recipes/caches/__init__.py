"""Caches: local copies of a key range kept current by a watch.

* :mod:`.prefix` -- :class:`~etcd_recipes.PrefixCache`, the one cache recipe (a prefix or a key);
* :mod:`.events` -- what it holds and reports (entries, per-revision batches, events);
* :mod:`.node` and :mod:`.children` -- the Kotlin library's ``NodeCache`` and
  ``PathChildrenCache``, thin layers over it with the Kotlin library's names and events.
"""
