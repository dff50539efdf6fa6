"""Attach plus a first cell, against Ray's own start plus its first tasks, side by side.

Each round runs three fresh processes, one after the other (which goes first rotates):

- **raw Ray**: ``import ray``, ``ray.init(num_cpus=CPUS)``, then ``ITEMS`` tiny tasks at once and their results;
- **ours**: an IPython shell, ``%load_ext jupyter_cluster``, ``%cluster local --cpus CPUS``, then a first
  ``%%remote --map`` cell over the same ``ITEMS`` items;
- **raw Ray, lean import**: raw Ray again, with the ``sitecustomize`` the embedded cluster's processes get
  (``jupyter_cluster/agent/_site``) first on its ``PYTHONPATH``: Ray's processes then skip building
  ``rfc3987_syntax``'s grammar, as ours do. Where that package is installed (Jupyter's packages install it), it is
  most of ``import ray``, in every Ray process; this row is Ray's own start under the same imports as ours.

It prints each round's phases and the medians, the ratio of the totals, and where the attach's time went: the
phases the agent's log marks with their times (its process up, ``ray.init``, its workers up, serving) and the
kernel's side after the agent said it was ready.

    python benchmarks/bench_attach.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime
from typing import Any

from jupyter_cluster.agent._importing import lean_pythonpath

RAW = r"""
import json, sys, time
start = time.time()
import ray
imported = time.time()
ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, log_to_driver=False)
started = time.time()

@ray.remote
def square(i):
    return i * i

assert ray.get([square.remote(i) for i in range(int(sys.argv[2]))]) == [i * i for i in range(int(sys.argv[2]))]
done = time.time()
print(json.dumps({"import": imported - start, "init": started - imported, "first": done - started,
                  "total": done - start}))
ray.shutdown()
"""

OURS = r"""
import json, re, sys, time
start = time.time()
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_cluster")
loaded = time.time()
import jupyter_cluster as jc
shell.run_line_magic("cluster", f"local --cpus {sys.argv[1]}")
attached = time.time()
result = shell.run_cell(f"%%remote --map i in range({sys.argv[2]})\ny = i * i")
done = time.time()
assert result.success and shell.user_ns["y"] == [i * i for i in range(int(sys.argv[2]))], result
with open(jc.current()._agent.log) as f:
    log = f.read()
print(json.dumps({"load_ext": loaded - start, "attach": attached - loaded, "first": done - attached,
                  "total": done - start, "attach_started": loaded, "attached": attached, "log": log}))
shell.run_line_magic("cluster", "down")
"""

#: The agent's log lines that mark a phase of its start (see jupyter_cluster.agent._main), by phase name.
MARKS = {
    "process up": "agent process up",
    "ray.init done": "ray.init took",
    "workers up": "worker processes up",
    "relay up": "the output relay is up",
    "serving": "serving on",
}


def _run(code: str, cpus: int, items: int, lean: bool = False) -> dict[str, Any]:
    # Like for like: raw Ray starts without its dashboard here, so the embedded cluster does too (what the dashboard
    # costs is bench_ray_tools.py's).
    env = {**os.environ, "JUPYTER_CLUSTER_RAY_DASHBOARD": "0"}
    if lean:  # the embedded cluster's sitecustomize first (see the module's docstring)
        env["PYTHONPATH"] = lean_pythonpath(env.get("PYTHONPATH"))
    done = subprocess.run(
        [sys.executable, "-c", code, str(cpus), str(items)], capture_output=True, text=True, timeout=600, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"a round failed:\n{done.stdout}\n{done.stderr[-3000:]}")
    return dict(json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{"))))


def _phases(ours: dict[str, Any]) -> dict[str, float]:
    """Seconds from the start of ``%cluster local`` to each phase the agent's log marks, and to the attach's end."""
    found: dict[str, float] = {}
    for line in ours["log"].splitlines():
        for phase, mark in MARKS.items():
            if mark in line and phase not in found:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found[phase] = stamp - ours["attach_started"]
    found["attached"] = ours["attached"] - ours["attach_started"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--items", type=int, default=8)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {"raw": [], "ours": [], "lean": []}
    for round_ in range(args.rounds):
        order = ["raw", "ours", "lean"]
        for name in order[round_ % 3 :] + order[: round_ % 3]:
            rows[name].append(_run(OURS if name == "ours" else RAW, args.cpus, args.items, lean=name == "lean"))
        raw, our, lean = rows["raw"][-1], rows["ours"][-1], rows["lean"][-1]
        print(
            f"round {round_ + 1}: raw Ray {raw['total']:.2f} s (import {raw['import']:.2f}, init {raw['init']:.2f}, "
            f"first tasks {raw['first']:.2f}); ours {our['total']:.2f} s (load_ext {our['load_ext']:.2f}, "
            f"attach {our['attach']:.2f}, first cell {our['first']:.2f}); raw Ray, lean import {lean['total']:.2f} s",
            flush=True,
        )
    raws, ours, leans = rows["raw"], rows["ours"], rows["lean"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"\nmedians of {args.rounds} rounds, {args.cpus} CPUs, {args.items} items:")
    print(
        f"  raw Ray: import {med(raws, 'import'):.2f} s, ray.init {med(raws, 'init'):.2f} s, "
        f"first tasks {med(raws, 'first'):.2f} s, total {med(raws, 'total'):.2f} s"
    )
    print(
        f"  ours:    %load_ext {med(ours, 'load_ext'):.2f} s, %cluster local {med(ours, 'attach'):.2f} s, "
        f"first cell {med(ours, 'first'):.2f} s, total {med(ours, 'total'):.2f} s"
    )
    print(
        f"  raw Ray, lean import: import {med(leans, 'import'):.2f} s, ray.init {med(leans, 'init'):.2f} s, "
        f"first tasks {med(leans, 'first'):.2f} s, total {med(leans, 'total'):.2f} s"
    )
    print(f"  ratio (ours / raw Ray, totals): {med(ours, 'total') / med(raws, 'total'):.2f}")
    print(f"  ratio (ours / raw Ray with the same lean import, totals): {med(ours, 'total') / med(leans, 'total'):.2f}")
    phases = [_phases(o) for o in ours]
    names = [p for p in [*MARKS, "attached"] if all(p in ph for ph in phases)]
    names.sort(key=lambda name: statistics.median(ph[name] for ph in phases))
    print("\nwhere %cluster local's time went (seconds from its start, medians):")
    last = 0.0
    for name in names:
        at = statistics.median(ph[name] for ph in phases)
        print(f"  {name:<14} at {at:6.2f} s  (+{at - last:.2f})")
        last = at
    print(
        "\nprocess up: the agent's Python and modules imported; ray.init done: the embedded Ray started;\n"
        "workers up, relay up: a worker per CPU ready, and the output relay (warmed while the agent serves); serving:\n"
        "its socket open; attached: the kernel's link and handshake done"
    )


if __name__ == "__main__":
    main()
