"""The sidebar in a real browser: JupyterLab on loopback, headless Chromium, a real cluster.

One notebook starts the embedded cluster, makes an actor and runs an ``--async`` cell
that sleeps. With the sidebar open, the test checks what a user would: the panel shows
the link and the node's bars, and the running cell; its cancel button cancels the cell
(the cell's own output says so) and the next cell runs on the cluster; the actor's kill
button kills it; "Dashboard" opens the live dashboard in a main-area tab, and so does
the button in the cluster's repr; a second notebook with no cluster shows how to start,
and its button inserts those lines as a cell; back on the first notebook the cluster
shows again; after a kernel restart the panel shows how to start, then the cluster once
the notebook attaches again. Screenshots go to ``tests/artifacts/browser/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .lab import (
    ARTIFACTS,
    CHROMIUM,
    KERNEL_IDLE_JS,
    Lab,
    console_problems,
    lab_server,
    screenshot_failed,
    write_notebook,
)

FIRST = "cluster.ipynb"
SECOND = "empty.ipynb"
CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 2\nimport jupyter_cluster as jc",
    "%%remote --actor panel_actor\nvalue = 1",
    "%%remote --async\nimport time\ntime.sleep(300)\nnever = True",
    "%%remote\nafter = 6 * 7\nprint('after:', after)",
    "jc.current()",
]
SIDEBAR = "#jupyter-cluster-sidebar"

#: Run cell ``index`` of the current notebook; resolves once it has run (True) or failed.
RUN_CELL_JS = """
async ([index, ms]) => {
  const panel = window.jupyterapp.shell.currentWidget;
  panel.content.activeCellIndex = index;
  return await Promise.race([
    window.jupyterapp.commands.execute("notebook:run-cell"),
    new Promise((_, reject) => setTimeout(() => reject(new Error("cell " + index + ": no answer")), ms)),
  ]);
}
"""

#: The text of cell ``index``'s output area.
OUTPUT_JS = """
(index) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cell = panel.content.widgets[index];
  return cell && cell.outputArea ? cell.outputArea.node.innerText : "";
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_server(tmp_path_factory, "lab-sidebar.log") as server:
        yield server


def _notebook(path: Any, cells: list[str]) -> None:

    write_notebook(path, cells)


def _open(page: Any, path: str) -> None:
    page.evaluate("(path) => window.jupyterapp.commands.execute('docmanager:open', {path})", path)
    page.wait_for_function(KERNEL_IDLE_JS, arg=path, timeout=60_000)


def _run(page: Any, index: int, timeout: float = 180) -> None:
    if page.evaluate(RUN_CELL_JS, [index, int(timeout * 1000)]) is not True:
        raise AssertionError(f"cell {index} failed:\n" + page.evaluate(OUTPUT_JS, index)[-3000:])


@pytest.mark.timeout(420)
def test_sidebar_follows_the_notebook_and_acts_on_cells(lab: Lab) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shots = ("sidebar.png", "sidebar-start.png", "sidebar-dashboard.png", "sidebar-failed.png")
    for stale in shots:
        (ARTIFACTS / stale).unlink(missing_ok=True)
    _notebook(lab.root / FIRST, CELLS)
    _notebook(lab.root / SECOND, ["print('no cluster here')"])
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
        try:
            page.goto(f"{lab.url}/lab/tree/{FIRST}?reset&token={lab.token}", timeout=60_000)
            page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
            page.wait_for_function(KERNEL_IDLE_JS, arg=FIRST, timeout=60_000)
            # The sidebar's tab is there (the extension is installed), and shows how to start.
            page.locator('.jp-SideBar [data-id="jupyter-cluster-sidebar"]').click(timeout=20_000)
            sidebar = page.locator(SIDEBAR)
            sidebar.locator(".jc-start-insert").wait_for(timeout=20_000)
            assert "%load_ext jupyter_cluster" in sidebar.inner_text()

            # Attach, make an actor, start a long --async cell: the panel shows them all.
            for index in (0, 1, 2):
                _run(page, index)
            node = sidebar.locator(".jc-node").first
            node.wait_for(timeout=30_000)
            running = sidebar.locator(".jc-cell.jc-status-running")
            running.first.wait_for(timeout=30_000)
            link = sidebar.locator(".jc-section-link").inner_text()
            assert "connected" in link and "embedded local" in link, link
            node_text = node.inner_text()
            assert "CPU" in node_text and "RAM" in node_text, node_text
            actor = sidebar.locator('.jc-actor[data-actor="panel_actor"]')
            actor.wait_for(timeout=30_000)
            time.sleep(1.5)  # the node bars and the running cell's clock move once more
            page.screenshot(path=str(ARTIFACTS / "sidebar.png"))

            # Cancel the running cell from the panel: its own output says so, the next cell runs.
            running.first.locator(".jc-cancel").click()
            page.wait_for_function(f"() => ({OUTPUT_JS})(2).includes('cancelled')", timeout=60_000)
            sidebar.locator(".jc-cell.jc-status-cancelled").first.wait_for(timeout=30_000)
            _run(page, 3)
            assert "after: 42" in page.evaluate(OUTPUT_JS, 3)

            # Kill the actor from the panel: the agent's list no longer has it.
            actor.locator(".jc-kill").click()
            actor.wait_for(state="detached", timeout=30_000)

            # "Dashboard" opens the live dashboard in a tab of its own.
            sidebar.locator(".jc-open-dashboard").click()
            pane = page.locator(".jp-MainAreaWidget .jupyter-cluster-dashboard").first
            pane.wait_for(timeout=60_000)
            pane.locator("canvas").nth(2).wait_for(timeout=60_000)  # locators pierce Bokeh's shadow roots
            time.sleep(2)  # a few samples drawn
            page.screenshot(path=str(ARTIFACTS / "sidebar-dashboard.png"))
            header = pane.locator(".widget-html").first.inner_text(timeout=10_000)
            assert "embedded local" in header and "1 node(s)" in header, header

            # The cluster's repr carries the same button: with the tab closed, it opens it again.
            page.evaluate("() => window.jupyterapp.shell.currentWidget.dispose()")
            pane.wait_for(state="detached", timeout=10_000)
            _open_notebook_tab(page, FIRST)
            _run(page, 4)
            page.locator(".jp-Notebook button[data-jupyter-cluster-dashboard]").click(timeout=10_000)
            page.locator(".jp-MainAreaWidget .jc-dashboard .jupyter-cluster-dashboard").wait_for(timeout=60_000)

            # A notebook without a cluster: how to start, and a button that inserts it.
            _open(page, SECOND)
            insert = sidebar.locator(".jc-start-insert")
            insert.wait_for(timeout=20_000)
            page.screenshot(path=str(ARTIFACTS / "sidebar-start.png"))
            insert.click()
            first_cell = page.evaluate(
                "() => window.jupyterapp.shell.currentWidget.content.widgets[0].model.sharedModel.getSource()"
            )
            assert "%load_ext jupyter_cluster" in first_cell and "%cluster local" in first_cell, first_cell

            # Back on the first notebook, the cluster shows again.
            _open_notebook_tab(page, FIRST)
            sidebar.locator(".jc-node").first.wait_for(timeout=20_000)
            assert not sidebar.locator(".jc-start-insert").is_visible()

            # A restarted kernel: how to start, then the cluster again once attached.
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
            sidebar.locator(".jc-start-insert").wait_for(timeout=60_000)
            page.wait_for_function(KERNEL_IDLE_JS, arg=FIRST, timeout=60_000)
            _run(page, 0)
            sidebar.locator(".jc-node").first.wait_for(timeout=60_000)
            assert "connected" in sidebar.locator(".jc-section-link").inner_text()
            assert not console_problems(console), "\n".join(console[-40:])
        except (AssertionError, PlaywrightError) as exc:
            screenshot_failed(page, "sidebar-failed.png")
            raise AssertionError(f"{exc}\n" + "\n".join(console[-40:])) from exc
        finally:
            (ARTIFACTS / "sidebar-console.log").write_text("\n".join(console) + "\n")
            browser.close()


def _open_notebook_tab(page: Any, path: str) -> None:
    """Bring an open notebook's tab to the front."""
    page.evaluate("(path) => window.jupyterapp.commands.execute('docmanager:open', {path})", path)
    page.wait_for_function(
        "(path) => { const w = window.jupyterapp.shell.currentWidget;"
        " return !!w && !!w.context && w.context.path === path; }",
        arg=path,
        timeout=20_000,
    )
