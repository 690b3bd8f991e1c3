"""The blocking facade: ``STM(client).run(apply)`` calls a plain ``apply`` in a worker thread
with the blocking STM; runs from several threads keep an exact count."""

from __future__ import annotations

import threading

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


def test_run_stm_of_the_facade_hands_apply_the_blocking_stm(etcd_server, etcd_prefix):
    """The facade's run_stm calls apply with the blocking twin, in a worker thread."""
    key = etcd_prefix + "k"
    seen: list[object] = []
    with connect(**etcd_server.client_kwargs()) as client:

        def body(tx):
            seen.append(tx)
            assert threading.current_thread() is not threading.main_thread()
            tx.put(key, str(int(tx.get(key) or b"0") + 1))
            return tx.get(key)

        assert run_stm(client, body) == b"1"
        assert run_stm(client, body, isolation=Isolation.SERIALIZABLE) == b"2"
        assert all(isinstance(tx, STM) for tx in seen)
        assert client.get(key).value == b"2"


def test_the_async_stm_refuses_a_blocking_thread(etcd_server, etcd_prefix):
    """An async STM reached from a plain thread says which form to use (nothing written)."""
    import etcd_recipes

    async def main() -> None:
        async with etcd_recipes.connect(**etcd_server.client_kwargs()) as client:
            stm = etcd_recipes.STM(client)

            async def body(tx):
                t = threading.Thread(target=lambda: errors.append(_put(tx)))
                t.start()
                t.join(10)

            errors: list[BaseException | None] = []
            await stm.run(body)
            assert isinstance(errors[0], UsageError)
            assert await client.get(etcd_prefix + "k") is None

    def _put(tx):
        try:
            tx.put(etcd_prefix + "k", b"v")
        except UsageError as exc:
            return exc
        return None

    import asyncio

    asyncio.run(main())
