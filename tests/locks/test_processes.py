"""Mutual exclusion across processes: 20 tasks in 2 processes increment one value with a
read-modify-write inside the lock; the final value is exact and the fencing tokens that each
holder saw are unique and grow in the order the holds were granted."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from etcd_recipes import INT64
from etcd_recipes.sync import connect

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from etcd_recipes import INT64, connect
    from etcd_recipes import DistributedMutex

    async def main(endpoint, path, counter, tasks, rounds):
        async with connect(endpoint) as client:
            # Two instances per process: tasks of one instance take turns locally, the
            # instances (and the other process) queue in etcd.
            mutexes = [DistributedMutex(client, path) for _ in range(2)]
            seen = []

            async def worker(i):
                mutex = mutexes[i % 2]
                for _ in range(rounds):
                    async with mutex.with_lock() as hold:
                        kv = await client.get(counter)
                        value = INT64.decode(kv.value) if kv else 0
                        await asyncio.sleep(0.002)  # widen the race window
                        await client.put(counter, INT64.encode(value + 1))
                        seen.append((hold.fencing_token, time.time()))

            await asyncio.gather(*(worker(i) for i in range(tasks)))
            for mutex in mutexes:
                await mutex.aclose()
            print(json.dumps(seen))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
    """
)


def test_twenty_tasks_in_two_processes(etcd_server, etcd_prefix):
    path, counter = etcd_prefix + "m", etcd_prefix + "counter"
    tasks, rounds = 10, 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, etcd_server.url, path, counter, str(tasks), str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    holds = [tuple(h) for out, _ in outputs for h in json.loads(out)]
    assert len(holds) == 2 * tasks * rounds
    with connect(**etcd_server.client_kwargs()) as client:
        assert client.get_value(counter, INT64) == 2 * tasks * rounds
    tokens = [token for token, _ in holds]
    assert len(set(tokens)) == len(tokens)  # every hold had its own key
    by_time = [token for token, _ in sorted(holds, key=lambda h: h[1])]
    assert by_time == sorted(tokens)  # later holds have larger fencing tokens
