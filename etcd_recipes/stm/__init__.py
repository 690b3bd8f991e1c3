"""Software transactional memory over etcd: :func:`run_stm` and :class:`STM`, the model of Go's
``client/v3/concurrency`` STM.

:Status: Beta

``apply(stm)`` reads keys (``await stm.get(key)``) and buffers writes (``stm.put``,
``stm.delete``); when it returns, every write is committed in **one** etcd transaction whose
compares say that what ``apply`` read is still what etcd holds. When they fail, ``apply`` runs
again on fresh values, up to ``max_retries`` times, then
:class:`~etcd_recipes.errors.StmConflictError` is raised. The four isolation levels are Go's
(see :class:`Isolation`).

Guarantees:

* all or nothing: a run commits all of its writes in one transaction or none of them; an
  ``apply`` that raises, or is cancelled, writes nothing (its writes were only buffered);
* under ``SERIALIZABLE_SNAPSHOT`` and ``SERIALIZABLE`` a committed run behaves as if it had run
  alone at its commit revision (its reads come from one snapshot and are checked at commit);
* a read of a key the run wrote returns the written value (read your own writes); a key read
  twice in one attempt returns the same value (every level caches what it read);
* keys are plain etcd keys (the client's namespace applies): no layout, no lease, nothing left
  behind but what ``apply`` wrote.

Not guaranteed: ``apply`` may run several times, so it must have no side effects outside the
``stm`` (send the e-mail after :func:`run_stm` returns, with its result). A commit is one
etcd transaction and is never retried by the client (architecture §2): if its answer is lost
(a timeout, a connection cut), the error propagates and the transaction may have committed.
A cancellation that arrives while the commit is in flight propagates unchanged, and the
commit may have landed. One transaction holds at most etcd's ``--max-txn-ops`` (128 by
default) compares or writes: a larger run fails with
:class:`~etcd_recipes.errors.TooManyOperationsError`. ``READ_COMMITTED`` checks nothing at
commit: concurrent runs can lose each other's updates.

Deviations from Go: reads are linearizable (Go reads member-local after its first read, so a
lagging member can answer "future revision"); a run gives up after ``max_retries`` retries
(Go retries forever; ``max_retries=None`` does too); between attempts a run pauses a random
moment (under 50 ms, growing with the attempts) so contenders do not retry in lock step; a
read at a snapshot revision that was compacted meanwhile restarts the attempt.

The blocking facade: ``etcd_recipes.sync.run_stm(client, apply)`` and
``etcd_recipes.sync.STM(client).run(apply)`` call a plain ``apply`` in a worker thread with
the blocking twin of the STM (``stm.get(key)`` blocks).

Example::

    from etcd_recipes import run_stm

    await client.put(f"{prefix}/alice", b"100")

    async def transfer(stm):
        alice = int(await stm.get(f"{prefix}/alice") or b"0")
        bob = int(await stm.get(f"{prefix}/bob") or b"0")
        stm.put(f"{prefix}/alice", str(alice - 30))
        stm.put(f"{prefix}/bob", str(bob + 30))
        return alice - 30

    print(await run_stm(client, transfer))  # 70
    print((await client.get(f"{prefix}/bob")).text)  # 30
"""
