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

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "browser"
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

#: True once the notebook at this path is open and its kernel idle.
KERNEL_IDLE_JS = """
(path) => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.context || panel.context.path !== path || !panel.context.isReady) return false;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.status === "idle";
}
"""

#: True once all ``count`` cells show an execution count.
LAST_CELL_RAN_JS = """
(count) => {
  const prompts = document.querySelectorAll(".jp-Notebook .jp-Cell .jp-InputPrompt");
  return prompts.length === count && Array.from(prompts).every((p) => /\\[\\d+\\]/.test(p.textContent));
}
"""

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


@dataclass
class Lab:
    """A JupyterLab server for one test module."""

    url: str
    token: str
    root: Path
    log: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api(lab: Lab, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"{lab.url}{path}", method=method, headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def _wait_answering(lab: Lab, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({process.returncode}):\n{lab.log.read_text()[-3000:]}")
        try:
            _api(lab, "/api/status")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer in {timeout:.0f} s:\n{lab.log.read_text()[-3000:]}")


def _stop(lab: Lab, process: subprocess.Popen[bytes]) -> None:
    """Shut the kernels down (their embedded clusters with them), then the server."""
    if process.poll() is None:
        try:
            for kernel in _api(lab, "/api/kernels"):
                _api(lab, f"/api/kernels/{kernel['id']}", method="DELETE")
        except (OSError, ValueError):
            pass
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _write_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on loopback with a random token; stopped at the end whatever happened."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package)")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python module is not installed")
    base = tmp_path_factory.mktemp("lab")
    root, runtime, workspaces, settings = (base / name for name in ("root", "runtime", "workspaces", "settings"))
    for folder in (root, runtime, workspaces, settings):
        folder.mkdir()
    # No "news" prompt over the notebook, no update check.
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    token = secrets.token_hex(16)
    port = _free_port()
    # JUPYTER_DATA_DIR only moves the user's folder: the labextensions and the python3
    # kernel under sys.prefix/share/jupyter are still found.
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_DATA_DIR": str(base / "data")}
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.workspaces_dir={workspaces}",
        f"--LabApp.user_settings_dir={settings}",
        "--LabApp.expose_app_in_browser=True",
    ]
    lab = Lab(url=f"http://127.0.0.1:{port}", token=token, root=root, log=base / "lab.log")
    with open(lab.log, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    try:
        _wait_answering(lab, process, timeout=60)
        yield lab
    finally:
        _stop(lab, process)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "lab.log").write_bytes(lab.log.read_bytes())


def _execute(page: Any, command: str, timeout: float = 30.0) -> Any:
    """Run a JupyterLab command in the page, with a timeout of our own (the promise has none)."""
    return page.evaluate(
        """([command, ms]) => Promise.race([
          window.jupyterapp.commands.execute(command),
          new Promise((_, reject) => setTimeout(() => reject(new Error(command + ": no answer in " + ms + " ms")), ms)),
        ])""",
        [command, int(timeout * 1000)],
    )


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


def _console_problems(console: list[str]) -> list[str]:
    """Page errors, and what BokehJS says when a view patches rows it never got."""
    return [line for line in console if line.startswith("[pageerror]") or "inconsistent lengths" in line]


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
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
        try:
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}", timeout=60_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            # Cells sent before the kernel is idle are dropped: wait for it.
            page.wait_for_function(KERNEL_IDLE_JS, arg=NOTEBOOK, timeout=60_000)
            started = time.monotonic()
            # Its promise settles once every cell has run: False when one failed (the rest are then skipped).
            if _execute(page, "notebook:run-all-cells", timeout=180) is not True:
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
            assert not _console_problems(console), report()
        except (AssertionError, PlaywrightError) as exc:
            try:
                page.screenshot(path=str(ARTIFACTS / "page-failed.png"), full_page=True)
            except PlaywrightError:
                pass
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


def test_training_and_trial_widgets_in_jupyterlab(lab: Lab) -> None:
    """The trials and training widgets drawn in JupyterLab: their tables, headers and Bokeh canvases."""
    import nbformat
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ("runs.png", "trials.png", "training.png", "runs-failed.png"):
        (ARTIFACTS / stale).unlink(missing_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in RUNS_CELLS]
    nbformat.write(nb, lab.root / RUNS_NOTEBOOK)
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
        try:
            page.goto(f"{lab.url}/lab/tree/{RUNS_NOTEBOOK}?reset&token={lab.token}", timeout=60_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE_JS, arg=RUNS_NOTEBOOK, timeout=60_000)
            if _execute(page, "notebook:run-all-cells", timeout=240) is not True:
                errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
                raise AssertionError("a cell failed:\n" + "\n".join(errors.all_inner_texts())[-3000:])
            page.wait_for_function(LAST_CELL_RAN_JS, arg=len(RUNS_CELLS), timeout=10_000)
            assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text()

            trials, training = page.locator(".jupyter-cluster-run").all()
            header = trials.locator(".widget-html").first.inner_text(timeout=10_000)
            assert "jc.tune(trainable)" in header and "done" in header and "3 trials" in header, header
            table = trials.locator(".jc-trials-table").inner_text()
            assert "error" in table.lower() and "ValueError: diverged" in table, table
            assert table.count("terminated") == 2, table
            assert trials.locator("canvas").count() >= 1
            header = training.locator(".widget-html").first.inner_text(timeout=10_000)
            assert "jc.train_torch(train_func)" in header and "done" in header and "report 4" in header, header
            table = training.locator(".jc-train-table").inner_text()
            assert "rank 0" in table and "rank 1" in table, table  # the workers' losses differ
            assert training.locator("canvas").count() >= 2  # loss and accuracy

            page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)
            trials.screenshot(path=str(ARTIFACTS / "trials.png"))
            training.screenshot(path=str(ARTIFACTS / "training.png"))
            for name in ("trials.png", "training.png"):
                drawn = _drawn(ARTIFACTS / name)
                print(f"\n{name}: {drawn}")
                assert drawn["non_white"] > 0.02 * drawn["width"] * drawn["height"], drawn
                assert drawn["cpu_blue"] >= 50, drawn  # the first line's colour (the palette starts with it)
            assert not _console_problems(console), "\n".join(console[-40:])
        except (AssertionError, PlaywrightError, ValueError) as exc:
            try:
                page.screenshot(path=str(ARTIFACTS / "runs-failed.png"), full_page=True)
            except PlaywrightError:
                pass
            raise AssertionError(f"{exc}\n" + "\n".join(console[-40:])) from exc
        finally:
            browser.close()
