"""Side-by-side round trips and throughput: jupyter_cluster cells vs raw Ray calls.

Starts the embedded cluster, then alternates rounds of (a) our cells through the
kernel's link and the agent and (b) the same work from a raw Ray driver attached to
the same cluster (a second process, ``ray.init(address="auto")``), and prints medians
and ratios. Run: ``python benchmarks/bench_core.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import cells, driver


def ours(cluster: Any, n: int, items: int) -> dict[str, float]:
    out = cells(cluster, n)
    t = time.perf_counter()
    result = cluster.run_cell("y = x * 2", mode="map", map_over=("x", range(items))).result()
    out["map"] = items / (time.perf_counter() - t)
    assert result.outputs["y"][-1] == 2 * (items - 1)
    return out


def load_ext_time() -> float:
    code = (
        "import time\nfrom IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\nt = time.perf_counter()\n"
        "ip.run_line_magic('load_ext', 'jupyter_cluster')\nprint(time.perf_counter() - t)"
    )
    runs = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
        for _ in range(5)
    ]
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=300, help="round trips per measurement")
    parser.add_argument("--items", type=int, default=2000, help="items of the map")
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()

    import jupyter_cluster as jc

    cluster = jc.local(cpus=args.cpus)
    try:
        rounds: dict[str, dict[str, list[float]]] = {"ours": {}, "raw": {}}
        for _ in range(args.rounds):
            for name, fn in (
                ("raw", lambda: driver("auto", args.n, args.items)),
                ("ours", lambda: ours(cluster, args.n, args.items)),
            ):
                for key, value in fn().items():
                    rounds[name].setdefault(key, []).append(value)
    finally:
        cluster.down()
    med = {who: {k: statistics.median(v) for k, v in d.items()} for who, d in rounds.items()}
    print(f"{'measure':34s} {'ours':>10s} {'raw Ray':>10s} {'ratio':>7s}  target")
    for key, label, unit, scale, target in (
        ("task", "trivial task cell round trip", "ms", 1e3, "<= 1.5 (ours/raw)"),
        ("actor", "trivial actor cell round trip", "ms", 1e3, "<= 1.5 (ours/raw)"),
    ):
        o, r = med["ours"][key] * scale, med["raw"][key] * scale
        print(f"{label:34s} {o:8.2f}{unit} {r:8.2f}{unit} {o / r:7.2f}  {target}")
    o, r = med["ours"]["map"], med["raw"]["map"]
    print(
        f"{f'--map over {args.items} tiny items':34s} {o:7.0f}/s {r:7.0f}/s {o / r:7.2f}  >= 0.8 (ours/raw throughput)"
    )
    print(f"{'%load_ext jupyter_cluster':34s} {load_ext_time() * 1e3:8.1f}ms {'':>10s} {'':>7s}  < 300 ms")


if __name__ == "__main__":
    main()
