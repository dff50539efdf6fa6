"""A real JupyterHub with two Unix users, driven by headless Chromium.

JupyterHub (from PyPI) runs as root on loopback with configurable-http-proxy (from npm, installed into this
environment by scripts/test.sh), the dummy authenticator and JupyterHub's local process spawner: each user's
server is ``jupyterhub-singleuser`` of this environment, run as that Unix user. Two users are made for it
(``useradd``: root only). For each user, Chromium logs in through the hub's login form, opens JupyterLab at
``/user/NAME/lab`` and runs a notebook that attaches an embedded cluster, runs a cell on it, shows the dashboard
and deploys a Ray Serve application (on a port of the user's own), which it forwards; the *Ray cluster* sidebar
shows the cluster. The links the notebook shows go through the hub (``/user/NAME/proxy/PORT/``): the test opens
Ray's dashboard and the Serve endpoint through them, in the same browser. Screenshots:
``tests/artifacts/browser/hub-*.png``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .lab import ARTIFACTS, CHROMIUM, KERNEL_IDLE_JS, console_problems, free_port, screenshot_failed, write_notebook
from .unix_users import make_user, this_python_reachable

pytestmark = pytest.mark.timeout(900)

USERS = ("jc-hub-ann", "jc-hub-bob")
PASSWORD = "a-test-password"
NOTEBOOK = "hub.ipynb"
#: What the Serve deployment answers, at ``/hello`` on its port (each user's own: two users' clusters on one
#: host cannot both have Serve's 8000).
SERVED = "hello from Serve"
CELLS = [
    "%load_ext jupyter_cluster\n%cluster local --cpus 1\nimport jupyter_cluster as jc",
    "%%remote\nanswer = 6 * 7\nanswer",
    "dash = jc.dashboard()\ndash",
    "import socket\nwith socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n    port = s.getsockname()[1]",
    "%%remote --driver --no-out\n"
    "from ray import serve\n"
    "@serve.deployment(ray_actor_options={'num_cpus': 0})\n"
    "class Hello:\n"
    "    def __call__(self, request):\n"
    f"        return {SERVED!r}\n"
    "serve.start(http_options={'host': '127.0.0.1', 'port': port})\n"
    "serve.run(Hello.bind(), name='hello', route_prefix='/hello')",
    "%cluster forward $port",
    "print(jc.current().status().dashboard)",
]


def _chp() -> str | None:
    """configurable-http-proxy: in this environment (scripts/test.sh installs it there with npm), else on PATH."""
    local = Path(sys.prefix) / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(local) if local.exists() else shutil.which("configurable-http-proxy")


@dataclass
class Hub:
    url: str
    log: Path
    users: dict[str, Path]  # user -> home


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    pytest.importorskip("jupyterhub", reason="JupyterHub is not installed (the test extra installs it)")
    pytest.importorskip("jupyter_server_proxy", reason="jupyter-server-proxy is not installed (the test extra)")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python module is not installed")
    if os.geteuid() != 0:
        pytest.skip("JupyterHub's local spawner runs each user's server as that user: the hub runs as root")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    chp = _chp()
    if chp is None:
        pytest.skip("no configurable-http-proxy (scripts/test.sh installs it: npm install --prefix $VIRTUAL_ENV)")
    with this_python_reachable():
        yield from _hub(tmp_path_factory, chp)


def _hub(tmp_path_factory: pytest.TempPathFactory, chp: str) -> Iterator[Hub]:
    base = tmp_path_factory.mktemp("hub")
    base.chmod(0o755)
    users = {name: make_user(name) for name in USERS}
    port, api = free_port(), free_port()
    config = base / "jupyterhub_config.py"
    config.write_text(
        "\n".join(
            [
                f"c.JupyterHub.ip = '127.0.0.1'\nc.JupyterHub.port = {port}",
                f"c.JupyterHub.hub_ip = '127.0.0.1'\nc.JupyterHub.hub_port = {free_port()}",
                f"c.ConfigurableHTTPProxy.command = [{chp!r}]",
                f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{api}'",
                "c.JupyterHub.authenticator_class = 'dummy'",
                f"c.DummyAuthenticator.password = {PASSWORD!r}",
                f"c.Authenticator.allowed_users = {set(USERS)!r}",
                f"c.JupyterHub.db_url = 'sqlite:///{base}/hub.sqlite'",
                f"c.JupyterHub.cookie_secret_file = '{base}/cookie_secret'",
                f"c.JupyterHub.pid_file = '{base}/hub.pid'",
                f"c.Spawner.cmd = [{str(Path(sys.prefix) / 'bin' / 'jupyterhub-singleuser')!r}]",
                "c.Spawner.default_url = '/lab'",
                f"c.Spawner.environment = {{'PATH': {str(Path(sys.prefix) / 'bin') + ':/usr/bin:/bin'!r}}}",
                "c.Spawner.start_timeout = 180\nc.Spawner.http_timeout = 180",
                "c.Spawner.args = ['--LabApp.expose_app_in_browser=True']",
            ]
        )
    )
    log = base / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=base,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/hub/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the hub did not start:\n" + log.read_text()[-4000:])
            time.sleep(0.5)
        yield Hub(url=url, log=log, users=users)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        for name in USERS:  # what the users' servers started (their kernels, their clusters)
            subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "hub.log").write_bytes(log.read_bytes())


def _notebook(home: Path, user: str) -> None:

    path = home / NOTEBOOK
    write_notebook(path, CELLS)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


RUN_ALL_JS = """
async () => {
  const app = window.jupyterapp;
  await app.commands.execute("notebook:run-all-cells");
  return true;
}
"""

#: Each cell's outputs as text, and whether the notebook's kernel is idle with every cell run.
OUTPUTS_JS = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = panel.content.widgets;
  const texts = cells.map((cell) => (cell.outputArea ? cell.outputArea.node.innerText : ""));
  const ran = cells.every((cell) => cell.model.type !== "code" || cell.model.executionCount !== null);
  const idle = panel.sessionContext.session?.kernel?.status === "idle";
  return [texts, ran && idle];
}
"""


def test_each_user_runs_a_cluster_through_the_hub_and_opens_its_links(hub: Hub) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for user, home in hub.users.items():
        _notebook(home, user)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            for user in hub.users:
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                console: list[str] = []
                page: Any = context.new_page()
                page.on("console", lambda m, c=console: c.append(f"[{m.type}] {m.text}"))
                page.on("pageerror", lambda e, c=console: c.append(f"[pageerror] {e}"))
                try:
                    _as_user(page, hub, user, console)
                except (AssertionError, PlaywrightError) as exc:
                    screenshot_failed(page, f"hub-{user}-failed.png")
                    raise AssertionError(f"{user}: {exc}\n" + "\n".join(console[-30:])) from exc
                finally:
                    context.close()
        finally:
            browser.close()


def _as_user(page: Any, hub: Hub, user: str, console: list[str]) -> None:
    prefix = f"/user/{user}/"
    page.goto(f"{hub.url}/hub/login", timeout=60_000)
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(rf".*{re.escape(prefix)}lab.*"), timeout=240_000)
    page.goto(f"{hub.url}{prefix}lab/tree/{NOTEBOOK}?reset", timeout=60_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=120_000)
    page.wait_for_function(KERNEL_IDLE_JS, arg=NOTEBOOK, timeout=120_000)
    page.locator('.jp-SideBar [data-id="jupyter-cluster-sidebar"]').click(timeout=30_000)
    page.evaluate(RUN_ALL_JS)
    deadline = time.monotonic() + 300
    texts: list[str] = []
    while time.monotonic() < deadline:
        texts, done = page.evaluate(OUTPUTS_JS)
        if done:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the notebook did not finish: {texts}")
    assert not any("Traceback" in t or "Error" in t for t in texts), texts
    assert "42" in texts[1], texts
    # The links the notebook shows go through the hub, under this user's prefix.
    forward, dashboard = texts[5], texts[6].strip()
    found = re.search(rf"({re.escape(prefix)}proxy/\d+/)", forward)
    assert found, forward
    assert dashboard.startswith(f"{prefix}proxy/"), dashboard
    sidebar = page.locator("#jupyter-cluster-sidebar")
    sidebar.locator(".jc-node").first.wait_for(timeout=60_000)
    assert "connected" in sidebar.inner_text()
    page.locator(".jupyter-cluster-dashboard canvas").first.wait_for(timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / f"hub-{user}.png"))
    # Through the hub's proxy, as the browser reaches them: the forwarded server, and Ray's dashboard.
    served = page.context.new_page()
    served.goto(f"{hub.url}{found.group(1)}hello", timeout=60_000)
    assert SERVED in served.inner_text("body"), served.content()[:2000]
    served.goto(f"{hub.url}{dashboard}", timeout=60_000)
    served.wait_for_load_state("networkidle", timeout=60_000)
    assert "Ray" in served.title(), (served.title(), served.content()[:2000])
    served.screenshot(path=str(ARTIFACTS / f"hub-{user}-ray-dashboard.png"))
    served.close()
    assert not console_problems(console), "\n".join(console[-40:])
