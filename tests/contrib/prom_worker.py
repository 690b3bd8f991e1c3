"""One worker process of the Prometheus multiprocess test (``PROMETHEUS_MULTIPROC_DIR`` set).

    python -m tests.contrib.prom_worker INDEX

Records, through the library's metering thread (``meter_for(sink)``) exactly as a client
would: ``INDEX + 1`` put RPCs of 2 attempts each, a cache that grows to ``10 * (INDEX + 1)``
entries, and (worker 0 only) one leadership acquired. Prints ``READY`` once every event is
written to its files, then stays alive (its ``livesum`` gauges count) until stdin closes.
"""

from __future__ import annotations

import os
import sys

from prometheus_client import CollectorRegistry

from etcd_recipes._core.metering import meter_for
from etcd_recipes.contrib.prometheus import PrometheusMetrics


def main(index: int) -> None:
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "run with PROMETHEUS_MULTIPROC_DIR set"
    sink = PrometheusMetrics(registry=CollectorRegistry())
    meter = meter_for(sink)
    for _ in range(index + 1):
        meter.emit("rpc_finished", "put", 0.004, 2, "ok")
    cache = meter.for_recipe("PrefixCache", "users")
    cache.cache_size(10 * (index + 1) + 3)
    cache.cache_size(-3)
    if index == 0:
        meter.for_recipe("LeaderSelector", "jobs").leadership("acquired")
    assert meter.flush(10.0), "the metering thread did not deliver in time"
    assert meter.stats().errors == 0, meter.stats()
    print("READY", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main(int(sys.argv[1]))
