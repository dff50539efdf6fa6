"""Attach plus a first cell, against Ray's own start plus its first tasks, side by side.

Each round runs two fresh processes, one after the other (which goes first alternates):

- **raw Ray**: ``import ray``, ``ray.init(num_cpus=CPUS)``, then ``ITEMS`` tiny tasks at once and their results;
- **ours**: an IPython shell, ``%load_ext jupyter_cluster``, ``%cluster local --cpus CPUS``, then a first
  ``%%remote --map`` cell over the same ``ITEMS`` items.

It prints each round's phases and the medians, the ratio of the totals, and where the attach's time went: the
phases the agent's log marks with their times (its process up, ``ray.init``, its workers up, serving) and the
kernel's side after the agent said it was ready.

    python benchmarks/bench_attach.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from datetime import datetime
from typing import Any

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


def _run(code: str, cpus: int, items: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(cpus), str(items)], capture_output=True, text=True, timeout=600
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
    raws: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        pair = [("raw", RAW), ("ours", OURS)]
        for name, code in pair if round_ % 2 == 0 else pair[::-1]:
            figures = _run(code, args.cpus, args.items)
            (raws if name == "raw" else ours).append(figures)
        raw, our = raws[-1], ours[-1]
        print(
            f"round {round_ + 1}: raw Ray {raw['total']:.2f} s (import {raw['import']:.2f}, init {raw['init']:.2f}, "
            f"first tasks {raw['first']:.2f}); ours {our['total']:.2f} s (load_ext {our['load_ext']:.2f}, "
            f"attach {our['attach']:.2f}, first cell {our['first']:.2f})",
            flush=True,
        )

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
    print(f"  ratio (ours / raw Ray, totals): {med(ours, 'total') / med(raws, 'total'):.2f}")
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
