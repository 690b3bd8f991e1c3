"""Leader election: :class:`~etcd_recipes.LeaderSelector`, :class:`~etcd_recipes.LeaderLatch`,
:class:`~etcd_recipes.LeaderObserver`, and pass-throughs to etcd's own election service.

:Status: Beta

Which one to use:

* :class:`LeaderSelector` -- leadership lasts while your coroutine
  ``take_leadership(selector, term)`` runs; one :meth:`~LeaderSelector.start` (or
  :meth:`~LeaderSelector.run`) is one candidacy of at most one term (of a term after another
  with ``auto_requeue=True``); reusable afterwards;
* :class:`LeaderLatch` -- holds leadership from winning until ``aclose()`` or loss, and
  contests again by itself after a loss; :meth:`~LeaderLatch.await_leadership` waits for it;
* :class:`LeaderObserver` -- does not run: it reports who leads (``current_leader``,
  listeners, and an async iterator of :class:`Elected` / :class:`Vacated` events, and
  :class:`LeadershipGap` when terms may have been missed).

Key layout (shared with the Kotlin library, so selectors, latches and observers interoperate, in
Python and JVM processes alike):

* ``<path>/LEADER`` = ``"<client_id>:<7 random chars>"`` on a **per-term lease that is never
  healed**, created with ``If(version == 0)``;
* ``<path>/participants/<client_id>`` = ``client_id`` on a **self-healing** lease, created with
  ``If(version == 0)``, present while an instance is a candidate;
* ``<path>/LEADER/value`` (this library only; the JVM library ignores it) = the value the leader
  proclaimed (``proclaim()``), on the term's lease, written only while that term's LEADER key
  exists with its fencing token and lease; an observer counts it only for the term that wrote it.

Guarantees:

* at most one LEADER key exists, so at most one term is current in etcd at any revision;
* every term has a **fencing token** (the LEADER key's create revision, strictly increasing
  from term to term) and a compare (:meth:`LeadershipTerm.compare`) that makes a transaction
  commit only while that term is current -- the only protection that survives a paused or
  partitioned leader;
* **lost means lost**: when the term's lease is lost (expired, revoked, renewals stopped past
  the TTL) or its LEADER key is deleted, the leader steps down at once -- ``is_leader`` turns
  False, the ``take_leadership`` task is cancelled (unless ``cancel_on_loss=False``), the
  leadership listeners get ``False``, ``connection_state`` becomes ``LOST`` and the loss is
  recorded as a :class:`~etcd_recipes.errors.LeadershipLostError`; the term is never healed;
* a campaign waits for the LEADER key's deletion on one watch, opened from "now" after the
  failed create (a read covers the revisions in between), tries again on every deletion it
  reports, and re-checks after every watch recovery, so a hand-over is never missed;
* cancelling a campaign (``run()``, ``await_leadership()``, ``async with``) withdraws the
  candidacy: no participant key and no LEADER key of this instance stays behind;
* the observer drops no term silently: after a reconnect the missed changes are replayed
  (every term, in order, with its fencing token); when they were compacted away it reports
  :class:`LeadershipGap` ("terms may have been missed") and then the current state; it never
  reports a stale leader after a recovery.

Metrics (through the client's sink, labelled with the class and the ``metrics_name`` given, never
the path): each won term is one ``leadership_changed`` ``acquired``, and its end one
``relinquished`` (returned, resigned, closed) or ``lost`` (plus a ``lease_lost`` with the kind);
each campaign is one ``election.campaign`` span ending ``elected``, ``cancelled`` or ``error``.
An event dropped by a full sink queue is not retried.

Not guaranteed: leadership is a lease. A leader that is paused or partitioned longer than its
TTL keeps *believing* it leads until it notices (up to a keep-alive interval after it runs
again); use the fencing compare for writes that must not happen after a term ended. A
JVM leader may run its term a little past its lease, like any lease-based leader.

Deviations from the Kotlin library: ``take_leadership`` receives the :class:`LeadershipTerm` as well
as the selector (a one-parameter hook gets only the term); :meth:`LeaderLatch.await_leadership`
is released by ``aclose()`` (it returns False); the participant list is one consistent read.

Modules (import the public names from :mod:`etcd_recipes`, the one public surface):

* ``terms`` -- :class:`LeadershipTerm`, :class:`Participant`, the :class:`Elected` /
  :class:`Vacated` events and :func:`get_participants`;
* ``selector`` -- :class:`LeaderSelector`; ``latch`` -- :class:`LeaderLatch`; both build on
  ``_candidate`` (participation, campaigning, terms and step-down, shared);
* ``observer`` -- :class:`LeaderObserver` and :func:`leadership_events`;
* ``server`` -- the ``election_*`` pass-throughs to etcd's election service;
* ``_keys`` -- the key layout above.
"""
