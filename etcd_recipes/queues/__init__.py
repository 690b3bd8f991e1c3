"""The queues family: producers and consumers sharing items through etcd.

* :mod:`.fifo` -- :class:`~etcd_recipes.DistributedQueue`, FIFO in etcd's commit order;
* :mod:`.priority` -- :class:`~etcd_recipes.DistributedPriorityQueue`, lowest priority number
  first, FIFO within a priority;
* :mod:`.work` -- :class:`~etcd_recipes.DistributedWorkQueue`, claims with a visibility
  timeout, redelivery, dead letters and delayed items.

What the family guarantees: every item goes to exactly one consumer at a time, however many
race for it; ``enqueue_all`` is atomic (one transaction); a wait for items is anchored at the
read's revision + 1, so an item enqueued in between is never missed; a cancelled take or
receive consumes nothing; producers write with a create-only compare, so two producers never
overwrite each other's items.

What it does not guarantee: the FIFO and priority queues hand items out **at most once** (a
take deletes: an item is lost if its consumer dies before processing it); the work queue
delivers **at least once** (an item may be processed twice, so handlers must be idempotent);
none of them orders work across several consumers, and ``size()`` is advisory.

The public names are exported from :mod:`etcd_recipes` only (``config``, ``dead_letters`` and
``item`` define the work queue's public value types); the underscore modules are the family's
private parts: the shared take side, the work queue's layout, claims, consumer lease, sweeps.
"""
