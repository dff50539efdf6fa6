"""What Ray's dashboard costs the embedded cluster, side by side: with it and without it, alternating.

Each round starts two fresh processes, one after the other (which goes first rotates), each of which runs
``jc.local(cpus=CPUS)`` and a first ``%%remote`` cell, with ``JUPYTER_CLUSTER_RAY_DASHBOARD`` set to ``1`` or
``0``; then, the cluster idle for ``--settle`` seconds, it sums the proportional set size (PSS, from
``/proc/PID/smaps_rollup``) of the agent and every process the agent started (Ray's GCS, raylet, dashboard and its
modules, agents, workers), and counts them. It prints each round and the medians: memory, processes, and the
time from ``jc.local`` to the first cell's end.

This is the measurement behind the embedded cluster's threshold (``agent/_sizing.py``, ``DASHBOARD_ROOM``).

    python benchmarks/bench_ray_tools.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROUND = r"""
import json, os, sys, time
from IPython.core.interactiveshell import InteractiveShell
import jupyter_cluster as jc
from jupyter_cluster.agent._reaper import descendants

cpus, settle = int(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
cluster = jc.local(cpus=cpus)
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_cluster")
assert shell.run_cell("%%remote\nx = 1").success
attached = time.monotonic() - start
time.sleep(settle)


def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
    except (OSError, StopIteration):
        return 0


agent = cluster._agent.process.pid
processes = [agent, *descendants(agent)]
print(json.dumps({"attach_s": attached, "pss": sum(pss(p) for p in processes), "processes": len(processes),
                  "dashboard": cluster.dashboard_url}))
cluster.down()
"""


def one(dashboard: bool, cpus: int, settle: float) -> dict[str, object]:
    env = {**os.environ, "JUPYTER_CLUSTER_RAY_DASHBOARD": "1" if dashboard else "0"}
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(cpus), str(settle)], env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"a round failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert bool(found["dashboard"]) == dashboard, found
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds the cluster idles before it is measured")
    args = parser.parse_args()
    rows: dict[bool, list[dict[str, object]]] = {True: [], False: []}
    for number in range(args.rounds):
        order = (False, True) if number % 2 == 0 else (True, False)
        for dashboard in order:
            found = one(dashboard, args.cpus, args.settle)
            rows[dashboard].append(found)
            name = "with the dashboard" if dashboard else "without"
            memory = float(found["pss"]) / 2**20  # type: ignore[arg-type]
            print(
                f"round {number + 1} {name:>18}: {memory:6.0f} MiB PSS in {found['processes']} processes; "
                f"attach and a first cell {found['attach_s']:.2f} s",
                flush=True,
            )

    def median(dashboard: bool, key: str) -> float:
        return statistics.median(float(r[key]) for r in rows[dashboard])  # type: ignore[arg-type]

    print(f"\nmedians of {args.rounds} rounds, {args.cpus} CPUs:")
    print("| | without | with Ray's dashboard | difference |")
    print("| --- | --- | --- | --- |")
    for key, unit, scale in (("pss", "MiB", 2**20), ("processes", "", 1), ("attach_s", "s", 1)):
        off, on = median(False, key) / scale, median(True, key) / scale
        print(f"| {key} | {off:.2f} {unit} | {on:.2f} {unit} | {on - off:+.2f} {unit} |")


if __name__ == "__main__":
    main()
