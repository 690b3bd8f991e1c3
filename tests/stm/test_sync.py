"""The blocking facade: ``STM(client).run(apply)`` calls a plain ``apply`` in a worker thread
with the blocking STM; runs from several threads keep an exact count."""

from __future__ import annotations

import threading

import pytest

from etcd_recipes import Isolation, UsageError
from etcd_recipes.sync import STM, connect, run_stm


def test_threads_increment_exactly(etcd_server, etcd_prefix):
    key = etcd_prefix + "n"
    errors: list[BaseException] = []
    with connect(**etcd_server.client_kwargs()) as client:

        def increment(tx):
            n = int(tx.get(key) or b"0")
            assert threading.current_thread() is not threading.main_thread()
            tx.put(key, str(n + 1))
            return n + 1

        def worker() -> None:
            stm = STM(client, max_retries=None)
            try:
                for _ in range(5):
                    stm.run(increment)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert client.get(key).value == b"20"


def test_blocking_levels_and_rev(etcd_server, etcd_prefix):
    a = etcd_prefix + "a"
    with connect(**etcd_server.client_kwargs()) as client:
        rev = client.put(a, b"1").revision
        stm = STM(client, isolation=Isolation.REPEATABLE_READS)
        assert stm.isolation is Isolation.REPEATABLE_READS

        def body(tx):
            assert tx is stm  # the blocking instance itself
            assert tx.rev(a) == rev
            tx.delete(a)
            return tx.get(a)

        assert stm.run(body) is None
        assert stm.attempts == 1
        assert client.get(a) is None


def test_run_stm_of_the_facade_refuses_to_write_through_the_async_object(etcd_server, etcd_prefix):
    """Documented: the facade's run_stm hands apply the async STM; its writes raise."""
    with connect(**etcd_server.client_kwargs()) as client:
        with pytest.raises(UsageError, match="STM\\(client"):
            run_stm(client, lambda tx: tx.put(etcd_prefix + "k", b"v"))
        assert client.get(etcd_prefix + "k") is None
