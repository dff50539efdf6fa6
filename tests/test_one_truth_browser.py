"""One truth in a real browser: the views of one ``--map`` cell, read from the page at the same instants, agree.

JupyterLab on loopback and headless Chromium (``tests/lab.py``), the *Ray cluster* sidebar open beside a notebook
that starts the embedded cluster, shows ``jc.dashboard()`` and runs a ``--map`` cell of 24 items, each a quarter
of a second of CPU, on two CPUs. While it runs, and for a few seconds after, the test reads from the page, four
times a second, every view's count of the map's items done:

* the cell's progress bar (its output area: ``12/24 items done, 2 tasks running``, then ``24/24 items done in``);
* the sidebar's row of the cell (``12/24 items``);
* the dashboard's work panel (BokehJS's own data of its ``map items · done`` row; the canvas draws it).

It fails where, at some instant, one view shows a count outside those another showed within one refresh (the
dashboard and the sidebar redraw once a second) of it, further behind or ahead, and where, a refresh after the
cell's end, a view does not show the map's end as its result has it: 24 of 24 items done, no cell running. The
page is kept as a screenshot about once a second, in ``tests/artifacts/browser/one-truth-*.png``, with the
readings (``one-truth.json``).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .lab import (
    ARTIFACTS,
    CHROMIUM,
    Lab,
    console_problems,
    lab_server,
    open_notebook,
    screenshot_failed,
    write_notebook,
)

NOTEBOOK = "one-truth.ipynb"
ITEMS = 24
CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc",
    "dash = jc.dashboard()\ndash",
    f"%%remote --map i in range({ITEMS})\nimport time\nstarted = time.process_time()\n"
    "while time.process_time() - started < 0.25:  # a quarter of a second of CPU\n    pass\ny = i",
]
SIDEBAR = "#jupyter-cluster-sidebar"
#: One refresh of the views that redraw on a clock (the dashboard samples once a second), with the time a reading
#: of the page takes (a second, on two cores running another test process beside this one) and the lag of a
#: busy page in drawing what came. Where the dashboard samples less often (it spaces its rounds on a busy
#: machine), its longest gap counts instead.
REFRESH = 2.5

#: Run cell ``index`` of the current notebook; with ``wait``, settle once it has run (true: it succeeded).
RUN_CELL_JS = """
([index, wait]) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  panel.content.activeCellIndex = index;
  panel.content.deselectAll();
  const ran = app.commands.execute("notebook:run-cell");
  return wait ? ran : true;
}
"""

#: Every view's count of the map's items done, read at once: [bar, sidebar, dashboard, the bar's text].
READ_JS = """
([index, sidebar]) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  const bar = cell && cell.outputArea ? cell.outputArea.node.innerText : "";
  const row = document.querySelector(sidebar + " .jc-cell .jc-progress");
  let dashboard = null;
  const Bokeh = window.Bokeh;
  for (const view of (Bokeh && Bokeh.index) || []) {
    const doc = view.model && view.model.document;
    if (!doc) continue;
    for (const model of doc._all_models.values()) {
      const data = model.data;
      if (!data || typeof data !== "object" || !("count" in data) || !("y" in data)) continue;
      const rows = Array.from(data.y);
      const at = rows.findIndex((y) => y[0] === "map items" && y[1] === "done");
      const running = rows.findIndex((y) => y[0] === "cells" && y[1] === "running");
      if (at >= 0) dashboard = [data.count[at], data.count[running]];
    }
  }
  // The dashboard's samples (ms): how often it redraws on this machine now.
  let samples = [];
  for (const view of (Bokeh && Bokeh.index) || []) {
    const doc = view.model && view.model.document;
    if (!doc) continue;
    for (const model of doc._all_models.values()) {
      const data = model.data;
      if (data && typeof data === "object" && "cpu" in data && "t" in data) samples = Array.from(data.t);
    }
  }
  return [bar, row ? row.innerText : null, dashboard, samples];
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_server(tmp_path_factory, log_name="one-truth-lab.log") as server:
        yield server


def _done_in_bar(text: str) -> int | None:
    found = re.search(rf"(\d+)/{ITEMS} items done", text)
    return int(found.group(1)) if found else None


def _done_in_row(text: str | None) -> int | None:
    found = re.match(rf"(\d+)/{ITEMS} items", text or "")
    return int(found.group(1)) if found else None


def disagreements(readings: list[dict[str, Any]], views: tuple[str, ...], refresh: float) -> list[str]:
    """Where a view showed, at some instant, a figure outside what another view showed within ``refresh`` seconds
    of it: further behind, or ahead, than one refresh. The figures move one way as the work goes on (items done,
    results and the best score grow; a loss falls). A view that redraws once a second skips figures another shows
    between its redraws: 6, then 12; a figure between two the other showed is no disagreement, nor is any figure
    where the other showed nothing yet within the refresh (it is behind by no more than that)."""
    found = []
    for reading in readings:
        for view in views:
            value = reading[view]
            if value is None:
                continue
            for other in views:
                if other == view:
                    continue
                window = [r[other] for r in readings if abs(r["t"] - reading["t"]) <= refresh]
                if None in window:  # the other view drew nothing yet within the refresh: it is behind, no more
                    continue
                if not min(window) <= value <= max(window):
                    found.append(f"at {reading['t']:.2f} s the {view} said {value}; the {other} said {sorted(window)}")
    return found


def test_the_disagreement_check_can_fail() -> None:
    readings: list[dict[str, Any]] = [{"t": t / 4, "bar": t, "sidebar": t, "dashboard": t - t % 4} for t in range(13)]
    assert not disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)  # the dashboard redraws each second
    readings[8]["dashboard"] = 1  # an old figure, seven readings behind
    assert disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)
    readings[8]["dashboard"] = 8
    readings[0]["sidebar"] = readings[1]["sidebar"] = None  # not drawn yet: behind, not wrong
    assert not disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)
    readings[2]["sidebar"] = 12  # ahead of every other view
    assert disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)


@pytest.mark.timeout(420)
def test_the_views_of_a_map_cell_agree_at_every_instant(lab: Lab) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("one-truth*"):
        stale.unlink()
    write_notebook(lab.root / NOTEBOOK, CELLS)
    console: list[str] = []
    readings: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page: Any = None
        try:
            page = open_notebook(browser, lab, NOTEBOOK, console, {"width": 1500, "height": 1100})
            page.locator('.jp-SideBar [data-id="jupyter-cluster-sidebar"]').click(timeout=20_000)
            for index in (0, 1):
                assert page.evaluate(RUN_CELL_JS, [index, True]) is True, f"cell {index} failed"
            page.locator(SIDEBAR).locator(".jc-node").first.wait_for(timeout=60_000)
            page.locator(".jupyter-cluster-dashboard canvas").first.wait_for(timeout=60_000)
            time.sleep(2)  # the dashboard's first samples
            page.evaluate(RUN_CELL_JS, [2, False])
            started = time.monotonic()
            ended: float | None = None
            shot, shots = 0.0, 0
            while time.monotonic() - started < 120:
                bar, row, dashboard, samples = page.evaluate(READ_JS, [2, SIDEBAR])
                now = time.monotonic() - started
                reading = {
                    "t": round(now, 3),
                    "bar": _done_in_bar(bar),
                    "sidebar": _done_in_row(row),
                    "dashboard": None if dashboard is None else int(dashboard[0]),
                    "dashboard_cells_running": None if dashboard is None else int(dashboard[1]),
                    "bar_text": bar.strip().splitlines()[-1] if bar.strip() else "",
                    "sidebar_text": row,
                }
                readings.append(reading)
                if now - shot >= 1.0:
                    shots += 1
                    page.screenshot(path=str(ARTIFACTS / f"one-truth-{shots:02d}.png"))
                    shot = now
                if ended is None and f"{ITEMS}/{ITEMS} items done in" in bar:
                    ended = now
                if ended is not None and now - ended > 4 * REFRESH:
                    break
                time.sleep(0.25)
            (ARTIFACTS / "one-truth.json").write_text(json.dumps(readings, indent=1))
            assert ended is not None, f"the map never ended: {readings[-1]}"
            during = [r for r in readings if r["t"] <= ended]
            assert any(r["bar"] not in (None, 0, ITEMS) for r in during), "no reading while the map ran"
            assert any(r["dashboard"] not in (None, 0, ITEMS) for r in during), "the dashboard never showed it run"
            # One refresh: the dashboard's longest gap between two samples during the run (it spaces its sampling
            # to keep its cost down on a busy machine, and its header says so), and the reading's own slack.
            gaps = [b - a for a, b in itertools.pairwise(samples) if a >= samples[-1] - 1000 * (ended + 10)]
            refresh = max(REFRESH, max(gaps, default=0) / 1000 + REFRESH - 1.0)
            problems = disagreements(readings, ("bar", "sidebar", "dashboard"), refresh)
            assert not problems, "\n".join(problems[:20])
            # A refresh after the end, every view says it ended: all the items done, nothing running.
            after = [r for r in readings if r["t"] > ended + refresh]
            assert after, readings[-3:]
            for r in after:
                assert (r["bar"], r["sidebar"], r["dashboard"], r["dashboard_cells_running"]) == (
                    ITEMS,
                    ITEMS,
                    ITEMS,
                    0,
                ), r
            assert not console_problems(console), "\n".join(console[-40:])
        except (AssertionError, PlaywrightError) as exc:
            (ARTIFACTS / "one-truth.json").write_text(json.dumps(readings, indent=1))
            screenshot_failed(page, "one-truth-failed.png")
            raise AssertionError(f"{exc}\n" + "\n".join(console[-30:])) from exc
        finally:
            browser.close()


RUNS_NOTEBOOK = "one-truth-runs.ipynb"
RUNS_CELLS = [
    CELLS[0],
    CELLS[1],
    # A sweep: four trials of eight results on two CPUs (two at a time).
    "def trainable(config):\n"
    "    import time\n"
    "    from ray import tune\n"
    "    for i in range(1, 9):\n"
    "        time.sleep(0.4)\n"
    "        tune.report({'score': config['lr'] * i})\n"
    "sweep = jc.tune(trainable, {'lr': jc.grid_search([0.1, 0.2, 0.3, 0.4])}, metric='score', mode='max')\n"
    "sweep",
    # A training: one worker, eight reports.
    "def train_func(config):\n"
    "    import time\n"
    "    import ray.train\n"
    "    for epoch in range(1, 9):\n"
    "        time.sleep(0.4)\n"
    "        ray.train.report({'epoch': epoch, 'loss': 1.0 / epoch})\n"
    "result = jc.train_torch(train_func, num_workers=1)\n"
    "result",
]

#: What a run's widget (once it ended: its snapshot and picture), its curves and its sidebar row say, and the
#: cell's result once it ended: [header, table, points drawn (tune: every trial's; train: the loss curve's), the
#: sidebar's row's detail, its time, the cell's output].
READ_RUN_JS = """
([index, sidebar, kind]) => {
  const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
  const output = cell && cell.outputArea ? cell.outputArea.node.innerText : "";
  const widget = cell ? cell.node.querySelector(".jupyter-cluster-run") : null;
  // Once the run ended, its widget gives way to a snapshot of it and a picture of its curves.
  const snapshot = cell ? cell.node.querySelector(".jc-run-snapshot") : null;
  let header = "", table = "", points = null;
  if (widget) {
    const htmls = widget.querySelectorAll(".widget-html");
    header = htmls.length > 0 ? htmls[0].innerText : "";
    table = htmls.length > 1 ? htmls[1].innerText : "";
    for (const view of (window.Bokeh && window.Bokeh.index) || []) {
      const doc = view.model && view.model.document;
      if (!doc || !widget.contains(view.el)) continue;
      for (const model of doc._all_models.values()) {
        const data = model.data;
        if (!data || typeof data !== "object" || !("xs" in data)) continue;
        const lengths = Array.from(data.xs).map((xs) => xs.length);
        if (kind === "tune" && "trial" in data) points = lengths.reduce((n, k) => n + k, 0);
        if (kind === "train" && "worker" in data) points = lengths.length ? Math.max(...lengths) : 0;
      }
    }
  } else if (snapshot) {
    const shown = snapshot.querySelector("table");
    table = shown ? shown.innerText : "";
    header = snapshot.innerText.split("\\n")[0];
    const lengths = [];
    for (const img of cell.node.querySelectorAll('img[src^="data:image/svg+xml"]')) {  // how JupyterLab shows an SVG
      const [meta, data] = img.src.split(",", 2);
      const svg = meta.endsWith(";base64") ? atob(data) : decodeURIComponent(data);
      const parsed = new DOMParser().parseFromString(svg, "image/svg+xml");
      for (const line of parsed.querySelectorAll("polyline")) lengths.push(line.points.numberOfItems);
    }
    if (lengths.length) points = kind === "tune" ? lengths.reduce((n, k) => n + k, 0) : Math.max(...lengths);
  }
  const row = document.querySelector(sidebar + " .jc-run");
  const detail = row ? (row.querySelector(".jc-row-detail") || {}).innerText || "" : null;
  const time = row ? row.querySelector(".jc-elapsed").innerText : null;
  return [header, table, points, detail, time, output];
}
"""


def _table_rows(table: str) -> list[list[str]]:
    return [line.split("\t") for line in table.strip().splitlines()[1:] if "\t" in line]


def _number(pattern: str, text: str | None) -> float | None:
    found = re.search(pattern, text or "")
    return float(found.group(1)) if found else None


def read_sweep(raw: list[Any]) -> dict[str, Any]:
    """A sweep's figures from each view: results drawn (table: the iterations column's sum; curves: their points),
    the best score (widget, sidebar), the trials (widget, sidebar)."""
    header, table, points, detail, took, output = raw
    rows = _table_rows(table)
    sidebar_trials = sum(int(n) for n in re.findall(r"(\d+) [a-z ]+?(?: ·|$)", (detail or "").split("(max)")[-1]))
    return {
        "table_results": sum(int(r[3]) for r in rows if len(r) > 3 and r[3].isdigit()) if rows else None,
        "curve_results": points,
        "widget_best": _number(r"best score (\S+)", header),
        "sidebar_best": _number(r"best score (\S+)", detail),
        "widget_trials": _number(r"(\d+) trials?", header),
        "sidebar_trials": sidebar_trials or None,
        "texts": {
            "widget_best": re.search(r"best score (\S+)", header),
            "sidebar_best": re.search(r"best score (\S+)", detail or ""),
            "result_best": re.search(r"best score=(\S+)", output),
            "widget_time": re.search(r"run time ([\d.]+ s)", header),
            "sidebar_time": took,
            "result_time": re.search(r"trials in ([\d.]+ s)", output),
        },
        "ended": "<TuneResult" in output,
    }


def read_training(raw: list[Any]) -> dict[str, Any]:
    """A training's figures from each view: reports (header, table's epoch, curve's points), the last loss
    (table, sidebar)."""
    header, table, points, detail, took, output = raw
    rows = _table_rows(table)
    head = table.strip().splitlines()[0].split("\t") if table.strip() else []
    loss = rows[0][head.index("loss")] if rows and "loss" in head else None
    return {
        "header_reports": _number(r"report (\d+)", header),
        "curve_reports": points,
        "table_reports": float(rows[0][head.index("report")]) if rows and "report" in head else None,
        "table_loss": float(loss) if loss else None,
        "sidebar_loss": _number(r"last loss (\S+)", detail),
        "texts": {
            "widget_loss": loss,
            "sidebar_loss": re.search(r"last loss (\S+)", detail or ""),
            "result_loss": re.search(r"loss=(\S+?)>", output),
            "widget_time": re.search(r"run time ([\d.]+ s)", header),
            "sidebar_time": took,
            "result_time": re.search(r"done in ([\d.]+ s)", output),
        },
        "ended": "<TrainResult" in output,
    }


def _text(value: Any) -> str | None:
    return value.group(1) if isinstance(value, re.Match) else value


@pytest.mark.timeout(600)
def test_the_views_of_a_sweep_and_a_training_agree_at_every_instant(lab: Lab) -> None:
    """A ``jc.tune`` sweep and a ``jc.train_torch`` run, the dashboard and sidebar open: the widget's table and its
    curves, its header and the sidebar's row show the same results within one refresh, and a refresh after the end
    every view says what the cell's result says (best score or last loss, run time)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("one-truth-run*"):
        stale.unlink()
    write_notebook(lab.root / RUNS_NOTEBOOK, RUNS_CELLS)
    console: list[str] = []
    kept: dict[str, list[dict[str, Any]]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page: Any = None
        try:
            page = open_notebook(browser, lab, RUNS_NOTEBOOK, console, {"width": 1500, "height": 1300})
            page.locator('.jp-SideBar [data-id="jupyter-cluster-sidebar"]').click(timeout=20_000)
            for index in (0, 1):
                assert page.evaluate(RUN_CELL_JS, [index, True]) is True, f"cell {index} failed"
            page.locator(".jupyter-cluster-dashboard canvas").first.wait_for(timeout=60_000)
            for index, kind, read, pairs in (
                (
                    2,
                    "tune",
                    read_sweep,
                    [
                        ("table_results", "curve_results"),
                        ("widget_best", "sidebar_best"),
                        ("widget_trials", "sidebar_trials"),
                    ],
                ),
                (
                    3,
                    "train",
                    read_training,
                    [("header_reports", "curve_reports", "table_reports"), ("table_loss", "sidebar_loss")],
                ),
            ):
                readings = kept[kind] = []
                page.evaluate(RUN_CELL_JS, [index, False])
                started = time.monotonic()
                ended: float | None = None
                shot = 0.0
                while time.monotonic() - started < 240:
                    reading = read(page.evaluate(READ_RUN_JS, [index, SIDEBAR, kind]))
                    now = reading["t"] = round(time.monotonic() - started, 3)
                    readings.append(reading)
                    if now - shot >= 2.0:
                        page.screenshot(path=str(ARTIFACTS / f"one-truth-run-{kind}-{int(now):03d}.png"))
                        shot = now
                    if ended is None and reading["ended"]:
                        ended = now
                    if ended is not None and now - ended > 3 * REFRESH:
                        break
                    time.sleep(0.25)
                assert ended is not None, f"the {kind} run never ended: {readings[-1]}"
                during = [r for r in readings if r["t"] <= ended]
                for views in pairs:
                    assert any(r[views[0]] not in (None, 0) for r in during), f"no reading of {views[0]} while it ran"
                    problems = disagreements(during, views, REFRESH)
                    assert not problems, f"{kind}: " + "\n".join(problems[:20])
                # A refresh after the end, every view says what the result says.
                after = [r for r in readings if r["t"] > ended + REFRESH]
                assert after, readings[-3:]
                for r in after:
                    texts = {name: _text(value) for name, value in r["texts"].items()}
                    figures = {name.split("_")[1] for name in texts}
                    for figure in figures:
                        said = {name: value for name, value in texts.items() if name.endswith("_" + figure)}
                        assert len(set(said.values())) == 1 and None not in said.values(), f"{kind}: {said}"
                    for views in pairs[:1]:
                        assert len({r[v] for v in views}) == 1, f"{kind}: {[(v, r[v]) for v in views]}"
                page.screenshot(path=str(ARTIFACTS / f"one-truth-run-{kind}-end.png"))
            assert not console_problems(console), "\n".join(console[-40:])
        except (AssertionError, PlaywrightError) as exc:
            screenshot_failed(page, "one-truth-run-failed.png")
            raise AssertionError(f"{exc}\n" + "\n".join(console[-30:])) from exc
        finally:
            (ARTIFACTS / "one-truth-runs.json").write_text(json.dumps(kept, indent=1, default=_text))
            browser.close()
