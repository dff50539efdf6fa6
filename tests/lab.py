"""A JupyterLab server on loopback for the browser tests, and what they share.

The server runs in a subprocess with a random token and its own root, runtime,
workspaces and user-settings folders; the installed labextensions (ipywidgets,
jupyter_bokeh, this project's sidebar) are found as they are installed.
"""

from __future__ import annotations

import contextlib
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


@dataclass
class Lab:
    """A JupyterLab server for one test module."""

    url: str
    token: str
    root: Path
    log: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api(lab: Lab, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"{lab.url}{path}", method=method, headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


def wait_answering(lab: Lab, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({process.returncode}):\n{lab.log.read_text()[-3000:]}")
        try:
            api(lab, "/api/status")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer in {timeout:.0f} s:\n{lab.log.read_text()[-3000:]}")


def stop(lab: Lab, process: subprocess.Popen[bytes]) -> None:
    """Shut the kernels down (their embedded clusters with them), then the server."""
    if process.poll() is None:
        try:
            for kernel in api(lab, "/api/kernels"):
                api(lab, f"/api/kernels/{kernel['id']}", method="DELETE")
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


@contextlib.contextmanager
def lab_server(tmp_path_factory: pytest.TempPathFactory, log_name: str = "lab.log") -> Iterator[Lab]:
    """JupyterLab on loopback with a random token; stopped at the end whatever happened.
    Skips the test where Chromium or the playwright module is missing."""
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
    port = free_port()
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
        wait_answering(lab, process, timeout=60)
        yield lab
    finally:
        stop(lab, process)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / log_name).write_bytes(lab.log.read_bytes())


def open_notebook(browser: Any, lab: Lab, notebook: str, console: list[str], viewport: dict[str, int]) -> Any:
    """A page of ``browser`` on ``notebook`` in ``lab``, its console and page errors kept in ``console``, once
    JupyterLab has started and the notebook's kernel is idle (cells sent before that are dropped)."""
    page = browser.new_page(viewport=viewport)
    page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
    page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
    page.goto(f"{lab.url}/lab/tree/{notebook}?reset&token={lab.token}", timeout=60_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=60_000)
    page.wait_for_function(KERNEL_IDLE_JS, arg=notebook, timeout=60_000)
    return page


def write_notebook(path: Path, cells: list[str]) -> None:
    """A notebook of code ``cells`` at ``path``, for the ``python3`` kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)


def screenshot_failed(page: Any, name: str) -> None:
    """Keep the page as it was when a browser test failed (``tests/artifacts/browser/NAME``), if it can be."""
    from playwright.sync_api import Error as PlaywrightError

    if page is None:
        return
    try:
        page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    except PlaywrightError:
        pass


def execute(page: Any, command: str, timeout: float = 30.0) -> Any:
    """Run a JupyterLab command in the page, with a timeout of our own (the promise has none)."""
    return page.evaluate(
        """([command, ms]) => Promise.race([
          window.jupyterapp.commands.execute(command),
          new Promise((_, reject) => setTimeout(() => reject(new Error(command + ": no answer in " + ms + " ms")), ms)),
        ])""",
        [command, int(timeout * 1000)],
    )


def console_problems(console: list[str]) -> list[str]:
    """Page errors, and what BokehJS says when a view patches rows it never got."""
    return [line for line in console if line.startswith("[pageerror]") or "inconsistent lengths" in line]
