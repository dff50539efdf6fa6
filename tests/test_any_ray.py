"""Attaching to a Ray somebody else started: ``ray start --head`` by hand, with token
authentication on (Ray's default when a token exists), off, or with the token kept
somewhere Ray's tools on the head do not look. Over the real sshd on loopback."""

# ruff: noqa: F811

from __future__ import annotations

import asyncio
import os
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._connect import StartedRay, _stop_started
from jupyter_cluster._link import AgentLink, UnixTransport
from jupyter_cluster._local import EmbeddedAgent
from jupyter_cluster._ssh import RayAuthError, SSHTarget

from .ray_start import RAY, start_head
from .sshd import SSHServer, free_port, sshd_server  # noqa: F401

#: A hand-started head may need several tries on a busy machine (tests/ray_start.py: each up to a minute and more).
pytestmark = pytest.mark.timeout(600)

TOKEN_FILE = Path.home() / ".ray" / "auth_token"


def _target(server: SSHServer) -> str:
    return f"{server.user}@{server.host}:{server.port}"


def _options(server: SSHServer) -> dict[str, Any]:
    return {"identity": str(server.identity), "known_hosts": str(server.known_hosts)}


@pytest.fixture
def hand_started(sshd_server: SSHServer) -> Iterator[Callable[..., str]]:
    """``start(env, temp_dir=None)``: ``ray start --head`` as a user types it; returns the address. Stops exactly
    what it started afterwards, and reattaches the cluster that was current before."""
    previous = jc.current()
    started: list[StartedRay] = []

    def start(env: dict[str, str], temp_dir: str | None = None) -> str:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        args = ["--num-cpus", "1", "--disable-usage-stats", "--include-dashboard", "false"]
        args += ["--temp-dir", temp_dir] if temp_dir else []
        done, address = start_head(args, {**environ, **env})
        assert address, done.stderr[-2000:]
        latest = os.path.realpath(os.path.join(temp_dir or "/tmp/ray", "session_latest"))
        target = SSHTarget.parse(_target(sshd_server), **_options(sshd_server))
        started.append(StartedRay(address, os.path.basename(latest), "", [target]))
        return address

    yield start
    current = jc.current()
    if current is not None and current is not previous:
        current.down(force=True)  # a cluster it attached to: the test's own heads are stopped below
    for ray in started:
        asyncio.run(_stop_started(ray))
    if previous is not None and previous.alive:
        jc._cluster.attach(previous)


def _joined(cluster: jc.Cluster) -> str:
    """The GCS address the agent's Ray driver is connected to (after a cell ran as a task)."""
    assert cluster.run_cell("import os\npid = os.getpid()").result(60).outputs["pid"] > 0
    return str(cluster.run_cell("a = ray.get_runtime_context().gcs_address", mode="driver").result(60).outputs["a"])


def _ensure_default_token() -> None:
    """A token in ``~/.ray/auth_token``, as ``ray get-auth-token --generate`` (or any local ``ray.init``) leaves."""
    if not TOKEN_FILE.exists():
        subprocess.run([RAY, "get-auth-token", "--generate"], capture_output=True, check=True, timeout=60)


def test_a_head_started_by_hand_with_token_auth(hand_started: Any, sshd_server: SSHServer) -> None:
    """Ray turns token authentication on because ~/.ray/auth_token exists; the agent finds that cluster (Ray wrote
    it to /tmp/ray/ray_current_cluster) and is let in with the token Ray's own tools use. Beside that running
    cluster, `%cluster local` starts a Ray of its own: plain ray.init() would have joined the running one."""
    _ensure_default_token()
    address = hand_started({})
    cluster = jc.connect(_target(sshd_server), **_options(sshd_server))
    assert _joined(cluster) == address

    agent = EmbeddedAgent(cpus=1)
    link = AgentLink(UnixTransport(agent.socket, agent.exit_reason), agent.secret)
    link.connect()
    embedded = jc.Cluster(link, kind="embedded local", agent=agent)  # not attached: the connected one stays current
    try:
        mine = embedded.run_cell("a = ray.get_runtime_context().gcs_address", mode="driver").result(60).outputs["a"]
        assert mine != address
    finally:
        embedded.down()


@pytest.mark.slow
def test_a_head_with_authentication_disabled(hand_started: Any, sshd_server: SSHServer) -> None:
    address = hand_started({"RAY_AUTH_MODE": "disabled"}, temp_dir=f"/tmp/jc-hand-{secrets.token_hex(3)}")
    cluster = jc.connect(_target(sshd_server), address=address, **_options(sshd_server))
    assert _joined(cluster) == address


@pytest.mark.slow
def test_a_token_kept_elsewhere_is_refused_clearly_then_given(
    hand_started: Any, sshd_server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster's token is not the one in ~/.ray/auth_token: the refusal says it is authentication and what to
    do; --ray-token-file, or RAY_AUTH_TOKEN in the kernel's environment, lets the agent in."""
    _ensure_default_token()
    token = secrets.token_hex(32)
    address = hand_started(
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, temp_dir=f"/tmp/jc-hand-{secrets.token_hex(3)}"
    )
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    before = jc.current()
    with pytest.raises(RayAuthError, match="token authentication is on") as refused:
        jc.connect(_target(sshd_server), address=address, **_options(sshd_server))
    assert "--ray-token-file" in str(refused.value) and "RAY_AUTH_TOKEN" in str(refused.value)
    assert jc.current() is before, "a refused connect leaves the attached cluster alone"

    token_file = tmp_path / "cluster-token"
    token_file.write_text(token + "\n")
    cluster = jc.connect(_target(sshd_server), address=address, ray_token_file=str(token_file), **_options(sshd_server))
    assert _joined(cluster) == address
    cluster.down(force=True)

    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    cluster = jc.connect(_target(sshd_server), address=address, **_options(sshd_server))
    assert _joined(cluster) == address
    assert token not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_bad_token_file_is_a_clear_error(sshd_server: SSHServer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read it"):
        jc.connect(_target(sshd_server), ray_token_file=str(tmp_path / "missing"), **_options(sshd_server))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="expected one token"):
        jc.connect(_target(sshd_server), ray_token_file=str(empty), **_options(sshd_server))


@pytest.mark.slow
def test_the_token_of_a_started_head_is_where_rays_tools_look(sshd_server: SSHServer) -> None:
    """--start-head keeps the cluster's token in ~/.ray/auth_token (0600): Ray's CLI and a second kernel get in."""
    previous = jc.current()
    cluster = jc.connect(_target(sshd_server), start_head=True, port=free_port(), **_options(sshd_server))
    try:
        assert cluster.started is not None
        assert stat.S_IMODE(TOKEN_FILE.stat().st_mode) == 0o600
        assert TOKEN_FILE.read_text().strip() == cluster.started.token
        environ = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        deadline = time.monotonic() + 60
        while True:  # Ray's monitor publishes the first status a few seconds after the head starts
            status = subprocess.run(
                [RAY, "status", "--address", cluster.started.address],
                capture_output=True,
                text=True,
                env={**environ, "RAY_AUTH_MODE": "token"},
                timeout=120,
            )
            if "No cluster status" not in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status.returncode == 0 and "Resources" in status.stdout, status.stdout + status.stderr[-1500:]
        started = cluster.started
        script = (
            "import jupyter_cluster as jc\n"
            f"c = jc.connect({_target(sshd_server)!r}, address={started.address!r}, "
            f"identity={str(sshd_server.identity)!r}, known_hosts={str(sshd_server.known_hosts)!r})\n"
            "print('VALUE', c.run_cell('v = 6 * 7').result(60).outputs['v'])\n"
            "c.down(force=True)\n"
        )
        second = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=environ, timeout=180
        )
        assert "VALUE 42" in second.stdout, second.stderr[-2000:]
    finally:
        cluster.down()
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)
