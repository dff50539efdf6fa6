"""Ray's own cluster launcher: ``jc.up(config=...)`` / ``%cluster up --config`` run ``ray up`` on a cluster YAML with
Ray's ``local`` provider over the two namespace hosts (real sshd, real ``ray up``), attach, and ``down`` runs
``ray down``. Bad YAML fails before anything starts; a YAML Ray rejects gives Ray's own error, trimmed.

The hosts have PID namespaces of their own (``ssh_hosts_own_pids``): Ray's launcher runs ``ray stop`` on them (its
start commands, and ``ray down``), which stops every Ray process the host can see.
"""

# ruff: noqa: F811

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster._launcher import LauncherConfigError, LauncherError

from .sshd import SSHHost, SSHHosts, ssh_hosts_own_pids  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(600)

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
#: How long Ray's autoscaler on the head may take to start the worker over SSH.
JOIN_TIMEOUT = 120.0
#: A worker's raylet exits this long after it lost its head (Ray's default is 60 s; the YAML sets it).
WORKER_GCS_TIMEOUT = 10


def _ray_temp() -> Path:
    """Where Ray's launcher keeps a local provider's state: ``cluster-NAME.state`` (as Ray computes it)."""
    return Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"


def _yaml(name: str, key: Path | str, hosts: SSHHosts | None = None, **extra: Any) -> dict[str, Any]:
    """A cluster YAML for Ray's local provider on the namespace hosts, as its own examples write one: ``ray stop``
    then ``ray start`` (the hosts share this filesystem, so the ``ray`` beside this Python is theirs). Ray's token
    authentication is off, stated on both sides (the shared ~/.ray/auth_token would turn it on for the head only).
    The head keeps its session in /tmp/NAME (not in /tmp/ray, which this machine's other Ray clusters share)."""
    head, worker = ("10.213.0.2", "10.213.0.3") if hosts is None else (hosts.head.host, hosts.worker.host)
    # The dashboard agent gets 90 s to register with its raylet (Ray's 30 s can pass on two busy cores).
    off = "RAY_AUTH_MODE=disabled RAY_agent_register_timeout_ms=90000"
    config: dict[str, Any] = {
        "cluster_name": name,
        "provider": {"type": "local", "head_ip": head, "worker_ips": [worker]},
        "auth": {"ssh_user": "root", "ssh_private_key": str(key)},
        "setup_commands": [],
        "head_start_ray_commands": [
            f"{RAY} stop",
            f"{off} {RAY} start --head --port=6379 --autoscaling-config=~/ray_bootstrap_config.yaml "
            f"--node-ip-address={head} --dashboard-host=127.0.0.1 --disable-usage-stats --temp-dir=/tmp/{name}",
        ],
        "worker_start_ray_commands": [
            f"{RAY} stop",
            f"{off} RAY_gcs_rpc_server_reconnect_timeout_s={WORKER_GCS_TIMEOUT} {RAY} start "
            f"--address=$RAY_HEAD_IP:6379 --node-ip-address={worker} --disable-usage-stats",
        ],
    }
    config.update(extra)
    return config


def _write(path: Path, config: Any) -> str:
    path.write_text(json.dumps(config, indent=1) if not isinstance(config, str) else config)  # JSON is YAML
    return str(path)


def _ray_processes(host: SSHHost) -> list[str]:
    """The Ray daemons running on ``host`` (read from /proc, by the host's network namespace)."""
    pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
            if "raylet" in cmdline or "gcs_server" in cmdline:
                found.append(cmdline[:200])
    return found


def _nodes(cluster: jc.Cluster) -> set[str]:
    return {node["address"] for node in cluster.status().data["nodes"]}


def _monitor_tail(name: str) -> str:
    """What the head autoscaler's logs say of why a worker did not join: the last lines of monitor.log, and the
    lines of monitor.out (where the node updater writes what its SSH commands printed) that say something failed."""
    tails = []
    with contextlib.suppress(OSError):
        text = Path(f"/tmp/{name}/session_latest/logs/monitor.log").read_text(errors="replace")
        tails.append(f"--- monitor.log:\n{text[-1500:]}")
    with contextlib.suppress(OSError):
        lines = Path(f"/tmp/{name}/session_latest/logs/monitor.out").read_text(errors="replace").splitlines()
        said = [line for line in lines if any(word in line.lower() for word in ("error", "fail", "timed out", "exit"))]
        tails.append("--- monitor.out, what failed:\n" + "\n".join(said[-40:]))
        tails.append("--- monitor.out, the end:\n" + "\n".join(lines[-60:]))
    return "\n".join(tails) or "(no monitor logs)"


@pytest.fixture(scope="module")
def launch_yaml(ssh_hosts_own_pids: SSHHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's cluster YAML (a unique cluster name); removes what Ray's launcher left afterwards."""
    name = f"jc-launch-{secrets.token_hex(3)}"
    path = _write(tmp_path_factory.mktemp("launcher") / "cluster.yaml", _yaml(name, ssh_hosts_own_pids.head.identity))
    home = Path.home()
    # Ray's launcher copies these into the head's home, which is this machine's.
    copies = [home / "ray_bootstrap_config.yaml", home / "ray_bootstrap_key.pem"]
    existed = {p for p in copies if p.exists()}
    yield path
    for suffix in ("state", "lock"):
        (_ray_temp() / f"cluster-{name}.{suffix}").unlink(missing_ok=True)
    shutil.rmtree(f"/tmp/{name}", ignore_errors=True)
    for copy in copies:
        if copy not in existed:
            copy.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def launched(launch_yaml: str, ssh_hosts_own_pids: SSHHosts) -> Iterator[jc.Cluster]:
    """A two-node cluster ``jc.up(config=...)`` started with Ray's launcher, its worker joined. Tests that use it
    run before ``test_down_runs_ray_down_and_leaves_no_ray_on_either_host``, which stops it."""
    hosts = ssh_hosts_own_pids
    previous = jc.current()
    cluster = jc.up(config=launch_yaml, known_hosts=str(hosts.head.known_hosts), python=sys.executable)
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT
        while _nodes(cluster) != {hosts.head.host, hosts.worker.host}:
            if time.monotonic() > deadline:
                name = json.loads(Path(launch_yaml).read_text())["cluster_name"]
                pytest.fail(
                    f"the worker did not join in {JOIN_TIMEOUT:.0f} s; the head's autoscaler said:\n"
                    f"{_monitor_tail(name)}"
                )
            time.sleep(2)
        yield cluster
    finally:
        if cluster.stoppers:
            cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)


# --------------------------------------------------------------------------- bad input: nothing starts


def test_up_needs_a_head_or_a_config_not_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        jc.up("head.example", config=str(tmp_path / "cluster.yaml"))
    with pytest.raises(ValueError, match="or a cluster YAML"):
        jc.up()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("[1, 2]", "expected a mapping of Ray cluster launcher fields"),
        ({"cluster_name": "x", "provider": {"type": "local"}, "auth": {}}, "auth.ssh_user is missing"),
        ("cluster_name: [unclosed", "is not valid YAML"),
    ],
)
def test_a_yaml_that_cannot_be_used_is_refused_before_ray_up(tmp_path: Path, content: Any, expected: str) -> None:
    path = tmp_path / "cluster.yaml"
    if content is not None:
        _write(path, content)
    with pytest.raises(LauncherConfigError, match=expected) as caught:
        jc.up(config=str(path))
    assert str(path) in str(caught.value), "the message names the file"
    assert isinstance(caught.value, ValueError)


def test_a_missing_key_file_is_named_and_ray_up_never_runs(tmp_path: Path) -> None:
    name = f"jc-nokey-{secrets.token_hex(3)}"
    key = tmp_path / "no-such-key"
    path = _write(tmp_path / "cluster.yaml", _yaml(name, key))
    started = time.monotonic()
    with pytest.raises(LauncherConfigError) as caught:
        jc.up(config=path)
    message = str(caught.value)
    assert "auth.ssh_private_key" in message and str(key) in message
    assert time.monotonic() - started < 5
    assert not (_ray_temp() / f"cluster-{name}.state").exists(), "`ray up` never ran"


def test_a_yaml_ray_rejects_gives_rays_error_trimmed(tmp_path: Path) -> None:
    config = {"cluster_name": "jc-nosuchcloud", "provider": {"type": "nosuchcloud"}, "auth": {"ssh_user": "root"}}
    with pytest.raises(LauncherError) as caught:
        jc.up(config=_write(tmp_path / "cluster.yaml", config))
    message = str(caught.value)
    assert "Unknown provider type nosuchcloud" in message
    assert "`ray up" in message and "Traceback" not in message and "\x1b[" not in message
    assert len(message) < 1500, message


def test_a_yaml_that_fails_rays_schema_gives_the_one_line_that_says_why(tmp_path: Path) -> None:
    config = _yaml(f"jc-schema-{secrets.token_hex(3)}", __file__, nosuchfield=1)  # a file that exists
    with pytest.raises(LauncherError) as caught:
        jc.up(config=_write(tmp_path / "cluster.yaml", config))
    message = str(caught.value)
    assert "'nosuchfield' was unexpected" in message
    assert len(message) < 1500 and "On instance" not in message, message


def test_without_ray_here_the_launcher_says_where_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "cluster.yaml", _yaml("jc-noray", __file__))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LauncherError, match=r'runs on this machine.*pip install "ray\[default\]"'):
        jc.up(config=path)


# --------------------------------------------------------------------------- the magic


@pytest.fixture
def ip() -> Any:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_cluster")
    return shell


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("up head.example --config cluster.yaml", "both a head and --config"),
        ("up", "neither a head nor --config"),
        ("up --config", "expected one argument"),
        ("up --config /no/such/cluster.yaml", "no such file"),
    ],
)
def test_cluster_up_config_usage_errors(ip: Any, line: str, expected: str) -> None:
    before = jc.current()
    with pytest.raises(UsageError, match=expected):
        ip.run_line_magic("cluster", line)
    assert jc.current() is before


# --------------------------------------------------------------------------- a real cluster


def test_up_config_attaches_to_the_launched_two_node_cluster(
    launched: jc.Cluster, launch_yaml: str, ssh_hosts_own_pids: SSHHosts
) -> None:
    hosts = ssh_hosts_own_pids
    assert jc.current() is launched
    assert launched.kind == f"ssh root@{hosts.head.host}"
    assert launched.launcher == launch_yaml and os.path.isabs(launched.launcher)
    assert f"started by Ray's cluster launcher from {launch_yaml}" in str(launched.status())
    assert launched.run_cell("answer = 6 * 7").result(60).outputs["answer"] == 42
    source = "import time\ntime.sleep(1.5)\nnode = ray.util.get_node_ip_address()"
    result = launched.run_cell(source, mode="map", map_over=("i", range(8)), cpus=1).result(120)
    assert set(result.outputs["node"]) == {hosts.head.host, hosts.worker.host}, "tasks ran on both nodes"


SERVE_APP = """
from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Doubler:
    async def __call__(self, request: Request):
        return {"twice": 2 * int(request.query_params["x"])}


serve.start(http_options={"host": "127.0.0.1", "port": 8000})
serve.run(Doubler.bind(), name="doubler", route_prefix="/double")
"""

BROKEN_APP = """
@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Broken:
    def __init__(self):
        raise RuntimeError("the model file is missing")

    def __call__(self, request):
        return "never"


serve.run(Broken.bind(), name="broken", route_prefix="/broken")
"""


@pytest.mark.slow
def test_serve_on_the_head_through_a_forward(launched: jc.Cluster) -> None:
    """Serve listens on the head's loopback (a namespace of its own: nothing here can reach
    it but through SSH); a forward reaches it; status lists the application and the
    forward; a deployment that cannot start fails its cell with its own error; shutting
    Serve down leaves none of its actors."""
    import json
    import urllib.request

    launched.run_cell(SERVE_APP, mode="driver", out=[]).result(240)
    url = launched.forward(8000)
    with urllib.request.urlopen(f"{url}/double?x=21", timeout=30) as answer:
        assert json.load(answer) == {"twice": 42}
    text = str(launched.status())
    assert "Serve application doubler: RUNNING" in text and f"{url} -> head " in text, text

    with pytest.raises(jc.RemoteError) as info:
        launched.run_cell(BROKEN_APP, mode="driver", out=[]).result(240)
    message = str(info.value)
    assert "Deploying application broken failed" in message and "the model file is missing" in message, message

    launched.run_cell("serve.shutdown()", mode="driver", out=[]).result(120)
    left = launched.status().data["started"]  # type: ignore[index]
    assert not left["serve"] and not [a for a in left["actors"] if a["class"].startswith(("Serve", "Proxy"))], left
    launched.close_forward(8000)


def test_connect_config_attaches_to_the_running_cluster_and_down_leaves_it_up(
    launched: jc.Cluster, launch_yaml: str, ssh_hosts_own_pids: SSHHosts
) -> None:
    """``jc.connect(config=...)`` finds the head with ``ray get-head-ip`` and logs in as the YAML's user with its
    key: no ``ray up``. Its ``down`` stops its own agent and leaves the cluster, and the first notebook's cells, up."""
    hosts = ssh_hosts_own_pids
    with pytest.raises(ValueError, match="not both"):
        jc.connect("root@head.example", config=launch_yaml)
    cluster = jc.connect(config=launch_yaml, known_hosts=str(hosts.head.known_hosts), python=sys.executable)
    try:
        assert cluster is not launched and cluster.kind == f"ssh root@{hosts.head.host}"
        assert not cluster.launched_here and not cluster.stoppers
        text = str(cluster.status())
        assert f"Ray's cluster launcher's cluster of {launch_yaml}, found running" in text, text
        assert cluster.run_cell("seen = 6 * 7").result(60).outputs["seen"] == 42
    finally:
        cluster.down(force=True)
    assert _ray_processes(hosts.head), "down of an attached cluster leaves Ray running"
    jc._cluster.attach(launched)
    assert launched.run_cell("still = 1").result(60).outputs["still"] == 1


def test_a_second_notebooks_up_config_attaches_and_restarts_nothing(
    launched: jc.Cluster, launch_yaml: str, ssh_hosts_own_pids: SSHHosts, tmp_path: Path
) -> None:
    """A cell runs on the launcher's cluster; a second kernel runs ``%cluster up --config`` of the same YAML (a
    colleague's notebook, or this one after a kernel restart). Ray already runs on the head, so that kernel attaches
    to it as it is and says so; ``ray up`` (which restarts Ray on every node) never runs; the cell goes on and
    finishes."""
    from .kernel import Kernel, error_text, text

    hosts = ssh_hosts_own_pids
    go = tmp_path / "go"  # the hosts share this filesystem: the cell waits for the test to make this file
    source = f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.2)\nfinished = 'yes'"
    cell = launched.run_cell(source)
    kernel = Kernel()
    try:
        kernel.ok("%load_ext jupyter_cluster")
        reply, messages = kernel.execute(
            f"%cluster up --config {launch_yaml} --known-hosts {hosts.head.known_hosts} --python {sys.executable}",
            timeout=300,
        )
        said = text(messages)
        assert reply["status"] == "ok", error_text(messages) + said
        assert "Ray already runs on the head" in said and f"--config {launch_yaml} --restart" in said, said
        assert "Updating cluster configuration" not in said and "ray start" not in said, "`ray up` did not run"
        status = text(kernel.ok("import jupyter_cluster as jc\nprint(jc.current().status())"))
        assert "found running" in status, status
        answer = text(kernel.ok("%%remote\nprint(6 * 7)"))
        assert "42" in answer, answer
        assert not cell.done(), "the first notebook's cell is still running"
    finally:
        kernel.stop()  # its %cluster down detaches: the cluster it did not start stays up
    go.touch()
    assert cell.result(120).outputs["finished"] == "yes"
    assert _ray_processes(hosts.head) and _ray_processes(hosts.worker)


def test_up_config_restart_is_only_for_a_cluster_yaml(ip: Any) -> None:
    with pytest.raises(ValueError, match="restart= is for a cluster YAML"):
        jc.up("head.example", restart=True)
    with pytest.raises(UsageError, match="--restart goes with --config"):
        ip.run_line_magic("cluster", "up head.example --restart")
    with pytest.raises(UsageError, match="neither a head, --config nor --via"):
        ip.run_line_magic("cluster", "connect")


def test_down_runs_ray_down_and_leaves_no_ray_on_either_host(
    launched: jc.Cluster, launch_yaml: str, ssh_hosts_own_pids: SSHHosts
) -> None:
    """Runs last: it stops the module's cluster. ``ray down`` stops Ray on the head; with the local provider the
    worker's raylet ends by itself once its head is gone (the YAML gives it 10 s)."""
    head, worker = ssh_hosts_own_pids.head, ssh_hosts_own_pids.worker
    assert _ray_processes(head) and _ray_processes(worker)
    launched.down(force=True)
    assert jc.current() is not launched
    assert not _ray_processes(head), "ray down stopped Ray on the head"
    state = json.loads(
        (_ray_temp() / f"cluster-{json.loads(Path(launch_yaml).read_text())['cluster_name']}.state").read_text()
    )
    assert {node["state"] for node in state.values()} == {"terminated"}, state
    deadline = time.monotonic() + WORKER_GCS_TIMEOUT + 50
    while _ray_processes(worker) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _ray_processes(worker), "the worker's raylet ended once its head was gone"
    launched.down(force=True)  # a second down is harmless: nothing is left to stop
    assert not launched.stoppers


def test_a_down_that_cannot_stop_the_head_ends_within_a_minute_and_says_what_to_run(
    launch_yaml: str, ssh_hosts_own_pids: SSHHosts
) -> None:
    """Runs after the module's cluster is down: ``ray up`` again (``up --config`` finds no Ray on the head and
    starts it), then ``down`` while the head's login shell finds no ``ray`` (a head whose Ray lives in a virtualenv
    its login shell does not activate), so Ray's own ``ray stop`` there fails. ``down`` ends within a minute with an
    error that names the head and the command to run; nothing waits in silence."""
    hosts = ssh_hosts_own_pids
    head = hosts.head
    with pytest.raises(LauncherError, match="found no head"):
        jc.connect(config=launch_yaml, known_hosts=str(head.known_hosts), python=sys.executable)
    cluster = jc.up(config=launch_yaml, known_hosts=str(head.known_hosts), python=sys.executable)
    assert cluster.launched_here and _ray_processes(head)
    try:
        with head.login_path("/usr/sbin:/usr/bin:/sbin:/bin"):
            started = time.monotonic()
            with pytest.raises(LauncherError) as caught:
                cluster.down(force=True)
            took = time.monotonic() - started
    finally:
        head.ssh(f"{RAY} stop", timeout=120)  # what the message says to run (by its full path: this run's Ray)
    message = str(caught.value)
    assert took < 60, f"down took {took:.0f} s"
    assert f"ssh root@{head.host} ray stop" in message and launch_yaml in message, message
    assert "ray: command not found" in message, message
    assert jc.current() is not cluster and not cluster.stoppers
    deadline = time.monotonic() + WORKER_GCS_TIMEOUT + 50
    while (_ray_processes(head) or _ray_processes(hosts.worker)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _ray_processes(head) and not _ray_processes(hosts.worker)
