"""Ray's own tools on the embedded cluster, as a plain ``ray.init()`` offers them: Ray's dashboard (on loopback,
behind Ray's token), the state API from a driver cell, and Ray's CLI (``ray status``, ``ray list actors``,
``ray job submit``) from a terminal on the same machine, with the settings the status card gives.

Where the box is small (Binder's 2 GiB) the embedded cluster stays lean, without the dashboard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster.agent._sizing import DASHBOARD_ROOM, DASHBOARD_SETTING, dashboard_fits, memory_limit

from .conftest import remote

pytestmark = pytest.mark.timeout(300)

JOB = f"jc-cli-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tools(cluster: jc.Cluster) -> jc.Cluster:
    if not dashboard_fits(memory_limit()):
        pytest.skip(
            "this box is too small for Ray's dashboard on the embedded cluster (or Ray's default extra is missing)"
        )
    assert cluster.dashboard_url is not None and cluster.ray_env is not None, "the embedded cluster runs Ray's tools"
    return cluster


def terminal(cluster: jc.Cluster, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``command`` as a user runs it in a terminal here, after the ``export`` the status card shows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    assert cluster.ray_env is not None
    env.update(dict(pair.split("=", 1) for pair in cluster.ray_env.split()))
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd="/tmp")


def test_the_dashboard_waits_for_room_and_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DASHBOARD_SETTING, raising=False)
    assert not dashboard_fits(2 * 2**30), "Binder's 2 GiB stays lean"
    assert not dashboard_fits(DASHBOARD_ROOM)
    monkeypatch.setenv(DASHBOARD_SETTING, "1")
    assert dashboard_fits(2 * 2**30)
    monkeypatch.setenv(DASHBOARD_SETTING, "0")
    assert not dashboard_fits(64 * 2**30)


def test_the_status_card_says_where_rays_tools_reach_the_cluster(tools: jc.Cluster) -> None:
    status = tools.status()
    text, html = str(status), status.html()
    assert f"Ray dashboard: {tools.dashboard_url}" in text and "ray get-auth-token" in text, text
    assert f"export {tools.ray_env}" in text and f"<code>export {tools.ray_env}</code>" in html, text
    assert "RAY_AUTH_MODE=token" in tools.ray_env  # type: ignore[operator]  # Ray turned its token on


def test_rays_cli_in_a_terminal_reaches_the_embedded_cluster(shell: Any, tools: jc.Cluster) -> None:
    assert remote(
        shell,
        "@ray.remote(num_cpus=0)\nclass Seen:\n    pass\n"
        "seen = Seen.options(name='seen-by-the-cli').remote()\nray.get(seen.__ray_ready__.remote())",
        "--driver --no-out",
    ).success
    try:
        done = terminal(tools, "ray", "status")
        assert done.returncode == 0 and "Active:" in done.stdout and "CPU" in done.stdout, done.stdout + done.stderr
        done = terminal(tools, "ray", "list", "actors", "--filter", "name=seen-by-the-cli", "--format", "json")
        assert done.returncode == 0, done.stderr
        (actor,) = json.loads(done.stdout)
        assert actor["state"] == "ALIVE" and actor["ray_namespace"] == "jupyter_cluster", actor
        script = "import ray; ray.init(); print('the job ran on', ray.cluster_resources()['CPU'], 'CPU')"
        done = terminal(
            tools, "ray", "job", "submit", "--no-wait", "--submission-id", JOB, "--", "python", "-c", script
        )
        assert done.returncode == 0, done.stdout + done.stderr
        deadline = time.monotonic() + 120
        while "succeeded" not in (state := terminal(tools, "ray", "job", "status", JOB).stdout.lower()):
            assert time.monotonic() < deadline and "failed" not in state, state
            time.sleep(1)
        logs = terminal(tools, "ray", "job", "logs", JOB).stdout
        assert "the job ran on 2.0 CPU" in logs, logs
        # The state API, from a driver cell (it asks Ray's dashboard).
        assert remote(
            shell,
            "import ray.util.state\n"
            "found = [a.name for a in ray.util.state.list_actors(filters=[('name', '=', 'seen-by-the-cli')])]",
            "--driver",
        ).success
        assert shell.user_ns["found"] == ["seen-by-the-cli"]
    finally:
        remote(shell, "ray.kill(ray.get_actor('seen-by-the-cli'))", "--driver --no-out")


def test_the_dashboard_listens_on_loopback_only_behind_rays_token(tools: jc.Cluster) -> None:
    url = tools.dashboard_url
    assert url is not None
    port = int(url.rsplit(":", 1)[1])
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout.split("\n")
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening if line.strip()}
    assert addresses == {"127.0.0.1"}, listening
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/api/jobs/", timeout=30)
    assert refused.value.code == 401, "no token, no answer"
    with open(os.path.expanduser("~/.ray/auth_token")) as f:
        token = f.read().strip()
    request = urllib.request.Request(f"{url}/api/jobs/", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200 and isinstance(json.load(answer), list)
