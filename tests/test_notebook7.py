"""Notebook 7 (the ``notebook`` package), in a real browser: the guide's support matrix says what this shows.

A Notebook 7 server runs on loopback (a random token, its own root, runtime, workspaces and
user-settings folders), and Playwright drives Debian's Chromium through one notebook: the
extension loads, ``%cluster local --cpus 1`` attaches an embedded cluster, a ``%%remote`` cell
prints on the cluster and returns its last expression, a ``--map`` cell's progress bar ends
done, and ``%cluster dashboard`` draws. The sidebar is there but hidden, as every left panel is
in Notebook 7; View > Left Sidebar > "Show Ray cluster" (the command run here) shows it, with the
link and the node. A screenshot goes to ``tests/artifacts/browser/notebook7.png``.

In the slow tier, and skipped where ``notebook`` is not installed (the ``test`` extra installs it).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .lab import ARTIFACTS, CHROMIUM, KERNEL_IDLE_JS, Lab, execute, free_port, stop, wait_answering, write_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

#: A notebook as a user of Notebook 7 would write it (its picture is the guide's): attach, a cell on the cluster, a
#: map, its result here, the dashboard.
NOTEBOOK = "ray-in-notebook-7.ipynb"
CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 1",
    "%%remote\nanswer = 6 * 7\nprint('printed on the cluster')\nanswer",
    "%%remote --map i in range(20)\nimport time\ntime.sleep(0.05)\nsquare = i * i",
    "sum(square)",
    "%cluster dashboard",
]

#: The text of each cell's output area.
OUTPUTS_JS = "() => Array.from(document.querySelectorAll('.jp-Cell .jp-OutputArea')).map((n) => n.innerText)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    pytest.importorskip("notebook", reason="Notebook 7 is not installed (pip install notebook)")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python module is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package)")
    base = tmp_path_factory.mktemp("notebook7")
    root, runtime, workspaces, settings = (base / name for name in ("root", "runtime", "workspaces", "settings"))
    for folder in (root, runtime, workspaces, settings):
        folder.mkdir()
    token = secrets.token_hex(16)
    port = free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_DATA_DIR": str(base / "data")}
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "notebook",
        "--no-browser",
        "--allow-root",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--JupyterNotebookApp.workspaces_dir={workspaces}",
        f"--JupyterNotebookApp.user_settings_dir={settings}",
        "--JupyterNotebookApp.expose_app_in_browser=True",
    ]
    lab = Lab(url=f"http://127.0.0.1:{port}", token=token, root=root, log=base / "notebook7.log")
    with open(lab.log, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    try:
        wait_answering(lab, process, timeout=60)
        yield lab
    finally:
        stop(lab, process)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "notebook7.log").write_bytes(lab.log.read_bytes())


def _write_notebook(path: Path) -> None:

    write_notebook(path, CELLS)


def _ours(error: str) -> bool:
    """A page error of this project's code: Notebook 7.6.5 raises one of its own on every page load (its
    shortcuts settings read a plugin's missing schema), with or without this extension."""
    return "notebook_core" not in error


def test_cells_widgets_and_sidebar_in_notebook_7(server: Lab) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for stale in ("notebook7.png", "notebook7-failed.png"):
        (ARTIFACTS / stale).unlink(missing_ok=True)
    _write_notebook(server.root / NOTEBOOK)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
        try:
            page.goto(f"{server.url}/notebooks/{NOTEBOOK}?token={server.token}", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE_JS, arg=NOTEBOOK, timeout=90_000)
            started = time.monotonic()
            assert execute(page, "notebook:run-all-cells", timeout=240) is True, page.evaluate(OUTPUTS_JS)
            elapsed = time.monotonic() - started

            outputs = page.evaluate(OUTPUTS_JS)
            assert "Attached to <Cluster embedded local" in outputs[0], outputs
            assert "printed on the cluster" in outputs[1] and "42" in outputs[1], outputs
            done = page.locator(".jc-progress.jc-done")
            done.wait_for(timeout=10_000)
            assert "20/20 items done" in done.inner_text()
            assert "2470" in outputs[3], outputs
            dashboard = page.locator(".jupyter-cluster-dashboard")
            header = dashboard.locator(".widget-html").first.inner_text(timeout=10_000)
            assert "embedded local" in header and "1 node(s)" in header, header
            assert dashboard.locator("canvas").count() >= 3
            # A few samples drawn (the page waits, not a cell of the notebook).
            page.wait_for_function(
                "() => { const h = document.querySelector('.jupyter-cluster-dashboard .widget-html');"
                " return h && h.innerText.includes('updated'); }",
                timeout=30_000,
            )
            time.sleep(3)

            # Notebook 7 keeps its left area hidden: the panel is there, shown from View > Left Sidebar.
            sidebar = page.locator("#jupyter-cluster-sidebar")
            assert sidebar.count() == 1 and not sidebar.is_visible()
            shown = page.evaluate(
                "() => window.jupyterapp.commands.execute('application:toggle-panel',"
                " {side: 'left', id: 'jupyter-cluster-sidebar', title: 'Ray cluster'})"
                ".then(() => true, (e) => String(e))"
            )
            assert shown is True, shown
            sidebar.locator(".jc-node").first.wait_for(timeout=30_000)
            link = sidebar.locator(".jc-section-link").inner_text()
            assert "connected" in link and "embedded local" in link, link
            time.sleep(1)  # the node's bars drawn once more
            page.screenshot(path=str(ARTIFACTS / "notebook7.png"), full_page=True)
            print(f"\nNotebook 7: all cells ran in {elapsed:.1f} s; {done.inner_text()}; {header}")
            assert not [e for e in errors if _ours(e)], errors
        except (AssertionError, PlaywrightError) as exc:
            try:
                page.screenshot(path=str(ARTIFACTS / "notebook7-failed.png"), full_page=True)
            except PlaywrightError:
                pass
            raise AssertionError(f"{exc}\npage errors: {errors}") from exc
        finally:
            browser.close()
