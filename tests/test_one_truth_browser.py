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

from .lab import ARTIFACTS, CHROMIUM, Lab, console_problems, lab_server, open_notebook, screenshot_failed

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
    """Where a view showed, at some instant, a count outside what another view showed within ``refresh`` seconds
    of it: further behind, or ahead, than one refresh. (A view that redraws once a second skips counts the bar
    shows between its redraws: 6, then 12. A count between two the other showed is no disagreement.)"""
    found = []
    for reading in readings:
        for view in views:
            value = reading[view]
            if value is None:
                continue
            for other in views:
                if other == view:
                    continue
                near = [r[other] for r in readings if abs(r["t"] - reading["t"]) <= refresh and r[other] is not None]
                if near and not min(near) <= value <= max(near):
                    found.append(f"at {reading['t']:.2f} s the {view} said {value}; the {other} said {sorted(near)}")
    return found


def test_the_disagreement_check_can_fail() -> None:
    readings = [{"t": t / 4, "bar": t, "sidebar": t, "dashboard": t - t % 4} for t in range(13)]
    assert not disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)  # the dashboard redraws each second
    readings[8]["dashboard"] = 1  # an old figure, seven readings behind
    assert disagreements(readings, ("bar", "sidebar", "dashboard"), 1.0)


@pytest.mark.timeout(420)
def test_the_views_of_a_map_cell_agree_at_every_instant(lab: Lab) -> None:
    import nbformat
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ARTIFACTS.glob("one-truth*"):
        stale.unlink()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, lab.root / NOTEBOOK)
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
