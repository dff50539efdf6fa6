"""Trial progress: a table of trials and the tuned metric against the iteration, per trial.

The curves are the rows of one ``multi_line`` source, one per trial: a trial's first
result streams its row, each later one patches it, at the view's tick, with the table
(config, state, iterations, last and best metric, sorted best first), so the two show the
same results. A trial a scheduler stopped early fades and ends in a cross; one that
raised turns red and ends in a dot.
"""

from __future__ import annotations

import html
from typing import Any

from ..agent.runs._runs import flat
from ._picture import Chart, Line, charts
from ._run import PALETTE, STATE_COLORS, TABLE_STYLE, RunView, figure, fmt

STOPPED = "#9e9e9e"
ERRORED = "#c62828"
MAX_ROWS = 50


class TrialsView(RunView):
    """The live view of ``jc.tune``."""

    kind = "tune"

    def __init__(self, label: str, metric: str, mode: str) -> None:
        from bokeh.models import ColumnDataSource

        self.metric = metric
        self.mode = mode
        self.trials: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, int] = {}
        #: Trials with results, and trials that ended, not drawn yet (drawn at the next tick).
        self._moved: dict[str, None] = {}
        self._ending: dict[str, None] = {}
        super().__init__(label)
        self.curves = ColumnDataSource({"xs": [], "ys": [], "color": [], "alpha": [], "trial": []})
        self.ends = ColumnDataSource({"x": [], "y": [], "color": [], "marker": []})
        plot = figure(f"{metric} ({mode})", "iteration")
        plot.width, plot.height = 560, 260
        plot.multi_line("xs", "ys", color="color", line_alpha="alpha", line_width=2, source=self.curves)
        plot.scatter("x", "y", color="color", marker="marker", size=9, source=self.ends)
        self.layout_root.children = [plot]
        self._resend()

    def _trial(self, trial_id: str) -> dict[str, Any]:
        trial = self.trials.get(trial_id)
        if trial is None:
            trial = self.trials[trial_id] = {
                "config": {},
                "state": "PENDING",
                "iterations": 0,
                "last": None,
                "peak": None,  # its best result at any iteration (the best trial goes by its last: see best())
                "points": [],
                "error": "",
                "index": len(self.trials),
            }
        return trial

    def draw(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "trial":
            trial = self._trial(data["trial"])
            trial["config"] = data.get("config") or trial["config"]
            state = data["state"]
            if trial["state"] == "STOPPED" and state == "TERMINATED":
                state = "STOPPED"
            trial["state"] = state
            if data.get("error") and not trial["error"]:
                trial["error"] = data["error"]
            if state in ("STOPPED", "ERROR"):
                self._mark_end(data["trial"])
        elif kind == "result":
            self._result(data)
        elif kind == "error":
            trial = self._trial(data["trial"])
            failure = data.get("failure")
            if failure is not None:
                trial["error"] = f"{failure.type_name}: {failure.message}"

    def _result(self, data: dict[str, Any]) -> None:
        trial_id = data["trial"]
        trial = self._trial(trial_id)
        trial["iterations"] = data["iteration"]
        if trial["state"] in ("PENDING", "PAUSED"):
            trial["state"] = "RUNNING"
        value = data["metrics"].get(self.metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            trial["last"] = value
            better = trial["peak"] is None or (value < trial["peak"] if self.mode == "min" else value > trial["peak"])
            if better:
                trial["peak"] = value
            trial["points"].append((float(data["iteration"]), float(value)))
            self._moved[trial_id] = None
        if data.get("stopped"):
            trial["state"] = "STOPPED"
            self._mark_end(trial_id)
        self._arrived.append(data["time"])

    def _mark_end(self, trial_id: str) -> None:
        self._ending[trial_id] = None

    def flush_plots(self) -> None:
        for trial_id in self._moved:
            trial = self.trials[trial_id]
            xs = [p[0] for p in trial["points"]]
            ys = [p[1] for p in trial["points"]]
            if trial_id not in self.rows:
                self.rows[trial_id] = len(self.rows)
                color = PALETTE[trial["index"] % len(PALETTE)]
                self.curves.stream({"xs": [xs], "ys": [ys], "color": [color], "alpha": [1.0], "trial": [trial_id]})
            else:
                row = self.rows[trial_id]
                self.curves.patch({"xs": [(row, xs)], "ys": [(row, ys)]})
        self._moved.clear()
        for trial_id in self._ending:
            self._draw_end(trial_id)
        self._ending.clear()

    def _draw_end(self, trial_id: str) -> None:
        trial = self.trials[trial_id]
        if trial.get("marked") or not trial["points"]:
            return
        trial["marked"] = True
        errored = trial["state"] == "ERROR"
        color = ERRORED if errored else STOPPED
        x, y = trial["points"][-1]
        self.ends.stream({"x": [x], "y": [y], "color": [color], "marker": ["circle" if errored else "x"]})
        row = self.rows.get(trial_id)
        if row is not None:
            self.curves.patch({"color": [(row, color)], "alpha": [(row, 0.6 if not errored else 1.0)]})

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for trial in self.trials.values():
            counts[trial["state"]] = counts.get(trial["state"], 0) + 1
        parts = [f"{len(self.trials)} trial{'s' * (len(self.trials) != 1)}"]
        parts += [f"{n} {s.lower()}" for s, n in sorted(counts.items())]
        best = self.best()
        if best is not None:
            parts.append(
                f"best {html.escape(self.metric)} {fmt(best[1]['last'])} (trial {html.escape(best[0])}, last result)"
            )
        return " · ".join(parts)

    def best(self) -> tuple[str, dict[str, Any]] | None:
        """The best trial by its last result, among those that did not fail: Ray Tune's choice, and the result's."""
        scored = [(k, t) for k, t in self.trials.items() if t["last"] is not None and t["state"] != "ERROR"]
        if not scored:
            return None
        pick = min if self.mode == "min" else max
        return pick(scored, key=lambda kv: kv[1]["last"])

    def picture(self) -> str:
        """Every trial's metric against its iterations; stopped early: faded, an x; failed: a circle."""
        lines = []
        for trial_id, trial in self.trials.items():
            if not trial["points"]:
                continue
            state = trial["state"]
            color = ERRORED if state == "ERROR" else PALETTE[trial["index"] % len(PALETTE)]
            end = "o" if state == "ERROR" else "x" if state == "STOPPED" else ""
            lines.append(Line(trial_id, trial["points"], color, end=end, faded=state == "STOPPED"))
        if not lines:
            return ""
        panel = Chart(f"{self.metric} ({self.mode}) · x: stopped early · o: failed", "iteration", lines)
        return charts([panel], per_row=1, size=(560, 260))

    def table_html(self) -> str:
        if not self.trials:
            return ""

        def order(item: tuple[str, dict[str, Any]]) -> tuple[int, float]:
            last = item[1]["last"]
            if last is None or item[1]["state"] == "ERROR":
                return (1, 0.0)
            return (0, last if self.mode == "min" else -last)

        rows = []
        for trial_id, trial in sorted(self.trials.items(), key=order)[:MAX_ROWS]:
            config = ", ".join(f"{k}={fmt(v)}" for k, v in flat(trial["config"]).items())
            state = trial["state"]
            color = STATE_COLORS.get(state, "#333")
            shown = "stopped early" if state == "STOPPED" else state.lower()
            error = trial["error"]
            title = f' title="{html.escape(error)}"' if error else ""
            rows.append(
                f"<tr><td>{html.escape(trial_id)}</td><td>{config}</td>"
                f'<td style="color:{color}"{title}>{html.escape(shown)}</td><td>{trial["iterations"]}</td>'
                f"<td>{fmt(trial['last']) if trial['last'] is not None else ''}</td>"
                f"<td>{fmt(trial['peak']) if trial['peak'] is not None else ''}</td>"
                f'<td style="color:{ERRORED}">{html.escape(error[:160])}</td></tr>'
            )
        more = len(self.trials) - MAX_ROWS
        tail = f"<tr><td colspan=7>… {more} more</td></tr>" if more > 0 else ""
        metric = html.escape(self.metric)
        return (
            f"{TABLE_STYLE}"
            '<table class="jc-trials-table" style="font-size:12px;border-collapse:collapse">'
            "<tr><th>trial</th><th>config</th><th>state</th><th>iter</th>"
            f"<th>last {metric}</th><th>peak {metric}</th><th>error</th></tr>{''.join(rows)}{tail}</table>"
        )


__all__ = ["TrialsView"]
