"""The cluster dashboard: each node's load, the cluster over time, the cells' work beside Ray's tasks and actors.

An ipywidget (``VBox``) holding a header line and one Bokeh layout through
``jupyter_bokeh``. It draws what :class:`~jupyter_cluster._feed.MetricsFeed` hands it,
and changes its plots only with ``ColumnDataSource.stream`` (new rows: a node joined, a
point in time, a task state seen for the first time) and ``patch`` (new values in
existing rows); a node that leaves is taken off the axis, its rows kept for its return.
Its mime bundle carries an HTML snapshot beside the widget view, so a notebook read
without a kernel, or converted to HTML, shows the cluster as it was; ``close()`` stops
the sampling (when no other dashboard watches) and leaves that snapshot in place.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ipywidgets

from .. import _cluster
from .._feed import MetricsFeed, other_jobs_said, state_groups, system_said
from .._handles import format_size
from ..agent.watching._metrics import NodeSample, totals

if TYPE_CHECKING:
    from .._cluster import Cluster

COLORS = {
    "object store": "#f58518",
    "CPU": "#4c78a8",
    "RAM": "#54a24b",
    "GPU": "#b279a2",
    "GPU memory": "#9d755d",
}
STALE = "#c8c8c8"
#: Figures older than this (seconds, since their sample came) say their age in the header, which says it again
#: each second until the next sample (a busy machine samples less often; a link that is down, not at all).
AGE_SAID = 2.0
STATES = {"cells": "#59a14f", "map items": "#8cd17d", "Ray tasks": "#4c78a8", "Ray actors": "#b279a2"}
#: The rows of the work plot, fixed (so the plot never needs new rows). The cells' own work first, counted from
#: the agent's events as the cells' progress bars and the sidebar count it (the kernel's cells, read at the same
#: tick); then what only Ray knows, from its gauges (a few seconds behind): the tasks and actors the cells' code
#: started on its own (the tasks that run the cells themselves, a map's chunks among them, are the rows above, and
#: not counted again). A map's items and Ray's tasks are different things: a map of 24 items runs them in chunks,
#: a Ray task each.
WORK = (
    ("cells", "running"),
    ("cells", "queued"),
    ("map items", "done"),
    ("map items", "running"),
    ("map items", "waiting"),
    ("Ray tasks", "running"),
    ("Ray tasks", "pending"),
    ("Ray actors", "alive"),
    ("Ray actors", "pending"),
)


def cells_work(cells: Iterable[Any], last_map: Any = None) -> dict[tuple[str, str], float]:
    """The cells' own work, from the kernel's cells (what their progress bars and the sidebar show): cells
    running and queued, and the running ``--map`` cells' items done, running (in a chunk that started) and
    waiting (in a chunk yet to start). Where no map runs, ``last_map``, the last one that ran, gives its items
    as it ended (the numbers its result and its bar end with)."""
    work: dict[tuple[str, str], float] = dict.fromkeys(WORK[:5], 0.0)
    cells = [cell for cell in cells if not cell.done()]
    if last_map is not None and not any(cell.mode == "map" for cell in cells):
        work["map items", "done"] = last_map.progress[0]
    for cell in cells:
        work["cells", "queued" if cell.status == "queued" else "running"] += 1
        if cell.mode == "map":
            done, total = cell.progress
            work["map items", "done"] += done
            work["map items", "running"] += cell.running_items
            work["map items", "waiting"] += max(0, total - cell.started_items)
    return work


def work_said(work: dict[tuple[str, str], float]) -> str:
    """The work rows as one line: ``cells: 1 running, 0 queued; map items: ...; Ray tasks: ...``."""
    kinds = dict.fromkeys(kind for kind, _ in WORK)
    return "; ".join(
        f"{kind}: " + ", ".join(f"{work.get((kind, g), 0.0):.0f} {g}" for k, g in WORK if k == kind) for kind in kinds
    )


def work_counts(cells: Iterable[Any], last_map: Any = None, *, cluster: NodeSample) -> dict[tuple[str, str], float]:
    """Every row of :data:`WORK`: the cells' own work and Ray's counts of the tasks and actors their code started."""
    groups = state_groups(cluster)
    work = cells_work(cells, last_map)
    for kind, group in WORK[5:]:
        work[kind, group] = groups.get(("tasks" if kind == "Ray tasks" else "actors", group), 0.0)
    return work


_bokeh_loaded = False
_bokeh_lock = threading.Lock()


def load_bokeh() -> None:
    """Put BokehJS in the page, from this machine (no CDN), once per kernel."""
    global _bokeh_loaded
    with _bokeh_lock:
        if _bokeh_loaded:
            return
        from bokeh.io import output_notebook
        from bokeh.resources import INLINE

        output_notebook(resources=INLINE, hide_banner=True)
        _bokeh_loaded = True


def node_rows(node: NodeSample) -> list[tuple[str, float, str]]:
    """A node's bars: ``(metric, fraction full, label)``."""
    rows = []
    used, total = node.get("store_used", 0.0), node.get("store_total", 0.0)
    rows.append(("object store", _frac(used, total), f"{format_size(used)} / {format_size(total)}"))
    cpu = node.get("cpu", 0.0)
    rows.append(("CPU", cpu / 100, f"{cpu:.0f} % of the host"))  # the host's load (the sidebar: Ray's CPUs held)
    used, total = node.get("mem_used", 0.0), node.get("mem_total", 0.0)
    rows.append(("RAM", _frac(used, total), f"{format_size(used)} / {format_size(total)}"))
    for index in sorted(node.get("gpus", {}), key=_numeric):
        gpu = node["gpus"][index]
        util = gpu.get("utilization", 0.0)
        rows.append((f"GPU {index}", util / 100, f"{util:.0f} % {gpu.get('name', '')}".rstrip()))
        used = gpu.get("memory_used", 0.0)
        total = used + gpu.get("memory_available", 0.0)
        rows.append((f"GPU {index} memory", _frac(used, total), f"{format_size(used)} / {format_size(total)}"))
    return rows


def _numeric(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 30, text)


def _frac(used: float, total: float) -> float:
    return max(0.0, min(1.0, used / total)) if total else 0.0


def _color(metric: str) -> str:
    return COLORS["GPU memory"] if metric.endswith("memory") else COLORS.get(metric.split(" ")[0], COLORS["GPU"])


def snapshot_html(
    nodes: dict[str, NodeSample],
    labels: dict[str, str] | None = None,
    title: str = "",
    cluster: NodeSample | None = None,
    notebook_cells: Iterable[Any] = (),
    last_map: Any = None,
) -> str:
    """The cluster as one HTML table: what a dashboard shows, without a kernel (``cluster``: its
    totals, when ``nodes`` are only those shown; ``notebook_cells``: the notebook's, for their work)."""
    labels = labels or {}
    head = "".join(f"<th>{h}</th>" for h in ("node", "CPU", "RAM", "object store", "GPUs"))
    rows = []
    for node_id, node in nodes.items():
        gpus = ", ".join(
            f"{i}: {g.get('utilization', 0):.0f} %, {format_size(g.get('memory_used', 0))}"
            for i, g in sorted(node.get("gpus", {}).items())
        )
        stale = f" <i>(stale: {html.escape(node['stale'])})</i>" if node.get("stale") else ""
        cells = [
            html.escape(labels.get(node_id) or str(node.get("address", node_id))) + stale,
            f"{node.get('cpu', 0):.0f} %",
            f"{format_size(node.get('mem_used', 0))} / {format_size(node.get('mem_total', 0))}",
            f"{format_size(node.get('store_used', 0))} / {format_size(node.get('store_total', 0))}",
            gpus or "-",
        ]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    cluster = cluster or totals(nodes.values())
    states = [work_said(work_counts(notebook_cells, last_map, cluster=cluster))]
    system = system_said(cluster)
    if system:
        states.append(f"{system} (Ray's libraries and jupyter_cluster's own, not counted above)")
    others = other_jobs_said(cluster)
    if others:
        states.append(f"{others} (not counted above)")
    title = title or f"Cluster dashboard: {len(nodes)} node(s)"
    return (
        f'<div class="jc-dashboard-snapshot"><b>{html.escape(title)}</b>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"<div>{html.escape('; '.join(states))}</div></div>"
    )


class Dashboard(ipywidgets.VBox):
    """A live view of the cluster: per-node bars, the cluster over time, tasks and actors.

    >>> dash = jc.dashboard()      # doctest: +SKIP
    >>> dash.close()               # doctest: +SKIP
    """

    def __init__(self, cluster: Cluster, window: float = 300.0, wait: float = 3.0) -> None:
        from bokeh.layouts import column, row
        from bokeh.models import CategoricalAxis, ColumnDataSource, DataRange1d, FactorRange, Range1d
        from bokeh.models.annotations import Legend
        from bokeh.plotting import figure

        load_bokeh()
        self.cluster = cluster
        self.window = window
        self.feed = MetricsFeed.of(cluster)
        self.labels: dict[str, str] = {}
        self.closed = False
        self._token: int | None = None
        self._rows: dict[str, dict[str, int]] = {}  # node id -> metric -> row index
        self._displays: list[Any] = []
        self._pictures: list[Any] = []
        self._said: tuple[str, Any] = ("", None)  # what the header last said of the link or the feed
        self._sampled: float | None = self.feed.received  # when the sample drawn last came (this kernel's clock)
        self._lock = threading.Lock()

        self.bars = ColumnDataSource({"y": [], "frac": [], "text": [], "color": [], "node": []})
        self.series = ColumnDataSource({"t": [], "cpu": [], "gpu": [], "store": []})
        rows = list(WORK)
        self.states = ColumnDataSource(
            {"y": rows, "count": [0.0] * len(rows), "text": ["0"] * len(rows), "color": [STATES[k] for k, _ in rows]}
        )

        self._node_factors: Any = FactorRange(factors=[], factor_padding=0.1, group_padding=0.6)
        self._state_factors: Any = FactorRange(factors=rows[::-1], group_padding=0.6)
        self.node_plot = figure(
            title="Nodes",
            y_range=self._node_factors,
            x_range=Range1d(start=0, end=1),
            width=480,
            height=120,
            toolbar_location=None,
            name="nodes",
        )
        self.node_plot.hbar(y="y", right="frac", height=0.75, color="color", source=self.bars)
        self.node_plot.text(x=0.01, y="y", text="text", source=self.bars, text_font_size="9pt", text_baseline="middle")
        self.node_plot.xaxis.visible = False
        self.node_plot.ygrid.grid_line_color = None

        self.state_plot = figure(
            title="The cells' work",
            y_range=self._state_factors,
            x_range=DataRange1d(start=0, range_padding=0.25),
            width=320,
            height=60 + 26 * len(rows),  # a group's label (rotated) fits beside its two rows
            toolbar_location=None,
            name="states",
        )
        self.state_plot.hbar(y="y", right="count", height=0.75, color="color", source=self.states)
        self.state_plot.text(
            x="count", y="y", text="text", source=self.states, text_font_size="9pt", text_baseline="middle", x_offset=3
        )
        self.state_plot.ygrid.grid_line_color = None
        for axis in self.state_plot.yaxis:
            if isinstance(axis, CategoricalAxis):  # a group's label (rotated) beside its rows
                axis.group_text_font_size = "8pt"

        self.time_plot = figure(
            title=f"Cluster, last {window / 60:g} min (%)",
            x_axis_type="datetime",
            x_range=DataRange1d(follow="end", follow_interval=window * 1000, range_padding=0),
            y_range=Range1d(start=0, end=100),
            width=800,
            height=200,
            toolbar_location=None,
            name="series",
        )
        lines: list[Any] = [
            ("CPU", self.time_plot.line("t", "cpu", source=self.series, color=COLORS["CPU"], line_width=2)),
            ("object store", self.time_plot.line("t", "store", source=self.series, color=COLORS["object store"])),
            ("GPU", self.time_plot.line("t", "gpu", source=self.series, color=COLORS["GPU"], line_width=2)),
        ]
        self.time_plot.add_layout(Legend(items=[(n, [r]) for n, r in lines], location="top_left"), "right")
        self.figures = column(row(self.node_plot, self.state_plot), self.time_plot, name="jupyter-cluster-dashboard")
        self.plots = _plots(self.figures, self._lock)
        self.header = ipywidgets.HTML(value=self._header())
        super().__init__(children=[self.header, self.plots])
        self.add_class("jupyter-cluster-dashboard")

        for t, cluster_totals in list(self.feed.history)[-int(window) :]:
            self._stream_point(t, cluster_totals)
        self._token = self.feed.subscribe(self._on_feed)
        _cluster.watchers.append(self._on_cluster)
        threading.Thread(target=self._age_ticks, name="jupyter-cluster-dashboard-age", daemon=True).start()
        with self._lock:  # the first sample may be drawing already, in the feed's thread
            drawn = bool(self.feed.nodes)
            if drawn:
                self._draw_nodes(set(self.feed.nodes))
                self._draw_states()
        if not drawn and wait:
            self.feed.wait_first(wait)  # so the first picture (and the snapshot) has the nodes

    # ------------------------------------------------------------------ feed
    def _on_feed(self, kind: str, data: Any) -> None:
        with self._lock:
            if self.closed:
                return
            if kind == "metrics":
                self._sampled = self.feed.received
                changed = set(data["nodes"])
                added = self._draw_nodes(changed, left=set(data["left"]))
                self._draw_states()
                self._stream_point(data["t"], self.feed.totals())
                if added:
                    self._resend()
            if kind in ("link", "ended"):
                self._said = (kind, data)
            self.header.value = self._header(*self._said)

    def _on_cluster(self, kind: str, data: Any) -> None:
        if kind == "cell" and getattr(data, "cluster", None) is self.cluster:
            data.add_done_callback(self._cell_ended)

    def _cell_ended(self, cell: Any) -> None:
        """Draw a cell's end at once, as its progress bar and the sidebar do: the next sample can come
        seconds late on a busy machine, and until then the work rows would say it still runs."""
        with self._lock:
            if self.closed:
                return
            self._draw_states()

    def _age_ticks(self) -> None:
        """Say the figures' age once a second while they are older than :data:`AGE_SAID` (nothing else redraws
        the header between samples)."""
        while True:
            time.sleep(1.0)
            with self._lock:
                if self.closed:
                    return
                if self._age() > AGE_SAID:
                    value = self._header(*self._said)
                    if value != self.header.value:
                        self.header.value = value

    def _age(self) -> float:
        return 0.0 if self._sampled is None else max(0.0, time.time() - self._sampled)

    def _header(self, kind: str = "", data: Any = None) -> str:
        nodes = self.feed.nodes
        stale = [self.labels.get(i, i) for i, n in nodes.items() if n.get("stale")]
        parts = [f"<b>{html.escape(self.cluster.kind)}</b>", html.escape(self._nodes_said())]
        source = self._source_said()
        if source:
            parts.append(source)
        if kind == "link" and isinstance(data, dict) and data.get("state") == "lost":
            parts.append(f"<span style='color:#c0392b'>link lost ({html.escape(str(data.get('reason')))})</span>")
        elif kind == "ended":
            parts.append(f"<span style='color:#c0392b'>stopped: {html.escape(str(data or 'closed'))}</span>")
        if stale:
            parts.append(f"<span style='color:#888'>stale: {html.escape(', '.join(stale))}</span>")
        system = system_said(self.feed.totals())
        if system:
            parts.append(
                f"<span style='color:#888' title=\"Ray's libraries' own actors and jupyter_cluster's helpers: "
                f'not in the tasks and actors drawn">{html.escape(system)}</span>'
            )
        others = other_jobs_said(self.feed.totals())
        if others:
            parts.append(
                "<span style='color:#888' title=\"the cluster's other Ray jobs: other notebooks' cells and what "
                f'their code started, scripts, submitted jobs; not in the tasks and actors drawn">{html.escape(others)}'
                "</span>"
            )
        if self.feed.history:
            updated = time.strftime("updated %H:%M:%S", time.localtime(self.feed.history[-1][0]))
            age = self._age()
            if age > AGE_SAID:  # every figure below is as old as the last sample
                updated = f"<span style='color:#c0392b'>{updated}: figures {age:.0f} s old</span>"
            parts.append(updated)
        return " · ".join(parts)

    def _nodes_said(self) -> str:
        count, shown = self.feed.count, len(self.feed.nodes)
        if count > shown:
            return f"{count} nodes ({shown} drawn: the head, then by address)"
        return f"{count} node(s)"

    def _source_said(self) -> str:
        """Where the figures come from, when it is worth saying: Prometheus, or scraping slowed down."""
        source = self.feed.source
        every = float(source.get("every") or 1.0)
        if source.get("error"):
            return f"<span style='color:#c0392b'>{html.escape(str(source['error']))}</span>"
        if source.get("kind") == "prometheus":
            return f"from Prometheus ({html.escape(str(source.get('url')))})"
        if every > 1.5:
            return (
                f"<span style='color:#888'>sampled every {every:.0f} s, to keep scraping the nodes under 3% of a core "
                "(a Prometheus server is lighter: <code>jc.dashboard(prometheus=URL)</code>)</span>"
            )
        return ""

    def _label(self, node_id: str, node: NodeSample) -> str:
        label = self.labels.get(node_id)
        if label is None:
            label = str(node.get("address", node_id)) + (" (head)" if node.get("head") else "")
            if label in self.labels.values() or any(
                n.get("address") == node.get("address") for i, n in self.feed.nodes.items() if i != node_id
            ):
                label += f" {node_id[:6]}"
            self.labels[node_id] = label
        return label

    def _resend(self) -> None:
        """Hand every view the plots as they are now.

        jupyter_bokeh gives a view the document as it was when the ``BokehModel`` was made,
        then only the changes made while that view is open: a view opened later (the cell's
        own output, drawn after this kernel has already streamed rows into the sources, or
        the notebook opened again) would patch rows it never got. Setting ``render_bundle``
        redraws every view from the whole document. It is done only when the dashboard is
        shown and when a node first appears (rows are added); everything else is ``stream``
        and ``patch``.
        """
        self.plots.render_bundle = self.plots._model_to_traits(self.figures)

    def _draw_nodes(self, changed: set[str], left: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        """Draw what changed on these nodes; True when rows were added."""
        new: dict[str, Any] = {"y": [], "frac": [], "text": [], "color": [], "node": []}
        patches: dict[str, list[tuple[int, Any]]] = {"frac": [], "text": [], "color": []}
        size = len(self.bars.data["y"])
        for node_id in sorted(changed):
            node = self.feed.nodes.get(node_id)
            if node is None:
                continue
            label = self._label(node_id, node)
            rows = self._rows.setdefault(node_id, {})
            stale = node.get("stale")
            for metric, frac, text in node_rows(node):
                color = STALE if stale else _color(metric)
                if stale:
                    text += " (stale)"
                index = rows.get(metric)
                if index is None:
                    rows[metric] = size + len(new["y"])
                    for key, value in zip(new, ((label, metric), frac, text, color, node_id), strict=True):
                        new[key].append(value)
                else:
                    patches["frac"].append((index, frac))
                    patches["text"].append((index, text))
                    patches["color"].append((index, color))
        shown = [
            (self.labels[i], metric)
            for i in sorted(self.feed.nodes, key=lambda i: (not self.feed.nodes[i].get("head"), self.labels.get(i, i)))
            if i in self._rows
            for metric in self._rows[i]
        ][::-1]  # a categorical axis counts from the bottom: the head and its object store on top
        # The factors before the rows: BokehJS throws on (node, metric) rows its range does not know yet.
        if new["y"] or left or list(self._node_factors.factors) != shown:
            self._node_factors.factors = shown
            self.node_plot.height = 50 + 20 * len(shown) + 12 * len(self.feed.nodes)
        if new["y"]:
            self.bars.stream(new)
        if patches["frac"]:
            self.bars.patch(patches)
        return bool(new["y"])

    def _draw_states(self) -> None:
        """Patch the work counts (their rows are all there from the start): the cells' from the kernel's cells,
        read now, at the tick that draws the nodes; Ray's from the same sample."""
        groups = work_counts(*self._cells(), cluster=self.feed.totals())
        patches: dict[str, list[tuple[int, Any]]] = {"count": [], "text": []}
        for index, key in enumerate(self.states.data["y"]):
            count = groups.get(key, 0.0)
            if self.states.data["count"][index] != count:
                patches["count"].append((index, count))
                patches["text"].append((index, f"{count:.0f}"))
        if patches["count"]:
            self.states.patch(patches)

    def _stream_point(self, t: float, cluster: NodeSample) -> None:
        store = 100 * _frac(cluster["store_used"], cluster["store_total"])
        gpu = cluster["gpu"] if cluster["gpu"] is not None else float("nan")
        point: dict[str, Any] = {"t": [t * 1000], "cpu": [cluster["cpu"]], "gpu": [gpu], "store": [store]}
        self.series.stream(point, rollover=int(self.window) + 1)

    # --------------------------------------------------------------- display
    def snapshot(self) -> str:
        """The dashboard as static HTML (what a notebook without a kernel shows)."""
        title = f"{self.cluster.kind}: {self._nodes_said()}"
        cells, last_map = self._cells()
        return snapshot_html(self.feed.nodes, self.labels, title, self.feed.totals(), cells, last_map)

    def _cells(self) -> tuple[list[Any], Any]:
        """The cluster's cells now, and the latest ``--map`` cell: running, or the last that ended (to show its
        items as it ended)."""
        cells = list(self.cluster.cells.values())
        maps = [cell for cell in cells if cell.mode == "map"]
        ended = getattr(self.cluster, "last_map", None)
        if ended is not None:
            maps.append(ended)
        return cells, max(maps, key=lambda cell: cell.submitted, default=None)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        if not self.closed:
            with self._lock:
                self._resend()  # the rows drawn since the BokehModel was made
        bundle = super()._repr_mimebundle_(**kwargs) if not self.closed else {}
        bundle = dict(bundle or {})
        bundle["text/html"] = self.snapshot()
        bundle["text/plain"] = repr(self)
        return bundle

    def _ipython_display_(self) -> None:
        from IPython.display import display

        self._displays.append(display(self._repr_mimebundle_(), raw=True, display_id=True))
        self._pictures.append(display({"text/plain": ""}, raw=True, display_id=True))  # filled by close()

    def picture(self) -> str:
        """The dashboard as an SVG: each drawn node's bars, and the cluster's CPU and object store over time."""
        from ._picture import Bars, Chart, Line, charts

        rows: list[tuple[str, float, str]] = []
        colors: list[str] = []
        for node_id in sorted(self._rows, key=lambda i: (not self.feed.nodes.get(i, {}).get("head"), i)):
            node = self.feed.nodes.get(node_id)
            if node is None:
                continue
            for metric, frac, text in node_rows(node):
                rows.append((f"{self.labels.get(node_id, node_id)[:18]} {metric}", frac, text))
                colors.append(_color(metric))
        history = list(self.feed.history)
        store = [(t, 100 * _frac(c.get("store_used", 0.0), c.get("store_total", 0.0))) for t, c in history]
        lines = [
            Line("CPU", [(t, c.get("cpu", 0.0)) for t, c in history], COLORS["CPU"]),
            Line("object store", store, COLORS["object store"]),
        ]
        if any(c.get("gpu") is not None for _, c in history):
            lines.append(Line("GPU", [(t, c["gpu"]) for t, c in history if c.get("gpu") is not None], COLORS["GPU"]))
        chart = Chart("the cluster (%)", "time", lines, y_range=(0.0, 100.0), x_time=True)
        title = f"{self.cluster.kind}: {self._nodes_said()}"
        return charts([chart], per_row=1, bars=Bars(title, rows, colors), size=(600, 200))

    def __repr__(self) -> str:
        state = "closed" if self.closed else "live"
        return f"<Dashboard of {self.cluster.kind}: {len(self.feed.nodes)} node(s), {state}>"

    def close(self) -> None:
        """Stop drawing; sampling stops once no dashboard watches. What it showed stays, as a snapshot."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        token = getattr(self, "_token", None)
        if token is not None:
            self.feed.unsubscribe(token)
        with contextlib.suppress(ValueError):
            _cluster.watchers.remove(self._on_cluster)
        final = {"text/html": self.snapshot(), "text/plain": repr(self)}
        for handle in self._displays:
            handle.update(final, raw=True)
        if self._pictures:
            from ._picture import bundle

            drawn = bundle(self.picture(), f"[a picture of the dashboard of {self.cluster.kind}]")
            for handle in self._pictures:
                handle.update(drawn, raw=True)
        self.plots.close()
        self.header.close()
        super().close()


_Plots: Any = None


#: Seconds after which a plot sends its changes even though no view said it is displayed
#: (a frontend that does not count views, such as an old widget manager).
LIVE_FALLBACK = 10.0


def _plots(figures: Any, lock: Any, fallback: float | None = None) -> Any:
    """A ``jupyter_bokeh.BokehModel`` that sends changes only once a view of it is shown.

    jupyter_bokeh sends each document change as several comm messages that a view's
    receiver reassembles. A view made while one is half through (the browser builds it
    between two of them, which a busy page does) reads every later change out of step,
    and draws none of them. So changes wait until the frontend counts a displayed view
    (``_view_count``); then every view gets the whole document (``render_bundle``), and
    changes flow. ``lock`` is the lock its owner changes the document under. Its
    ``close`` may run twice (jupyter_bokeh's own raises the second time, which garbage
    collection does after an explicit close). ``fallback``: seconds after which changes flow though no view was
    counted (a cell that blocks while its widget draws, as ``jc.tune`` does, holds back the frontend's count
    until it ends).
    """
    global _Plots
    if _Plots is None:
        from jupyter_bokeh import BokehModel

        class Plots(BokehModel):
            _closed_once = False

            def __init__(self, figures: Any, lock: Any, fallback: float) -> None:
                self.live = False
                self._owner_lock = lock
                super().__init__(figures)
                self._view_count = 0  # the frontend counts the views it displays
                self.observe(self._on_views, names="_view_count")
                timer = threading.Timer(fallback, self._fallback)
                timer.daemon = True
                timer.start()

            def _fallback(self) -> None:
                # Only for a frontend that never said a view is shown: handing a live view the whole document
                # again redraws it (its axes then stop following the data).
                if not self.live:
                    self.go_live()

            def _on_views(self, change: dict[str, Any]) -> None:
                if (change["new"] or 0) > (change["old"] or 0):
                    self.go_live()

            def go_live(self) -> None:
                """Hand every view the whole document, and send changes from now on."""
                with self._owner_lock:
                    if self._closed_once:
                        return
                    self.live = True
                    self.render_bundle = self._model_to_traits(self._model)

            def _document_patched(self, event: Any) -> None:
                if self.live:
                    super()._document_patched(event)

            def close(self) -> None:
                if not self._closed_once:
                    self._closed_once = True
                    super().close()

        _Plots = Plots
    return _Plots(figures, lock, LIVE_FALLBACK if fallback is None else fallback)


def dashboard(cluster: Cluster, window: float = 300.0) -> Dashboard:
    return Dashboard(cluster, window=window)


__all__ = [
    "Dashboard",
    "dashboard",
    "load_bokeh",
    "node_rows",
    "other_jobs_said",
    "snapshot_html",
    "state_groups",
    "system_said",
]
