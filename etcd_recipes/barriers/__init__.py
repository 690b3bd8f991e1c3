"""Barriers: a gate (:class:`~etcd_recipes.DistributedBarrier`) and rendezvous of N members
(:class:`~etcd_recipes.DistributedBarrierWithCount`,
:class:`~etcd_recipes.DistributedDoubleBarrier`).

:Status: Beta

What the family guarantees (each module states its own in full):

* a wait reads the state and watches from that read's revision + 1, and re-checks after every
  watch recovery (server restart, compaction), so a release is never missed;
* a wait that times out, is cancelled, or whose recipe is closed leaves nothing behind: the gate's
  waiters hold no keys, and a counted member's waiting key is deleted and its lease revoked
  before the call returns (or re-raises);
* a gate's key and every counted member's waiting key live on **self-healing** leases of
  ``lease_ttl`` seconds and are created with a compare-and-swap, in the Kotlin library's layout
  (a counted round's ``ready`` key has no lease);
* metrics (labelled with the class and the ``metrics_name`` given, never the path): each wait
  is one ``barrier_wait_finished`` and one ``barrier.wait`` span, ending ``passed``,
  ``timeout``, ``cancelled`` (also: closed while waiting) or ``error`` (a double barrier's
  spans carry ``barrier.phase``, ``enter`` or ``leave``); each loss of a key's lease is one
  ``lease_lost``.

What it does not: barriers coordinate, they do not protect. A setter or member paused or
partitioned for longer than ``lease_ttl`` loses its key until the lease heals -- a gate is
lifted for everyone waiting at that moment (the *spurious-lift window*), a member drops out of
the count. Use a lock or a leader's fencing compare for safety.

Modules (import the public names from :mod:`etcd_recipes`, the one public surface):
``barrier`` (the gate), ``counted`` (the rendezvous of N), ``double`` (enter and leave
rendezvous), ``_common`` (what they share).
"""
