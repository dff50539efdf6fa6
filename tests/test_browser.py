"""The widgets in a real browser: JupyterLab served on loopback, driven by headless Chromium.

A JupyterLab server runs in a subprocess (a random token, its own root, runtime,
workspaces and user-settings folders; the installed labextensions for ipywidgets and
jupyter_bokeh as they are). A notebook written into its root starts the embedded
cluster, shows ``jc.dashboard()``, runs a ``%%remote --map`` cell over 200 items and
then sleeps a few seconds so the dashboard gets samples. Playwright opens it in
Debian's Chromium, waits for the kernel to be idle, runs all cells, and checks:

* the ``--map`` cell's progress bar ends as ``div.jc-progress.jc-done`` reading ``200/200``;
* the dashboard's header widget says ``1 node(s)`` and when it was last updated;
* BokehJS holds the dashboard's data (a ``CPU`` bar for the node, several points in time)
  and its canvases are drawn: the screenshot of the dashboard has the RAM bar's colour,
  the CPU colour and a fair share of non-white pixels in many colours.

Screenshots of the page and of the dashboard, the browser console and the server log
are kept in ``tests/artifacts/browser/``. The test is skipped only where Chromium or
the playwright module is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .lab import (
    ARTIFACTS,
    CHROMIUM,
    LAST_CELL_RAN_JS,
    Lab,
    console_problems,
    execute,
    lab_server,
    open_notebook,
    screenshot_failed,
    write_notebook,
)

NOTEBOOK = "dashboard.ipynb"
ITEMS = 200

CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 2",
    "import jupyter_cluster as jc\ndash = jc.dashboard()\ndash",
    f"%%remote --map i in range({ITEMS})\nimport time\ntime.sleep(0.02)\ny = i * i",
    "import time\ntime.sleep(4)",
]

#: Colours the dashboard draws with (jupyter_cluster.widgets._dashboard.COLORS).
RAM_GREEN = (0x54, 0xA2, 0x4B)
CPU_BLUE = (0x4C, 0x78, 0xA8)

#: What BokehJS holds for the dashboard: the columns of its sources, found through the views in the page.
BOKEH_DATA_JS = """
() => {
  const Bokeh = window.Bokeh;
  if (!Bokeh || !Bokeh.index) return {error: "no Bokeh.index in the page"};
  const found = {views: 0};
  const docs = new Set();
  for (const view of Bokeh.index) {
    found.views += 1;
    const doc = view.model && view.model.document;
    if (!doc || docs.has(doc)) continue;
    docs.add(doc);
    for (const model of doc._all_models.values()) {
      const data = model.data;
      if (!data || typeof data !== "object") continue;
      if ("frac" in data) found.bars = {y: Array.from(data.y), text: Array.from(data.text)};
      if ("cpu" in data) found.series = {t: Array.from(data.t), cpu: Array.from(data.cpu)};
    }
  }
  return found;
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_server(tmp_path_factory) as server:
        yield server


def _write_notebook(path: Path) -> None:

    write_notebook(path, CELLS)


def _drawn(path: Path) -> dict[str, int]:
    """What a screenshot holds: its size, non-white pixels, distinct colours, pixels of the dashboard's colours."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)

    def near(colour: tuple[int, int, int], tolerance: int = 12) -> int:
        return int((np.abs(pixels - np.array(colour)).max(axis=-1) <= tolerance).sum())

    return {
        "width": pixels.shape[1],
        "height": pixels.shape[0],
        "non_white": int((pixels.min(axis=-1) < 235).sum()),
        "colours": len(np.unique(pixels.reshape(-1, 3), axis=0)),
        "ram_green": near(RAM_GREEN),
        "cpu_blue": near(CPU_BLUE),
    }


@pytest.mark.timeout(300)
def test_dashboard_and_progress_in_jupyterlab(lab: Lab) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ("page.png", "dashboard.png", "page-failed.png", "console.log"):
        (ARTIFACTS / stale).unlink(missing_ok=True)
    _write_notebook(lab.root / NOTEBOOK)
    console: list[str] = []

    def report() -> str:
        (ARTIFACTS / "console.log").write_text("\n".join(console) + "\n")
        return "browser console (also in tests/artifacts/browser/console.log):\n" + "\n".join(console[-40:])

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page: Any = None
        try:
            page = open_notebook(browser, lab, NOTEBOOK, console, {"width": 1400, "height": 1400})
            started = time.monotonic()
            # Its promise settles once every cell has run: False when one failed (the rest are then skipped).
            if execute(page, "notebook:run-all-cells", timeout=180) is not True:
                errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                raise AssertionError("a cell failed:\n" + "\n".join(errors.all_inner_texts())[-3000:])

            done = page.locator(".jc-progress.jc-done")
            done.wait_for(timeout=10_000)
            summary = done.inner_text()
            assert f"{ITEMS}/{ITEMS} items done" in summary and "--map" in summary, summary
            # The last cell (a few seconds of samples) is over once its prompt has a number.
            page.wait_for_function(LAST_CELL_RAN_JS, arg=len(CELLS), timeout=10_000)
            elapsed = time.monotonic() - started

            dashboard = page.locator(".jupyter-cluster-dashboard")
            header = dashboard.locator(".widget-html").first.inner_text(timeout=10_000)
            assert "embedded local" in header and "1 node(s)" in header and "updated" in header, header
            assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()
            assert dashboard.locator("canvas").count() >= 3  # Playwright's CSS locators pierce Bokeh's shadow roots

            # BokehJS has the node's bars (a "CPU" row) and several points in time.
            page.wait_for_function(
                f"() => {{ const d = ({BOKEH_DATA_JS})(); return d.bars && d.series &&"
                " d.bars.y.some((y) => y[1] === 'CPU') && d.series.t.length >= 3; }",
                timeout=30_000,
            )
            data = page.evaluate(BOKEH_DATA_JS)

            page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
            dashboard.screenshot(path=str(ARTIFACTS / "dashboard.png"))
            drawn = _drawn(ARTIFACTS / "dashboard.png")
            print(
                f"\nall cells ran in {elapsed:.1f} s\nprogress: {summary}\nheader: {header}\n"
                f"bokeh: {len(data['bars']['y'])} node bars {data['bars']['text']}, {len(data['series']['t'])} points"
                f"\ndashboard.png: {drawn}"
            )
            area = drawn["width"] * drawn["height"]
            assert drawn["non_white"] > 0.02 * area, drawn
            assert drawn["colours"] >= 20, drawn
            assert drawn["ram_green"] >= 50, drawn  # the RAM bar: only the node plot draws in that green
            assert drawn["cpu_blue"] >= 50, drawn  # the CPU bar, line and legend entry
            assert not console_problems(console), report()
        except (AssertionError, PlaywrightError) as exc:
            screenshot_failed(page, "page-failed.png")
            raise AssertionError(f"{exc}\n{report()}") from exc
        finally:
            report()
            browser.close()


RUNS_NOTEBOOK = "runs.ipynb"
RUNS_CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc",
    # A sweep: three trials, the third raises at its third iteration.
    "def trainable(config):\n"
    "    from ray import tune\n"
    "    for i in range(1, 6):\n"
    "        if config['lr'] > 0.5 and i == 3:\n"
    "            raise ValueError('diverged')\n"
    "        tune.report({'score': config['lr'] * i})\n"
    "sweep = jc.tune(trainable, {'lr': jc.grid_search([0.1, 0.3, 0.9])}, metric='score', mode='max')",
    # A training run: two workers whose losses differ.
    "def train_func(config):\n"
    "    import ray.train\n"
    "    rank = ray.train.get_context().get_world_rank()\n"
    "    for epoch in range(1, 5):\n"
    "        ray.train.report({'epoch': epoch, 'loss': 1.0 / epoch + 0.2 * rank, 'accuracy': 0.2 * epoch})\n"
    "result = jc.train_torch(train_func, num_workers=2)",
]


def _polylines(cell: Any) -> int:
    """The lines of the SVG pictures in ``cell``'s output (JupyterLab shows an SVG as an image of a data URI)."""
    return int(
        cell.evaluate(
            """(node) => {
              let count = 0;
              for (const img of node.querySelectorAll('img[src^="data:image/svg+xml"]')) {
                const [meta, data] = img.src.split(",", 2);
                const svg = meta.endsWith(";base64") ? atob(data) : decodeURIComponent(data);
                count += new DOMParser().parseFromString(svg, "image/svg+xml").querySelectorAll("polyline").length;
              }
              return count;
            }"""
        )
    )


@pytest.mark.slow
def test_training_and_trial_widgets_in_jupyterlab(lab: Lab) -> None:
    """The trials and training views in JupyterLab once the runs ended: their headers, tables and curves."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ("runs.png", "trials.png", "training.png", "runs-failed.png"):
        (ARTIFACTS / stale).unlink(missing_ok=True)
    write_notebook(lab.root / RUNS_NOTEBOOK, RUNS_CELLS)
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page: Any = None
        try:
            page = open_notebook(browser, lab, RUNS_NOTEBOOK, console, {"width": 1400, "height": 1600})
            if execute(page, "notebook:run-all-cells", timeout=240) is not True:
                errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                raise AssertionError("a cell failed:\n" + "\n".join(errors.all_inner_texts())[-3000:])
            page.wait_for_function(LAST_CELL_RAN_JS, arg=len(RUNS_CELLS), timeout=10_000)
            assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()

            # Each run ended: its widget gave way to a snapshot of its header and table, its curves to a picture.
            trials, training = page.locator(".jp-Cell").nth(1), page.locator(".jp-Cell").nth(2)
            header = trials.locator(".jc-run-snapshot").inner_text(timeout=10_000)
            assert "jc.tune(trainable)" in header and "done" in header and "3 trials" in header, header
            table = trials.locator(".jc-trials-table").inner_text()
            assert "error" in table.lower() and "ValueError: diverged" in table, table
            assert table.count("terminated") == 2, table
            assert _polylines(trials) == 3  # a curve each
            assert trials.locator(".jupyter-cluster-run").count() == 0
            header = training.locator(".jc-run-snapshot").inner_text(timeout=10_000)
            assert "jc.train_torch(train_func)" in header and "done" in header and "report 4" in header, header
            table = training.locator(".jc-train-table").inner_text()
            assert "rank 0" in table and "rank 1" in table, table  # the workers' losses differ
            assert _polylines(training) >= 3  # loss per worker, accuracy
            page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)
            trials.screenshot(path=str(ARTIFACTS / "trials.png"))
            training.screenshot(path=str(ARTIFACTS / "training.png"))
            for name in ("trials.png", "training.png"):
                drawn = _drawn(ARTIFACTS / name)
                print(f"\n{name}: {drawn}")
                assert drawn["non_white"] > 0.02 * drawn["width"] * drawn["height"], drawn
                assert drawn["cpu_blue"] >= 50, drawn  # the first line's colour (the palette starts with it)
            assert not console_problems(console), "\n".join(console[-40:])
        except (AssertionError, PlaywrightError, ValueError) as exc:
            screenshot_failed(page, "runs-failed.png")
            raise AssertionError(f"{exc}\n" + "\n".join(console[-40:])) from exc
        finally:
            browser.close()
