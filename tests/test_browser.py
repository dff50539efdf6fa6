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

#: What BokehJS holds for the dashboard: its sources' columns, found through the views on the page.
BOKEH_DATA_JS = """
() => {
  const Bokeh = window.Bokeh;
  if (!Bokeh || !Bokeh.index) return {error: "no Bokeh.index in the page"};
  const found = {};
  const seen = new Set();
  const visit = (model) => {
    if (!model || typeof model !== "object" || seen.has(model)) return;
    seen.add(model);
    if (model.data && model.data instanceof Object && "frac" in model.data) {
      found.bars = {y: Array.from(model.data.y).map(String), text: Array.from(model.data.text)};
    } else if (model.data && model.data instanceof Object && "cpu" in model.data) {
      found.series = {t: Array.from(model.data.t), cpu: Array.from(model.data.cpu)};
    }
  };
  const views = [];
  const index = Bokeh.index;
  if (typeof index[Symbol.iterator] === "function") {
    for (const view of index) views.push(view);
  } else {
    for (const key of Object.keys(index)) views.push(index[key]);
  }
  for (const view of views) {
    const doc = view.model && view.model.document;
    if (doc && doc._all_models) {
      for (const model of doc._all_models.values()) visit(model);
    }
  }
  found.views = views.length;
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
    request = urllib.request.Request(
        f"{lab.url}{path}", method=method, headers={"Authorization": f"token {lab.token}"}
    )
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
    """JupyterLab on loopback with a random token; killed at the end whatever happened."""
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


def _colour_share(pixels: Any, colour: tuple[int, int, int], tolerance: int = 12) -> int:
    import numpy as np

    return int((np.abs(pixels.astype(int) - np.array(colour)).max(axis=-1) <= tolerance).sum())


@pytest.mark.timeout(300)
def test_dashboard_and_progress_in_jupyterlab(lab: Lab) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python module is not installed")
    import numpy as np
    from PIL import Image

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _write_notebook(lab.root / NOTEBOOK)
    console: list[str] = []

    def report() -> str:
        (ARTIFACTS / "console.log").write_text("\n".join(console) + "\n")
        return "browser console:\n" + "\n".join(console[-40:])

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
            page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}", timeout=60_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            # Cells sent before the kernel is idle are dropped: wait for it.
            page.wait_for_function(
                """(path) => {
                  const app = window.jupyterapp;
                  const panel = app && app.shell.currentWidget;
                  if (!panel || !panel.context || panel.context.path !== path || !panel.context.isReady) return false;
                  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
                  return !!kernel && kernel.status === "idle";
                }""",
                arg=NOTEBOOK,
                timeout=60_000,
            )
            started = time.monotonic()
            _execute(page, "notebook:run-all-cells")

            done = page.locator(".jc-progress.jc-done")
            try:
                done.wait_for(timeout=150_000)
            except Exception as exc:
                page.screenshot(path=str(ARTIFACTS / "page-failed.png"), full_page=True)
                raise AssertionError(f"the --map cell's bar did not end: {exc}\n{report()}") from exc
            summary = done.inner_text()
            assert f"{ITEMS}/{ITEMS}" in summary, summary
            assert "--map" in summary and "done in" in summary, summary

            # The last cell has had its few seconds of samples once its prompt shows a number.
            page.wait_for_function(
                """() => {
                  const prompts = document.querySelectorAll(".jp-Notebook .jp-Cell .jp-InputPrompt");
                  return prompts.length === 4 && /\\[\\d+\\]/.test(prompts[3].textContent);
                }""",
                timeout=60_000,
            )
            elapsed = time.monotonic() - started

            dashboard = page.locator(".jupyter-cluster-dashboard")
            dashboard.wait_for(timeout=10_000)
            header = dashboard.locator(".widget-html").first.inner_text()
            assert "1 node(s)" in header and "updated" in header, header
            assert "Error displaying widget" not in page.locator(".jp-Notebook").inner_text(), report()

            canvases = dashboard.locator("canvas")
            assert canvases.count() >= 3, f"{canvases.count()} canvases in the dashboard\n{report()}"

            page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
            dashboard.screenshot(path=str(ARTIFACTS / "dashboard.png"))
            data = page.evaluate(BOKEH_DATA_JS)
            print(data)
            print(page.evaluate("""() => {
              const out = [];
              for (const view of window.Bokeh.index) {
                for (const m of view.model.document._all_models.values()) {
                  if (m.type === "FactorRange" || (m.data && "frac" in m.data)) {
                    const d = m.data ? m.data.y : m.factors;
                    out.push([m.type, m.id, typeof d, d && d.constructor && d.constructor.name, String(d), JSON.stringify(d), d && d.length]);
                  }
                }
              }
              return out;
            }"""))
            assert "bars" in data and "series" in data, f"BokehJS data: {data}\n{report()}"
            assert any(y.endswith(",CPU") for y in data["bars"]["y"]), data["bars"]
            assert len(data["series"]["t"]) >= 3, data["series"]

            page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
            dashboard.screenshot(path=str(ARTIFACTS / "dashboard.png"))
            pixels = np.asarray(Image.open(ARTIFACTS / "dashboard.png").convert("RGB"))
            non_white = int((pixels.min(axis=-1) < 235).sum())
            colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
            ram, cpu = _colour_share(pixels, RAM_GREEN), _colour_share(pixels, CPU_BLUE)
            drawn = f"{non_white} non-white pixels of {pixels.shape[0] * pixels.shape[1]}, {colours} colours"
            drawn += f", RAM green {ram}, CPU blue {cpu}"
            print(f"\nall cells ran in {elapsed:.1f} s; {summary}; header: {header}; dashboard: {drawn}")
            assert non_white > 0.02 * pixels.shape[0] * pixels.shape[1], drawn
            assert colours >= 20, drawn
            assert ram >= 50, drawn  # the RAM bar: drawn only by the node plot
            assert cpu >= 20, drawn  # the CPU line (and its legend entry)
            errors = [line for line in console if line.startswith(("[error]", "[pageerror]"))]
            report()
            assert not [e for e in errors if "bokeh" in e.lower() or "widget" in e.lower()], report()
        finally:
            browser.close()
