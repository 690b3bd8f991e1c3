"""Integrations with third-party libraries, each behind an optional extra.

* :mod:`etcd_recipes.contrib.asgi` (extra ``asgi``): a lifespan, leader-only jobs, per-tick
  schedules and a mutex dependency for Starlette, FastAPI and Litestar apps;
* :mod:`etcd_recipes.contrib.celery` (extra ``celery``): singleton tasks on a leased lock and
  a beat scheduler of which only the elected instance sends;
* :mod:`etcd_recipes.contrib.httpx` (extra ``httpx``): ``httpx`` transports that send each
  request to an instance a discovery provider picks, and report failing instances to it;
* :mod:`etcd_recipes.contrib.grpc` (no extra: ``grpcio`` is a core dependency): a
  ``grpc.aio`` channel that follows a service's instance list;
* :mod:`etcd_recipes.contrib.prometheus` (extra ``prometheus``): a metrics sink recording
  every library event in ``prometheus_client`` metrics (multiprocess mode included), and
  cached queue-depth and free-permit collectors;
* :mod:`etcd_recipes.contrib.otel` (extra ``otel``): a metrics sink recording the same events
  in OpenTelemetry instruments, with a span per lock, election, barrier and queue operation.

These modules use only the public names of :mod:`etcd_recipes` (and :mod:`etcd_recipes.sync`);
they are not part of ``etcd_recipes.__all__`` and have no generated twin in
:mod:`etcd_recipes.sync` (where a blocking form makes sense, the module defines it itself).
Importing one without its extra installed raises :class:`ImportError` naming the missing
package; importing this package alone imports none of them.
"""
