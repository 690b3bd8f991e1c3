"""What a recipe inherits: the floor between the client and the families.

* :mod:`~etcd_recipes._recipe.recipe` -- the recipe base (:class:`~etcd_recipes.Recipe`):
  constructors without I/O, ``start()``/``aclose()``, background failures, connection state;
* :mod:`~etcd_recipes._recipe.waiting` -- waiting for a change (the waiter pattern, and the
  queues' shared empty-queue wait);
* :mod:`~etcd_recipes._recipe.hold` -- a hold on a lease (lock, permit, leadership) and loss
  turned into the cancellation of the body that relies on it: ONE mechanism for every recipe;
* :mod:`~etcd_recipes._recipe.outcomes` -- the metric vocabularies every family reports
  with: how an exception, a lease event or a lost hold maps onto an outcome.

Built over the public client only (:class:`~etcd_recipes.EtcdClient`; a few prepared requests
of :mod:`etcd_recipes.client.convert`), never over gRPC or a client's private attributes --
the layering test checks it. Not public: recipes are, through ``etcd_recipes``.
"""
