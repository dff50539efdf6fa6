"""Static pictures of the live views, as SVG: what a saved notebook shows where no kernel runs.

GitHub and nbviewer draw no widgets: a notebook read there shows each view's HTML snapshot
(its header and table) and, beside it, the picture made here when the view ends: the training
curves, the trials' curves, the dashboard's bars and its cluster line. Drawn in plain SVG by
this module (no browser, no plotting library), a few kilobytes each, the same every time for
the same data.

>>> svg = charts([Chart("loss", "epoch", [Line("rank 0", [(1, 0.9), (2, 0.5)], "#4c78a8")])])
>>> svg.startswith("<svg")
True
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

#: A panel of a picture, in pixels, and its margins (left for the y labels, bottom for the x's).
PANEL_W, PANEL_H = 300, 190
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 24, 34
#: The gutter right of a plot that holds its legend.
LEGEND_W = 104
FONT = 'font-family="sans-serif" font-size="10"'
GRID = "#e5e5e5"
AXIS = "#666"


@dataclass
class Line:
    """One curve: its name (in the legend), points, colour; ``end``: a mark on its last point
    (``"x"``: stopped early, ``"o"``: failed)."""

    name: str
    points: list[tuple[float, float]]
    color: str
    end: str = ""
    faded: bool = False


@dataclass
class Chart:
    """One panel: a title, the x axis' name, its lines; ``y_range`` fixed (else from the data)."""

    title: str
    x_label: str
    lines: list[Line]
    y_range: tuple[float, float] | None = None
    x_time: bool = False
    legend: bool = True


@dataclass
class Bars:
    """One panel of horizontal bars: ``(label, fraction full, text)`` rows and their colours."""

    title: str
    rows: list[tuple[str, float, str]]
    colors: list[str] = field(default_factory=list)


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values spanning ``low``..``high`` (1, 2 or 5 times a power of ten apart)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    out = []
    value = first
    while value <= high + step * 1e-9:
        out.append(round(value, 12))
        value += step
    return out


def label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:.4g}"


def _chart(chart: Chart, x0: float, y0: float, pw: float = PANEL_W, ph: float = PANEL_H) -> list[str]:
    out = [f'<text x="{x0 + LEFT}" y="{y0 + 15}" {FONT} font-weight="bold">{html.escape(chart.title)}</text>']
    points = [p for line in chart.lines for p in line.points if all(math.isfinite(v) for v in p)]
    named = [line for line in chart.lines if line.name and line.points]
    legend = chart.legend and len(named) > 1
    # The legend in a gutter of its own, right of the plot: never over the curves.
    w, h = pw - LEFT - RIGHT - (LEGEND_W if legend else 0), ph - TOP - BOTTOM
    left, top = x0 + LEFT, y0 + TOP
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="{GRID}"/>')
    if not points:
        out.append(f'<text x="{left + w / 2}" y="{top + h / 2}" {FONT} fill="#999" text-anchor="middle">no data</text>')
        return out
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_low, x_high = min(xs), max(xs)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_low, y_high = chart.y_range or (min(ys), max(ys))
    if y_high == y_low:
        y_low, y_high = y_low - (abs(y_low) * 0.1 or 1), y_high + (abs(y_high) * 0.1 or 1)
    if chart.y_range is None:  # a little room above and below the curves
        pad = 0.06 * (y_high - y_low)
        y_low, y_high = y_low - pad, y_high + pad
    y_ticks = ticks(y_low, y_high)

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * w

    def py(y: float) -> float:
        return top + h - (y - y_low) / (y_high - y_low) * h

    for value in y_ticks:
        y = py(value)
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{left - 4}" y="{y + 3:.1f}" {FONT} fill="{AXIS}" text-anchor="end">{label(value)}</text>')
    x_ticks = ticks(x_low, x_high)
    if not chart.x_time and all(float(t).is_integer() for t in xs):  # whole epochs and iterations: whole ticks
        x_ticks = [t for t in x_ticks if float(t).is_integer()]
    for value in x_ticks:
        x = px(value)
        text = _clock(value) if chart.x_time else label(value)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + h}" y2="{top + h + 3}" stroke="{AXIS}"/>')
        out.append(f'<text x="{x:.1f}" y="{top + h + 13}" {FONT} fill="{AXIS}" text-anchor="middle">{text}</text>')
    out.append(
        f'<text x="{left + w / 2}" y="{top + h + 27}" {FONT} fill="{AXIS}" text-anchor="middle">'
        f"{html.escape(chart.x_label)}</text>"
    )
    for line in chart.lines:
        good = [(x, y) for x, y in line.points if math.isfinite(x) and math.isfinite(y)]
        if not good:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in good)
        opacity = ' stroke-opacity="0.55"' if line.faded else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{line.color}" stroke-width="1.8"{opacity}/>')
        if len(good) == 1 and not line.end:  # a lone point; one with an end mark is drawn as that mark only
            x, y = good[0]
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{line.color}"/>')
        if line.end:
            x, y = px(good[-1][0]), py(good[-1][1])
            if line.end == "x":
                out.append(
                    f'<path d="M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},{y + 4:.1f}'
                    f'L{x + 4:.1f},{y - 4:.1f}" stroke="{line.color}" stroke-width="2"/>'
                )
            else:
                out.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="none" stroke="{line.color}" stroke-width="2"/>'
                )
    if legend:
        room = max(1, int((h - 10) // 12))
        for index, line in enumerate(named[:room]):
            y = top + 10 + 12 * index
            out.append(
                f'<line x1="{left + w + 8}" x2="{left + w + 20}" y1="{y - 3}" y2="{y - 3}" '
                f'stroke="{line.color}" stroke-width="2"/>'
            )
            out.append(f'<text x="{left + w + 24}" y="{y}" {FONT} fill="#333">{html.escape(line.name[:14])}</text>')
        if len(named) > room:
            out.append(
                f'<text x="{left + w + 24}" y="{top + 10 + 12 * room}" {FONT} fill="#999">'
                f"+{len(named) - room} more</text>"
            )
    return out


def _bars(panel: Bars, x0: float, y0: float, width: float) -> list[str]:
    out = [f'<text x="{x0 + 6}" y="{y0 + 15}" {FONT} font-weight="bold">{html.escape(panel.title)}</text>']
    label_w = min(360, 16 + 6 * max((len(name) for name, _, _ in panel.rows), default=10))
    for index, (name, frac, text) in enumerate(panel.rows):
        y = y0 + TOP + 18 * index
        color = panel.colors[index] if index < len(panel.colors) else "#4c78a8"
        full = width - label_w - 16
        fill = max(0.0, min(1.0, frac)) * full
        out.append(
            f'<text x="{x0 + label_w - 6}" y="{y + 11}" {FONT} fill="#333" text-anchor="end">{html.escape(name)}</text>'
        )
        out.append(f'<rect x="{x0 + label_w}" y="{y}" width="{full:.1f}" height="14" fill="#f2f2f2"/>')
        out.append(f'<rect x="{x0 + label_w}" y="{y}" width="{fill:.1f}" height="14" fill="{color}"/>')
        out.append(f'<text x="{x0 + label_w + 4}" y="{y + 11}" {FONT} fill="#111">{html.escape(text)}</text>')
    return out


def charts(
    panels: list[Chart], per_row: int = 3, bars: Bars | None = None, size: tuple[int, int] = (PANEL_W, PANEL_H)
) -> str:
    """An SVG of ``panels`` (each ``size`` pixels), ``per_row`` to a row, under an optional panel of ``bars``."""
    pw, ph = size
    columns = max(1, min(per_row, len(panels))) if panels else 1
    width = columns * pw
    bars_h = TOP + 18 * len(bars.rows) + 8 if bars is not None else 0
    rows = math.ceil(len(panels) / columns) if panels else 0
    height = bars_h + rows * ph
    body: list[str] = []
    if bars is not None:
        width = max(width, 2 * PANEL_W)
        body += _bars(bars, 0, 0, width)
    for index, chart in enumerate(panels):
        body += _chart(chart, (index % columns) * pw, bars_h + (index // columns) * ph, pw, ph)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}"><rect width="{width}" height="{height}" fill="white"/>'
        + "".join(body)
        + "</svg>"
    )


def _clock(seconds: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(seconds))


def bundle(svg: str, text: str) -> dict[str, str]:
    """A display bundle of a picture: the SVG, and what a plain-text reader sees."""
    return {"image/svg+xml": svg, "text/plain": text}


def gantt(
    lanes: list[str], bars: list[tuple[int, float, float, str, str]], title: str, span: float = 0.0, width: int = 760
) -> str:
    """An SVG of ``bars`` (lane index, start, end in seconds, colour, hover text) on ``lanes``, one row each, over
    ``span`` seconds at least; each bar's hover text is its SVG title (what a browser shows over it)."""
    row, left, top = 18, 170, 28
    plot_w = width - left - 16
    height = top + row * max(1, len(lanes)) + 34
    end = max(span, max((b[2] for b in bars), default=1.0)) or 1.0
    out = [f'<text x="6" y="16" {FONT} font-weight="bold">{html.escape(title)}</text>']
    for index, lane in enumerate(lanes):
        y = top + row * index
        out.append(
            f'<text x="{left - 6}" y="{y + 12}" {FONT} fill="#333" text-anchor="end">{html.escape(lane[:28])}</text>'
        )
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y + row - 1}" y2="{y + row - 1}" stroke="{GRID}"/>')
    for at, start, stop, color, text in bars:
        x = left + start / end * plot_w
        w = max(1.0, (stop - start) / end * plot_w)
        y = top + row * at + 2
        out.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 5}" fill="{color}">'
            f"<title>{html.escape(text)}</title></rect>"
        )
    axis_y = top + row * max(1, len(lanes)) + 4
    for value in ticks(0.0, end):
        x = left + value / end * plot_w
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{axis_y}" y2="{axis_y + 3}" stroke="{AXIS}"/>')
        out.append(
            f'<text x="{x:.1f}" y="{axis_y + 14}" {FONT} fill="{AXIS}" text-anchor="middle">{label(value)} s</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="white"/>' + "".join(out) + "</svg>"
    )


__all__ = ["Bars", "Chart", "Line", "bundle", "charts", "gantt", "label", "ticks"]
