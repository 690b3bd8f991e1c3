"""Integrations with other libraries, each behind an optional extra.

Nothing here is imported by :mod:`etcd_recipes`, and nothing here is part of its export list
or of the blocking facade: import a module from this package explicitly, after installing its
extra (``pip install 'etcd-recipes[asgi]'`` and so on). Each module uses only the library's
public API.

* :mod:`etcd_recipes.contrib.asgi` (extra ``asgi``): a lifespan, leader-only jobs, per-tick
  schedules and a mutex dependency for Starlette, FastAPI and Litestar apps.
* :mod:`etcd_recipes.contrib.celery` (extra ``celery``): singleton tasks on a leased lock and
  a beat scheduler of which only the elected instance sends.
"""
