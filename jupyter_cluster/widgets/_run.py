"""What the training and trial widgets share: a header, Bokeh plots, a table, a snapshot.

A :class:`RunView` is an ipywidget (``VBox``) fed the events of a run's cell from the
link's thread. Plots change by ``stream`` and ``patch`` only, except when a figure is
added (a metric seen for the first time), after which every view is handed the whole
document once (see :meth:`Dashboard._resend`). The header and the table are redrawn at
most every :attr:`EVERY` seconds. The mime bundle carries an HTML snapshot beside the
widget view, and when the run ends a picture of its curves (SVG, :mod:`._picture`) fills
the output kept for it below the view: a saved notebook read where no widgets run
(GitHub, nbviewer) shows the run as it ended.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets

from .._handles import format_metric
from ._dashboard import _plots, load_bokeh
from ._picture import bundle
from ._progress import _later, elapsed, in_current_cell

PALETTE = (
    "#4c78a8",
    "#f58518",
    "#54a24b",
    "#b279a2",
    "#e45756",
    "#72b7b2",
    "#eeca3b",
    "#9d755d",
    "#ff9da6",
    "#bab0ac",
)
STATE_COLORS = {
    "running": "#1565c0",
    "done": "#2e7d32",
    "failed": "#c62828",
    "cancelled": "#757575",
    "RUNNING": "#1565c0",
    "PENDING": "#757575",
    "TERMINATED": "#2e7d32",
    "STOPPED": "#9e9e9e",
    "ERROR": "#c62828",
    "PAUSED": "#ef6c00",
}

#: The tables' cells, spaced (an ipywidgets HTML value may carry a style element).
TABLE_STYLE = (
    "<style>.jc-train-table td,.jc-train-table th,.jc-trials-table td,.jc-trials-table th"
    "{padding:1px 10px 1px 0;text-align:left;white-space:nowrap}</style>"
)


#: How often a running run's header says its run time again (seconds).
CLOCK = 1.0
#: Seconds after which a run's curves draw live though the frontend has not said a view is shown: the cell that
#: runs ``jc.tune`` or ``jc.train_torch`` blocks until the run ends, and the kernel reads the frontend's count only
#: then. The view is shown with the widget, at once, before the first result (the run starts Ray workers first).
LIVE_AFTER = 1.0


def fmt(value: Any) -> str:
    return html.escape(format_metric(value))


class RunView(ipywidgets.VBox):
    """The live view of a run: subclasses draw its events."""

    EVERY = 0.25

    def __init__(self, label: str) -> None:
        from bokeh.layouts import column

        load_bokeh()
        self.label = label
        self.state = "starting"
        self.detail = ""
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.run: Any = None
        self._lock = threading.RLock()
        self._sent = 0.0
        self._scheduled = False
        self._display: Any = None
        self._picture: Any = None
        #: ``(reported at, drawn at)`` of each report drawn (for the latency benchmark).
        self.latency: list[tuple[float, float]] = []
        self._arrived: list[float] = []  # when the reports not drawn yet were made
        self.layout_root = column(name="jupyter-cluster-run")
        self.plots = _plots(self.layout_root, self._lock, fallback=LIVE_AFTER)
        self.header = ipywidgets.HTML(value=self._header())
        self.table = ipywidgets.HTML(value="")
        super().__init__(children=[self.header, self.plots, self.table])
        self.add_class("jupyter-cluster-run")

    # --------------------------------------------------------------- display
    def show(self) -> None:
        from IPython.display import display

        self._display = display(self._bundle(), raw=True, display_id=True)
        self._picture = display({"text/plain": ""}, raw=True, display_id=True)  # the final picture's place

    def _bundle(self) -> dict[str, Any]:
        # A view made from this bundle (shown again, or the final update) starts from the
        # render bundle: hand it the whole document as it is now (see Dashboard._resend).
        with self._lock:
            self._resend()
        bundle = dict(ipywidgets.VBox._repr_mimebundle_(self) or {})
        bundle["text/html"] = self.snapshot()
        bundle["text/plain"] = repr(self)
        return bundle

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self._bundle()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}: {self.state}>"

    def _resend(self) -> None:
        self.plots.render_bundle = self.plots._model_to_traits(self.layout_root)

    # ---------------------------------------------------------------- events
    def started(self, run: Any) -> None:
        self.run = run
        self.started_at = run.started  # one clock for the view and the result (see Run.elapsed)
        self.state = "queued"
        self.redraw(now=True)
        _later(CLOCK, self._clock)

    def _clock(self) -> None:
        """The header's run time, once a second while the run goes on: between two reports (a training's epoch
        may take minutes) it would otherwise say how long the run had taken at the last one."""
        if self.ended_at is not None:
            return
        with self._lock:
            header = self._header()
        if header != self.header.value:
            self.header.value = header
        _later(CLOCK, self._clock)

    def on_event(self, event: str, data: Any, run: Any) -> None:
        with self._lock:
            if event == "running":
                self.state = "running"
            elif event == "link":
                self.detail = f"link {data.get('state')}" if data.get("state") != "connected" else ""
            elif event in ("error", "lost"):
                self.state = "failed"
            elif isinstance(data, dict) and event == self.kind:
                if data.get("type") == "start":
                    self.state = "running"
                self.draw(data)
        self.redraw(now=event not in (self.kind, "stream"))

    def finish(self, state: str, run: Any, result: Any = None) -> None:
        with self._lock:
            if self.ended_at is None:
                self.ended_at = getattr(run, "ended", None) or time.time()
            self.state = state
            self.ended(result)
        self.redraw(now=True)
        if self._display is not None:
            # The run ended: its widget gives way to what it showed, as static HTML (with the picture of its curves
            # below), which a saved notebook keeps. The widget's own bundle again would make JupyterLab build its
            # views anew, and BokehJS then replays the curves' streamed rows onto the whole document: each trial's
            # first points twice.
            with self._lock:
                final = {"text/html": self.snapshot(), "text/plain": repr(self)}
            in_current_cell(self._display.update, final, raw=True)
        if self._picture is not None:
            with self._lock:
                svg = self.picture()
            if svg:
                in_current_cell(self._picture.update, bundle(svg, f"[a picture of {self.label}'s curves]"), raw=True)

    # subclasses
    kind = ""

    def draw(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def ended(self, result: Any) -> None:
        pass

    def table_html(self) -> str:
        return ""

    def flush_plots(self) -> None:
        """Put what came since the last tick into the plots' sources (under the lock, as the header and table
        are drawn): the curves never run ahead of the table beside them."""

    def picture(self) -> str:
        """The run's curves as an SVG ('' when there are none)."""
        return ""

    def summary(self) -> str:
        return ""

    # ---------------------------------------------------------------- redraw
    def _header(self) -> str:
        color = STATE_COLORS.get(self.state, "#333")
        spent = (self.ended_at or time.time()) - self.started_at
        parts = [
            f"<b>{html.escape(self.label)}</b>",
            f'<span style="color:{color}">{html.escape(self.state)}</span>',
            f"run time {elapsed(spent)}",
        ]
        summary = self.summary()
        if summary:
            parts.append(summary)
        if self.detail:
            parts.append(f'<span style="color:#c62828">{html.escape(self.detail)}</span>')
        return " · ".join(parts)

    def redraw(self, now: bool = False) -> None:
        with self._lock:
            wait = self.EVERY - (time.monotonic() - self._sent)
            if not now and wait > 0:
                if not self._scheduled:
                    self._scheduled = True
                    _later(wait, self._deferred)
                return
            self._sent = time.monotonic()
            self.flush_plots()  # the curves, the header and the table: one tick
            header, table = self._header(), self.table_html()
            drawn = time.time()
            self.latency += [(made, drawn) for made in self._arrived]
            self._arrived.clear()
        self.header.value = header
        if table != self.table.value:
            self.table.value = table

    def _deferred(self) -> None:
        with self._lock:
            self._scheduled = False
        self.redraw(now=True)

    def snapshot(self) -> str:
        """The run as static HTML: its header and table."""
        with self._lock:
            return f'<div class="jc-run-snapshot">{self._header()}{self.table_html()}</div>'


def figure(title: str, x_label: str) -> Any:
    from bokeh.plotting import figure as bokeh_figure

    plot = bokeh_figure(title=title, width=330, height=210, toolbar_location=None, name=title)
    plot.xaxis.axis_label = x_label
    ticker: Any = plot.xaxis.ticker
    ticker.min_interval = 1  # epochs and iterations are whole: no tick at 1.5
    if plot.title is not None and not isinstance(plot.title, str):
        plot.title.text_font_size = "10pt"
    return plot


__all__ = ["PALETTE", "STATE_COLORS", "TABLE_STYLE", "RunView", "figure", "fmt"]
