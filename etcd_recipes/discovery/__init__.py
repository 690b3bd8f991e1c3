"""Service discovery: registrations on self-healing leases, caches of a service's instances,
and providers that pick one per call (strategies, a down-instance policy, empty-snapshot
protection), plus interop with etcd's Go gRPC naming records.

Key layout (shared with the Kotlin library): ``<service_path>/names/<name>/<id>`` holds the
instance's JSON (:meth:`ServiceInstance.to_json`), on one self-healing lease per registration.

Guaranteed: a registration exists while its registrant lives and keeps its lease alive, and is
gone within the TTL (plus etcd's lease granularity) after the registrant dies, at once after
``unregister``; a heal re-writes the **latest** JSON (``update`` changes what it writes);
caches follow the prefix without gaps (snapshot, then a watch from the snapshot's revision + 1,
a resync after compaction); ``get_instance()`` does no I/O. Every recipe takes
``metrics_name``, the ``name`` label of its metrics: a registry reports ``lease_lost``, a cache's
loads and sizes are reported by the :class:`~etcd_recipes.PrefixCache` under it (recipe label
``PrefixCache``), a provider the v1 latency ``"discovery.stale"``.

Not guaranteed: between a lease expiry and its heal the record does not exist (readers see a
delete, then a put); a provider may hand out an instance that died a moment ago (report it
with ``note_error``); two registrants of one id are refused, not merged.
"""
