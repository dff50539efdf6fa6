"""What the benchmarks share: a raw Ray driver's round trips, and the same through cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

#: A fresh Ray driver at ``address``: ``n`` trivial task and actor round trips, then
#: optionally ``items`` tiny tasks at once and a put/get of ``nbytes``; prints JSON.
DRIVER = r"""
import json, sys, time
import ray
address, n, items, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ray.init(address=address, log_to_driver=False)

@ray.remote
def f():
    return 1

@ray.remote
class Actor:
    def m(self):
        return 1

@ray.remote
def tiny(x):
    return x * 2

actor = Actor.remote()
for _ in range(20):
    ray.get(f.remote()); ray.get(actor.m.remote())
out = {}
t = time.perf_counter()
for _ in range(n):
    ray.get(f.remote())
out["task"] = (time.perf_counter() - t) / n
t = time.perf_counter()
for _ in range(n):
    ray.get(actor.m.remote())
out["actor"] = (time.perf_counter() - t) / n
if items:
    ray.get([tiny.remote(i) for i in range(100)])
    t = time.perf_counter()
    ray.get([tiny.remote(i) for i in range(items)])
    out["map"] = items / (time.perf_counter() - t)
if nbytes:
    import numpy as np
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    t = time.perf_counter()
    ref = ray.put(data)
    ray.wait([ref])
    out["put"] = nbytes / (time.perf_counter() - t)
    t = time.perf_counter()
    back = ray.get(ref)
    out["get"] = nbytes / (time.perf_counter() - t)
    assert back.nbytes == nbytes
print(json.dumps(out))
"""


def driver(
    address: str, n: int, items: int = 0, nbytes: int = 0, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Run :data:`DRIVER` in a new process; its figures (seconds per round trip, items/s, bytes/s)."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, address, str(n), str(items), str(nbytes)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f"the Ray driver at {address} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cells(cluster: Any, n: int) -> dict[str, float]:
    """Seconds per trivial task cell and actor cell (``z = 1``) through ``cluster``, after a warm-up."""
    for _ in range(20):
        cluster.run_cell("z = 1").result()
        cluster.run_cell("z = 1", mode="actor", actor="bench").result()
    out = {}
    t = time.perf_counter()
    for _ in range(n):
        cluster.run_cell("z = 1").result()
    out["task"] = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        cluster.run_cell("z = 1", mode="actor", actor="bench").result()
    out["actor"] = (time.perf_counter() - t) / n
    return out
