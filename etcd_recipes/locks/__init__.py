"""Locks: :class:`DistributedMutex`, :class:`DistributedReadWriteLock`,
:class:`DistributedMultiLock` (several mutexes all or nothing, see :mod:`.multi`), fencing, and
pass-throughs to etcd's own lock service (:func:`server_lock` / :func:`server_unlock`).

:Status: Beta

Key layouts:

* mutex -- the layout of etcd's own lock (``concurrency.Mutex``, ``etcdctl lock``, the v3lock
  service and the Kotlin library): ``<path>/<lease id in lowercase hex>`` with an empty value,
  created with ``If(create_revision == 0)``; the owner is the key with the **lowest create
  revision** under ``<path>/``. So a Python mutex, ``etcdctl lock <path>``, Go's
  ``concurrency.Mutex`` and JVM processes on the same path exclude each other;
* read-write lock -- ``<path>/read-<client_id>:<7 chars>`` and ``<path>/write-<client_id>:<7
  chars>``, value ``client_id`` (the Kotlin library's layout). Prefix reads use ``<path>/`` (the
  reference reads ``<path>`` without the slash, so ``/locks/ab`` disturbed ``/locks/a``).

Every key is attached to an **acquisition lease** checked out from the client's pool (a Go
session per client and TTL, see :mod:`etcd_recipes.client.lease_pool`): never one already used
on the same path by this process, shared with holds on other paths, given back on release and
revoked once idle or when the client closes -- so a mutex made per request costs no lease of
its own, and an uncontended acquire + release costs two raft writes: one transaction, one
guarded delete. A lease is never re-granted under a hold: once lost, every hold on it is gone.

Guarantees:

* FIFO by create revision; every waiter waits for the deletion of **its nearest conflicting
  predecessor only** (the mutex and writers: the nearest earlier key; readers: the nearest
  earlier writer), with a watch anchored at the revision of the read that found it plus one.
  A release therefore wakes one waiter (or the readers right behind a writer), not the herd;
* after every wake-up the waiter re-reads its predecessors *and its own key* (one range read;
  a reader reads its key separately before claiming): a waiter whose key or lease vanished
  never claims the lock (the Jepsen 3.4.3 bug); it queues again at the tail (recorded in
  ``exceptions``);
* ``async with lock:`` and ``with_lock(timeout=...)`` never run the body without the lock
  (a timeout raises :class:`LockTimeoutError`); when the hold is **lost** (lease expired or
  revoked, key deleted), the lock-lost listeners fire once, ``connection_state`` becomes
  ``LOST``, the body is **cancelled** and the caller gets a
  :class:`~etcd_recipes.errors.LockLostError`; ``release()`` then returns False -- also when
  the release is the first to find out (its delete is guarded on the key), and then it reports
  the loss as above;
* cancelling an acquisition (task cancel, ``anyio.fail_after``, ``asyncio.timeout``, Ctrl-C in
  the blocking facade) deletes its waiter key and gives its lease back to the pool (revoked
  once idle; retired at once if the delete was not confirmed), before the cancellation
  propagates unchanged; the next waiter in line (in etcd, or in the local line) is not
  delayed;
* every hold has a **fencing token** (its key's create revision, larger for every later hold
  on the path) and a compare (:meth:`LockHold.compare`, :meth:`DistributedMutex.is_owner`) so a
  transaction commits only while the hold is current (:meth:`LockHold.guarded_txn`).

Not guaranteed -- read this: a lease-based lock **does not give mutual exclusion on its own**.
A holder that is paused (GC, SIGSTOP, a slow disk) or partitioned for longer than the lease TTL
keeps running while etcd has already handed the lock to the next waiter, and it learns of the
loss only when it runs again (up to a keep-alive interval later). Writes that must not happen
twice must be fenced: inside etcd with :meth:`LockHold.guarded_txn`, elsewhere by a storage
that rejects tokens older than the newest it has seen. ``is_locked()`` is advisory.

Holds belong to **asyncio tasks**: the task that acquired a lock may re-acquire it (counted by
``hold_count``) and must release it; a hold whose task has finished may be released (and
inspected) by any task.

**The local line (mutex):** the mutexes of one client on one path -- every instance, every
task -- take turns in the process, first come first served, before they queue in etcd. So the
process has **one waiter key and one lease** per client and path in etcd however many of its
tasks wait (a parked task costs a future, no lease, key, watch or keep-alive), and every turn
queues a **fresh key at the tail**: behind the waiters other processes queued meanwhile, so
processes take turns, nobody starves and fencing tokens keep following etcd's order. A turn
is only who may queue next; mutual exclusion is etcd's. The turn passes on release, on a loss
(without waiting for the loser's ``release()``), and when a waiter gives up. Consequences:
``contenders()`` lists one key per waiting client, not every waiting task; ``acquire(timeout=0)``
behind a task of the same client that holds or is acquiring answers False without an RPC; and
two waiters of one client are served in the order they called ``acquire()``, not by etcd.
Read-write views and semaphores queue in etcd with a key per acquisition.
In the blocking facade a hold belongs to the calling thread: nested ``with`` blocks (and a
downgrade) on one instance are reentrant per thread, and threads take turns like tasks do.

Deviations from the Kotlin library: holds are per asyncio task (per thread through the blocking
facade); waiting uses the
client-side algorithm of ``concurrency.Mutex`` rather than the v3lock RPC (which hands over at
most every 100 ms per waiter, because its watches start behind the head revision) -- the key
layout is the same, so they interoperate; the read-write lock reads ``<path>/``; downgrade keeps
the write key until the read is released too (see :class:`DistributedReadWriteLock`).
"""
