"""Concurrent transfers between accounts keep the total: 100 tasks in 3 processes move money
between 8 accounts with :func:`run_stm`; every committed transfer also counts itself in its
task's own ledger key, in the same transaction."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from etcd_recipes.sync import connect

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, random, sys
    from etcd_recipes import connect, run_stm

    async def main(endpoint, prefix, proc, tasks, rounds, accounts):
        async with connect(endpoint) as client:
            attempts = []

            async def worker(i):
                rng = random.Random(f"{proc}-{i}")
                ledger = f"{prefix}ledger/{proc}-{i}"
                for _ in range(rounds):
                    src, dst = rng.sample(range(accounts), 2)
                    amount = rng.randint(1, 20)

                    async def transfer(stm):
                        a = int(await stm.get(f"{prefix}acct/{src}") or b"0")
                        b = int(await stm.get(f"{prefix}acct/{dst}") or b"0")
                        done = int(await stm.get(ledger) or b"0")
                        await asyncio.sleep(0.001)  # widen the race window
                        stm.put(f"{prefix}acct/{src}", str(a - amount))
                        stm.put(f"{prefix}acct/{dst}", str(b + amount))
                        stm.put(ledger, str(done + 1))
                        return stm.attempts

                    attempts.append(await run_stm(client, transfer, max_retries=None))

            await asyncio.gather(*(worker(i) for i in range(tasks)))
            print(json.dumps(attempts))

    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], *map(int, args[3:])))
    """
)


def test_hundred_tasks_in_three_processes_keep_the_total(etcd_server, etcd_prefix):
    accounts, rounds, start = 8, 3, 1000
    tasks = [34, 33, 33]
    with connect(**etcd_server.client_kwargs()) as client:
        for n in range(accounts):
            client.put(f"{etcd_prefix}acct/{n}", str(start))
    args = [str(rounds), str(accounts)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, etcd_server.url, etcd_prefix, str(p), str(t), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p, t in enumerate(tasks)
    ]
    outputs = [p.communicate(timeout=150) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    attempts = [a for out, _ in outputs for a in json.loads(out)]
    assert len(attempts) == sum(tasks) * rounds
    assert max(attempts) > 1  # the runs did conflict, and retried
    with connect(**etcd_server.client_kwargs()) as client:
        balances = [int(kv.value) for kv in client.get_prefix(f"{etcd_prefix}acct/").kvs]
        ledgers = [int(kv.value) for kv in client.get_prefix(f"{etcd_prefix}ledger/").kvs]
    assert len(balances) == accounts
    assert sum(balances) == accounts * start  # no money made or lost
    assert balances != [start] * accounts  # ... though it moved
    assert len(ledgers) == sum(tasks) and set(ledgers) == {rounds}  # every transfer once
