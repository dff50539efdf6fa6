"""A cell's timeline at a million items: how long ``jc.timeline`` takes, and how many spans it draws.

A ``--map`` of ``--items`` tiny items runs on the embedded cluster; once it ended, the timeline is asked for (it
waits until Ray's task events of the cell are all in: see ``jupyter_cluster.agent.watching._timeline``), then
drawn as the notebook draws it (the Bokeh Gantt and its SVG picture).

    python benchmarks/bench_timeline.py --items 1000000
"""

from __future__ import annotations

import argparse
import time

import jupyter_cluster as jc
from jupyter_cluster.widgets import Timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    cluster = jc.local(cpus=args.cpus)
    try:
        started = time.perf_counter()
        cell = cluster.run_cell("y = x * 2", mode="map", map_over=("x", range(args.items)))
        cell.result(1800)
        ran = time.perf_counter() - started
        started = time.perf_counter()
        data = cluster.timeline(cell)
        asked = time.perf_counter() - started
        started = time.perf_counter()
        timeline = Timeline(data)
        figure, picture = timeline.figure(), timeline.picture()
        drawn = time.perf_counter() - started
        spans = timeline.spans
        print(f"--map over {args.items:,} items on {args.cpus} CPUs: {ran:.1f} s")
        print(f"jc.timeline(cell): {asked:.2f} s after the cell ended, {len(spans)} spans")
        print(
            f"drawn (the Bokeh Gantt, {len(figure.renderers)} renderers, and its SVG picture, "
            f"{len(picture) / 1024:.0f} KiB): {drawn:.2f} s"
        )
        print(spans.groupby("name").size().to_string())
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
