"""Groups: membership of a named group, and dividing a set of items among its members.

* :class:`~etcd_recipes.GroupMember` (Curator's ``GroupMember``, kazoo's ``Party``): one
  member's key ``<path>/members/<member_id>`` holding its payload on a **self-healing** lease,
  plus a watched view of every member (a snapshot with no I/O, and join / update / leave
  events).
* :class:`~etcd_recipes.SetPartitioner` (kazoo's ``SetPartitioner``): the members of a group
  divide a fixed set of items by rendezvous hashing; an item is owned through the key
  ``<path>/owners/<item>``, created only if absent and held on the owner's lease, so an item
  never has two owner keys and a new owner takes an item only after the old owner's key is
  gone. Each owned item has a fencing token (the owner key's create revision).

Guaranteed: membership and ownership keys vanish at once on ``aclose()`` and within the lease
TTL after a process dies; a write guarded by an item's fencing token commits only while its
owner still holds it.

Not guaranteed: a member's *local* belief that it owns an item can outlive its owner key for
as long as it takes to notice a lease loss (up to the TTL, e.g. during a partition): guard
writes with :meth:`SetPartitioner.compare` rather than trusting the belief. Between a lease
loss and its heal a member is absent from the group.
"""
