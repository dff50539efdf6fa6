"""A cell's timeline, drawn: a Gantt of the tasks and actor calls it ran, a lane per worker.

:class:`Timeline` holds the spans the agent read from Ray's task events (see
``agent/watching/_timeline.py``). It shows as a Bokeh Gantt (a lane per worker process, coloured by
state, a hover with each span's name, duration and node) and, below it, the same as an SVG
picture, which a saved notebook keeps (GitHub and nbviewer draw no Bokeh). ``spans`` gives them
as a pandas DataFrame, ``to_chrome_trace(path)`` as the JSON that Perfetto and
``chrome://tracing`` open.

>>> t = jc.timeline()                      # doctest: +SKIP
>>> t.spans.groupby("worker").size()       # doctest: +SKIP
>>> t.to_chrome_trace("cell.json")         # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .._handles import format_duration

COLORS = {"FINISHED": "#54a24b", "FAILED": "#e45756", "RUNNING": "#4c78a8"}
COLUMNS = ("name", "node", "worker", "state", "start", "end")


class Timeline:
    """The tasks and actor calls one cell ran, with when, where and how each ended."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.label: str = data.get("label") or data.get("cell_id", "?")
        self.cell_id: str = data.get("cell_id", "")
        self.mode: str = data.get("mode", "")
        self.origin: float = float(data.get("start") or 0.0)
        raw = list(data.get("spans") or [])
        if raw and not self.origin:
            self.origin = min(s["start"] for s in raw)
        ended = [s["end"] for s in raw if s.get("end") is not None]
        last = float(data.get("end") or (max(ended) if ended else self.origin))
        self.rows: list[dict[str, Any]] = [
            {
                "name": s["name"],
                "node": s["node"],
                "worker": s["worker"],
                "state": s["state"],
                "start": s["start"] - self.origin,
                "end": (s["end"] if s.get("end") is not None else last) - self.origin,
                "count": int(s.get("count", 1)),
            }
            for s in raw
        ]
        self.elapsed = max(0.0, last - self.origin)

    # ---------------------------------------------------------------- data
    @property
    def spans(self) -> Any:
        """The spans as a pandas DataFrame: ``name``, ``node``, ``worker``, ``state``, ``start`` and ``end``, in
        seconds from the cell's start."""
        import pandas

        return pandas.DataFrame([{k: row[k] for k in COLUMNS} for row in self.rows], columns=list(COLUMNS))

    @property
    def busy(self) -> float:
        """Seconds the spans ran, summed over the workers."""
        return sum(row["end"] - row["start"] for row in self.rows)

    @property
    def workers(self) -> list[str]:
        """The worker processes that ran the spans, by node and pid, in the order each first ran one."""
        seen: dict[str, None] = {}
        for row in sorted(self.rows, key=lambda r: r["start"]):
            seen.setdefault(row["worker"], None)
        return list(seen)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the spans as Chrome's trace events (what Perfetto and ``chrome://tracing`` open); returns the path."""
        nodes = {node: index for index, node in enumerate(sorted({r["node"] for r in self.rows}))}
        lanes = {worker: index for index, worker in enumerate(self.workers)}
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": node}} for node, pid in nodes.items()
        ]
        events += [
            {"name": "thread_name", "ph": "M", "pid": nodes[w.split(" pid ")[0]], "tid": tid, "args": {"name": w}}
            for w, tid in lanes.items()
            if w.split(" pid ")[0] in nodes
        ]
        for row in self.rows:
            events.append(
                {
                    "name": row["name"],
                    "cat": row["state"],
                    "ph": "X",
                    "ts": round(row["start"] * 1e6),
                    "dur": round((row["end"] - row["start"]) * 1e6),
                    "pid": nodes[row["node"]],
                    "tid": lanes[row["worker"]],
                    "args": {"state": row["state"], "count": row["count"]},
                }
            )
        target = Path(path)
        target.write_text(
            json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"cell": self.label}})
        )
        return target

    # ---------------------------------------------------------------- display
    def summary(self) -> str:
        spans = sum(row["count"] for row in self.rows)
        failed = sum(row["count"] for row in self.rows if row["state"] == "FAILED")
        text = (
            f"{self.label}: {spans:,} task{'s' if spans != 1 else ''} and actor call{'s' if spans != 1 else ''} on "
            f"{len(self.workers)} worker{'s' if len(self.workers) != 1 else ''}, {format_duration(self.busy)} busy in "
            f"{format_duration(self.elapsed)}"
        )
        return text + (f", {failed} failed" if failed else "")

    def __repr__(self) -> str:
        return f"<Timeline {self.summary()}>"

    def picture(self) -> str:
        from ._picture import gantt

        lanes = self.workers
        index = {w: i for i, w in enumerate(lanes)}
        bars = [
            (index[r["worker"]], r["start"], r["end"], COLORS.get(r["state"], "#999"), _hover(r)) for r in self.rows
        ]
        return gantt(lanes, bars, self.summary(), span=self.elapsed)

    def figure(self) -> Any:
        """The Gantt as a Bokeh figure: a lane per worker, coloured by state, a hover with name, duration and node."""
        from bokeh.models import ColumnDataSource, FactorRange, HoverTool
        from bokeh.plotting import figure

        lanes = self.workers
        source = ColumnDataSource(
            {
                "worker": [r["worker"] for r in self.rows],
                "start": [r["start"] for r in self.rows],
                "end": [r["end"] for r in self.rows],
                "name": [r["name"] + (f" (×{r['count']})" if r["count"] > 1 else "") for r in self.rows],
                "duration": [format_duration(r["end"] - r["start"]) for r in self.rows],
                "node": [r["node"] for r in self.rows],
                "state": [r["state"].lower() for r in self.rows],
                "color": [COLORS.get(r["state"], "#999") for r in self.rows],
            }
        )
        plot = figure(
            title=self.summary(),
            y_range=FactorRange(factors=list(reversed(lanes))),
            x_axis_label="seconds from the cell's start",
            width=800,
            height=90 + 24 * max(1, len(lanes)),
            toolbar_location="right",
            tools="xpan,xwheel_zoom,reset",
        )
        plot.hbar(y="worker", left="start", right="end", height=0.7, color="color", source=source)
        plot.add_tools(HoverTool(tooltips=[("", "@name"), ("took", "@duration"), ("node", "@node"), ("", "@state")]))
        plot.ygrid.grid_line_color = None
        return plot

    def _ipython_display_(self) -> None:
        from IPython.display import display
        from jupyter_bokeh import BokehModel

        from ._dashboard import load_bokeh
        from ._picture import bundle

        load_bokeh()
        view = BokehModel(self.figure())
        shown = dict(view._repr_mimebundle_() or {})
        shown["text/html"] = f'<div class="jc-timeline">{html.escape(self.summary())}</div>'
        shown["text/plain"] = repr(self)
        display(shown, raw=True)
        display(bundle(self.picture(), f"[a picture of {self.label}'s timeline]"), raw=True)


def _hover(row: dict[str, Any]) -> str:
    count = f" (×{row['count']})" if row["count"] > 1 else ""
    return (
        f"{row['name']}{count}: {format_duration(row['end'] - row['start'])} on {row['node']}, {row['state'].lower()}"
    )


__all__ = ["Timeline"]
