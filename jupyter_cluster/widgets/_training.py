"""Training progress: each reported metric against the epoch, per worker where they differ.

One small figure per metric (the first :data:`MAX_FIGURES`; all of them are in the
table). Its lines are the rows of one ``multi_line`` source: one row while the workers
report the same values (what DDP's averaged losses give), one per worker as soon as one
reports a value the others did not; each report patches its row. The x axis is the
reported ``epoch`` when there is one, else the report's number.
"""

from __future__ import annotations

import html
from typing import Any

from ._picture import Chart, Line, charts
from ._run import PALETTE, TABLE_STYLE, RunView, figure, fmt

MAX_FIGURES = 6
#: Reported names that count reports rather than measure training: never drawn as curves.
COUNTERS = {"epoch", "step", "iteration", "training_iteration", "report", "rank", "time"}


class TrainingView(RunView):
    """The live view of ``jc.train_torch``."""

    kind = "train"

    def __init__(self, label: str, num_workers: int) -> None:
        self.num_workers = num_workers
        #: metric -> rank -> [(x, y)]
        self.points: dict[str, dict[int, list[tuple[float, float]]]] = {}
        #: report number -> rank -> value, per metric (to see whether workers differ)
        self._by_report: dict[str, dict[int, dict[int, float]]] = {}
        self.per_worker: set[str] = set()
        self.sources: dict[str, Any] = {}
        self.rows: dict[str, list[int]] = {}  # metric -> the rank each row draws
        self.last: dict[int, dict[str, Any]] = {}  # rank -> last report
        self.reports = 0
        self.errors: dict[int, str] = {}
        self.x_name = ""
        #: ``(metric, rank)`` with reports not drawn yet (drawn at the next tick).
        self._moved: dict[tuple[str, int], None] = {}
        super().__init__(label)

    def draw(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "report":
            self._report(data)
        elif kind == "error":
            failure = data.get("failure")
            self.errors[data["rank"]] = f"{failure.type_name}: {failure.message}" if failure is not None else "failed"
        elif kind == "end" and data.get("error"):
            self.detail = str(data["error"]).splitlines()[0][:300]

    def _report(self, data: dict[str, Any]) -> None:
        rank, number, metrics = data["rank"], data["report"], data["metrics"]
        self.last[rank] = {"report": number, **metrics}
        self.reports = max(self.reports, number)
        if not self.x_name:
            self.x_name = "epoch" if isinstance(metrics.get("epoch"), (int, float)) else "report"
        x = metrics.get("epoch", number) if self.x_name == "epoch" else number
        added = False
        for name, value in metrics.items():
            if name in COUNTERS or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if name not in self.sources:
                if len(self.sources) >= MAX_FIGURES:
                    continue
                self._add_figure(name)
                added = True
            self.points.setdefault(name, {}).setdefault(rank, []).append((float(x), float(value)))
            seen = self._by_report.setdefault(name, {}).setdefault(number, {})
            seen[rank] = float(value)
            if (
                name not in self.per_worker
                and len(seen) > 1
                and max(seen.values()) - min(seen.values()) > 1e-9 * (1 + abs(max(seen.values())))
            ):
                self._split(name)
            self._moved[(name, rank)] = None
        if added:
            self._resend()
        self._arrived.append(data["time"])

    def _add_figure(self, name: str) -> None:
        from bokeh.models import ColumnDataSource

        source = ColumnDataSource({"xs": [[]], "ys": [[]], "color": [PALETTE[0]], "worker": ["all workers"]})
        plot = figure(name, self.x_name)
        plot.multi_line("xs", "ys", color="color", line_width=2, source=source, legend_field="worker")
        plot.legend.location = "top_right"
        plot.legend.label_text_font_size = "8pt"
        plot.legend.visible = self.num_workers > 1
        self.sources[name] = source
        self.rows[name] = [0]
        from bokeh.layouts import row

        figures: list[Any] = list(self.layout_root.children)
        if figures and len(figures[-1].children) < 2:  # two plots to a row: beside the sidebar, three are cut
            figures[-1].children = [*figures[-1].children, plot]
        else:
            self.layout_root.children = [*figures, row(plot)]

    def _split(self, name: str) -> None:
        """Draw ``name`` per worker from now on: one row for each rank."""
        self.per_worker.add(name)
        source = self.sources.get(name)
        if source is None:
            return
        source.patch({"worker": [(0, "rank 0")]})
        ranks = sorted(r for r in self.points.get(name, {}) if r != 0)
        new: dict[str, list[Any]] = {"xs": [], "ys": [], "color": [], "worker": []}
        for rank in ranks:
            pts = self.points[name][rank]
            new["xs"].append([p[0] for p in pts])
            new["ys"].append([p[1] for p in pts])
            new["color"].append(PALETTE[rank % len(PALETTE)])
            new["worker"].append(f"rank {rank}")
            self.rows[name].append(rank)
        if ranks:
            source.stream(new)

    def flush_plots(self) -> None:
        for name, rank in self._moved:
            self._patch(name, rank)
        self._moved.clear()

    def _patch(self, name: str, rank: int) -> None:
        source = self.sources.get(name)
        if source is None:
            return
        if rank not in self.rows[name]:
            if name not in self.per_worker:
                return  # the same values as rank 0's line
            self.rows[name].append(rank)
            pts = self.points[name][rank]
            source.stream(
                {
                    "xs": [[p[0] for p in pts]],
                    "ys": [[p[1] for p in pts]],
                    "color": [PALETTE[rank % len(PALETTE)]],
                    "worker": [f"rank {rank}"],
                }
            )
            return
        row = self.rows[name].index(rank)
        pts = self.points[name][rank]
        source.patch({"xs": [(row, [p[0] for p in pts])], "ys": [(row, [p[1] for p in pts])]})

    def picture(self) -> str:
        """Each drawn metric against the epoch: one line, or one per worker where they differ."""
        panels = []
        for name in self.sources:
            by_rank = self.points.get(name, {})
            ranks = sorted(by_rank) if name in self.per_worker else sorted(by_rank)[:1]
            lines = [
                Line(f"rank {r}" if name in self.per_worker else "all workers", by_rank[r], PALETTE[r % len(PALETTE)])
                for r in ranks
            ]
            panels.append(Chart(name, self.x_name, lines))
        return charts(panels) if panels else ""

    def summary(self) -> str:
        if self.num_workers == 0:
            parts = ["local mode (in the run's own process)"]
        else:
            parts = [f"{self.num_workers} worker{'s' * (self.num_workers != 1)}"]
        if self.reports:
            parts.append(f"report {self.reports}")
        if self.errors:
            parts.append(f'<span style="color:#c62828">{len(self.errors)} worker(s) failed</span>')
        return " · ".join(parts)

    def table_html(self) -> str:
        if not self.last and not self.errors:
            return ""
        ranks = sorted(self.last)
        same = len(ranks) > 1 and all(
            {k: v for k, v in self.last[r].items()} == {k: v for k, v in self.last[ranks[0]].items()} for r in ranks
        )
        if same:
            ranks = ranks[:1]
        names: list[str] = []
        for rank in ranks:
            for key in self.last[rank]:
                if key not in names:
                    names.append(key)
        head = "".join(f"<th>{html.escape(n)}</th>" for n in ["worker", *names])
        body = []
        for rank in ranks:
            who = "all workers" if same else f"rank {rank}"
            cells = "".join(f"<td>{fmt(self.last[rank].get(n, ''))}</td>" for n in names)
            body.append(f"<tr><td>{who}</td>{cells}</tr>")
        for rank, error in sorted(self.errors.items()):
            body.append(
                f'<tr><td>rank {rank}</td><td colspan="{max(len(names), 1)}" style="color:#c62828">'
                f"{html.escape(error)}</td></tr>"
            )
        return (
            f"{TABLE_STYLE}"
            '<table class="jc-train-table" style="font-size:12px;border-collapse:collapse">'
            f"<tr>{head}</tr>{''.join(body)}</table>"
        )


__all__ = ["TrainingView"]
