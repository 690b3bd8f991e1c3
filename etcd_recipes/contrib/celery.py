"""Celery on etcd (extra ``celery``): singleton tasks whose lock lives on a lease, and a beat
scheduler that every beat instance can run, of which only the leader sends.

* :class:`SingletonTask` (``@app.task(base=SingletonTask)``) holds a
  :class:`~etcd_recipes.DistributedMutex` while the task runs. The lock is on a lease kept
  alive by the worker, so a worker that is SIGKILLed or killed by a hard time limit frees it
  within ``singleton_ttl`` seconds (celery-singleton's lock is not freed, celery-singleton#40).
  A duplicate that finds the lock held is **retried** (``self.retry``, after
  ``singleton_retry_delay``), never dropped. The task sees its fencing token as
  ``self.request.fencing_token`` (and ``self.request.fencing_compare`` for fenced etcd
  transactions): send it with the writes that must not happen twice.
* :class:`LeaderScheduler` (``celery beat --scheduler etcd_recipes.contrib.celery:LeaderScheduler``)
  runs for election in every beat process (a :class:`~etcd_recipes.LeaderLatch`); only the
  leader sends due tasks. The schedule's state (each entry's ``last_run_at`` and run count) is
  written to etcd when an entry is sent, guarded by the leader's term, so a new leader after a
  failover continues from the old leader's last run instead of from its own start.

Settings (``app.conf``): ``etcd_endpoints`` (else the library's environment variables),
``etcd_singleton_prefix`` (default ``/celery/singleton``), ``etcd_beat_path`` (default
``/celery/beat``), ``etcd_beat_lease_ttl`` (default 2).

Guarantees: two runs of one singleton task never overlap *as far as etcd can tell* (a worker
paused past its TTL may still be running when the next one starts: fence with the token); a
beat entry is sent by the current leader only, and its state write is fenced by the term.
Not guaranteed: exactly-once sending across a failover (the old leader may have sent an entry
whose state write then failed: at most one extra send per entry per failover), and a lost
lock does not interrupt a running task (Celery runs plain functions; the next holder's token
is larger).

Example::

    from celery import Celery
    from etcd_recipes.contrib.celery import SingletonTask

    app = Celery("jobs", broker="memory://")
    app.conf.etcd_endpoints = endpoints

    @app.task(base=SingletonTask, bind=True)
    def nightly_report(self):
        return self.request.fencing_token

    print(nightly_report.singleton_ttl)  # 2
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from datetime import datetime
from typing import Any

import celery
from celery.beat import ScheduleEntry, Scheduler

from ..sync import DistributedMutex, EtcdClient, LeaderLatch, Op, connect

__all__ = ["LeaderScheduler", "SingletonTask", "worker_client"]

log = logging.getLogger("etcd_recipes.contrib.celery")

_UNLIMITED = 2**31
_clients: dict[int, EtcdClient] = {}
_clients_lock = threading.Lock()


def worker_client(app: celery.Celery) -> EtcdClient:
    """The blocking etcd client of this process (one per process, created on first use, so
    after a prefork pool's fork), connected to ``app.conf.etcd_endpoints``.

    Call it from task code (a worker thread), never from an event loop: it is the blocking
    facade's client.

    Example::

        from celery import Celery
        from etcd_recipes.contrib.celery import worker_client

        app = Celery("jobs", broker="memory://")

        @app.task
        def bump():
            worker_client(app).put("/jobs/last", "bumped")
    """
    pid = os.getpid()
    with _clients_lock:
        client = _clients.get(pid)
        if client is None or not client.is_open:
            client = connect(app.conf.get("etcd_endpoints")).open()
            _clients.clear()  # clients inherited from a parent process are not ours
            _clients[pid] = client
        return client


class SingletonTask(celery.Task):  # type: ignore[misc]
    """A task base whose runs never overlap: the body runs holding a distributed mutex.

    Class attributes (override them in ``@app.task(base=SingletonTask, singleton_ttl=5)``):

    * ``singleton_ttl`` (2): the lock's lease TTL, seconds: how long a killed worker keeps it.
    * ``singleton_wait`` (0): how long a run waits for the lock before it is retried (0: try
      once).
    * ``singleton_retry_delay`` (1.0): the retry's countdown, seconds; retries are unlimited.
    * ``singleton_max_retries`` (None: unlimited): how often a duplicate is retried before
      Celery's ``MaxRetriesExceededError``.
    * ``singleton_per_args`` (False): one lock per task name *and* arguments (a hash of their
      JSON), instead of one per task name.

    The fencing token of the hold is ``self.request.fencing_token`` (bind the task), and
    ``self.request.fencing_compare`` is the compare that is true only while the hold is current:
    put it in ``client.txn([...])`` to fence writes to etcd.

    Example::

        from celery import Celery
        from etcd_recipes.contrib.celery import SingletonTask

        app = Celery("jobs", broker="memory://")
        app.conf.etcd_endpoints = endpoints

        @app.task(base=SingletonTask, bind=True, singleton_per_args=True)
        def resize(self, image_id):
            return self.request.fencing_token

        print(resize.lock_path(("img-1",), {}).startswith("/celery/singleton/"))  # True
    """

    singleton_ttl: float = 2
    singleton_wait: float = 0.0
    singleton_retry_delay: float = 1.0
    singleton_per_args: bool = False
    singleton_max_retries: int | None = None

    def lock_path(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock's path for a run with these arguments."""
        prefix = str(self.app.conf.get("etcd_singleton_prefix") or "/celery/singleton")
        path = f"{prefix.rstrip('/')}/{self.name}"
        if self.singleton_per_args:
            blob = json.dumps([list(args), kwargs], sort_keys=True, default=repr)
            path += "/" + hashlib.sha256(blob.encode()).hexdigest()[:16]
        return path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        client = worker_client(self.app)
        mutex = DistributedMutex(client, self.lock_path(args, kwargs), lease_ttl=self.singleton_ttl)
        try:
            if not mutex.acquire(timeout=self.singleton_wait):
                log.info("%s: a run is in progress elsewhere; retrying", self.name)
                # Celery reads max_retries=None as "the task's default" (3): pass a bound.
                limit = self.singleton_max_retries
                raise self.retry(
                    countdown=self.singleton_retry_delay,
                    max_retries=_UNLIMITED if limit is None else limit,
                )
            try:
                self.request.fencing_token = mutex.fencing_token
                self.request.fencing_compare = mutex.is_owner()
                return super().__call__(*args, **kwargs)
            finally:
                if not mutex.release():
                    log.warning("%s: the lock was lost while the task ran", self.name)
        finally:
            mutex.close()


class LeaderScheduler(Scheduler):  # type: ignore[misc]
    """A beat scheduler for several beat processes: only the elected one sends.

    Run ``celery -A proj beat --scheduler etcd_recipes.contrib.celery:LeaderScheduler`` on as
    many hosts as you like. Each entry's ``last_run_at`` and ``total_run_count`` live in etcd
    under ``<etcd_beat_path>/state/<entry name>``; a new leader loads them before its first tick.

    Example::

        from etcd_recipes.contrib.celery import LeaderScheduler

        print(LeaderScheduler.__name__)  # LeaderScheduler
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: EtcdClient | None = None
        self._latch: LeaderLatch | None = None
        self._leading = False
        self._sent_ok = True
        super().__init__(*args, **kwargs)

    @property
    def is_leader(self) -> bool:
        """Whether this beat currently leads (and sends)."""
        return self._latch is not None and self._latch.has_leadership

    def setup_schedule(self) -> None:
        conf = self.app.conf
        self._path = str(conf.get("etcd_beat_path") or "/celery/beat").rstrip("/")
        ttl = conf.get("etcd_beat_lease_ttl") or 2
        self._client = connect(conf.get("etcd_endpoints")).open()
        who = f"beat-{os.uname().nodename}-{os.getpid()}"
        self._latch = LeaderLatch(
            self._client, f"{self._path}/leader", client_id=who, lease_ttl=ttl
        )
        self._latch.start()
        super().setup_schedule()

    def _state_key(self, name: str) -> str:
        return f"{self._path}/state/{name}"

    def _load_state(self) -> None:
        assert self._client is not None
        for name, entry in self.schedule.items():
            kv = self._client.get(self._state_key(name))
            if kv is None:
                continue
            try:
                state = json.loads(kv.value)
                entry.last_run_at = datetime.fromisoformat(state["last_run_at"])
                entry.total_run_count = int(state["total_run_count"])
            except (ValueError, KeyError, TypeError):
                log.warning("beat: unreadable state for %s in etcd; starting it afresh", name)
        self._heap = None  # rebuild the heap from the loaded times

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self.is_leader:
            if self._leading:
                log.warning("beat: leadership lost; no longer sending")
            self._leading = False
            return float(min(self.max_interval, 1.0))
        if not self._leading:
            log.info("beat: elected (%s); loading the schedule's state", self._latch)
            self._load_state()
            self._leading = True
        return float(super().tick(*args, **kwargs))

    def reserve(self, entry: ScheduleEntry) -> ScheduleEntry:
        new_entry = super().reserve(entry)
        latch, client = self._latch, self._client
        term = latch.term if latch is not None else None
        self._sent_ok = False
        if term is None or client is None:
            return new_entry
        state = {
            "last_run_at": new_entry.last_run_at.isoformat(),
            "total_run_count": new_entry.total_run_count,
        }
        try:
            result = client.txn(
                [term.compare()], [Op.put(self._state_key(entry.name), json.dumps(state))]
            )
            self._sent_ok = result.succeeded
        except Exception:
            log.exception("beat: could not record %s's run in etcd; not sending it", entry.name)
        return new_entry

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if not self._sent_ok:
            log.warning("beat: %s not sent: this beat no longer leads", entry.name)
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._latch is not None:
                self._latch.close()
            if self._client is not None:
                self._client.close()
