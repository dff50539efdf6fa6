"""Attaching over SSH to a real OpenSSH sshd on loopback: connect, resume, link loss, security."""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

import jupyter_cluster as jc
from jupyter_cluster._ssh import (
    HeadError,
    HostKeyError,
    RemoteHead,
    SSHAuthError,
    SSHTarget,
    _quick_login_client,
    open_ssh,
)
from jupyter_cluster.agent._protocol import Frame, read_frame, write_frame

from .kernel import Kernel
from .sshd import SSHServer, free_port, link_cutter, sshd_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(300)


def _target(server: SSHServer, port: int | None = None) -> str:
    return f"{server.user}@{server.host}:{port or server.port}"


def _options(server: SSHServer, known_hosts: Path | None = None) -> dict[str, Any]:
    return {"identity": str(server.identity), "known_hosts": str(known_hosts or server.known_hosts)}


def _ray_processes(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and "<defunct>" not in line]


@pytest.fixture(scope="module")
def remote(sshd_server: SSHServer) -> Iterator[jc.Cluster]:
    """A head reached over SSH: Ray started there by --start-head, the agent shipped over SFTP."""
    previous = jc.current()
    cluster = jc.connect(
        _target(sshd_server), start_head=True, port=free_port(), ship="always", **_options(sshd_server)
    )
    try:
        assert cluster.started is not None, "--start-head records what it started (was another Ray running?)"
        marker = "|".join(f"({p})" for p in cluster.started.patterns)
        assert _ray_processes(marker)
        yield cluster
    finally:
        cluster.down(force=True)
    assert not _ray_processes(marker), "down leaves no Ray process of the cluster it started"
    if previous is not None and previous.alive:
        jc._cluster.attach(previous)


def test_connect_runs_cells_with_the_shipped_agent(remote: jc.Cluster) -> None:
    result = remote.run_cell("import os\npid = os.getpid()\nprint('on the head')").result(60)
    assert isinstance(result.outputs["pid"], int)
    assert remote.shipped and remote._link.welcome["agent_path"].startswith(remote.shipped)
    assert remote.head["ray"] and remote.mismatch is None
    cell = remote.run_cell("print('streamed')\nimport time\ntime.sleep(0.2)")
    cell.result(60)
    assert cell.stdout == "streamed\n"


def test_dashboard_is_reached_through_a_port_forward(remote: jc.Cluster) -> None:
    assert remote.dashboard_url and remote.dashboard_url.startswith("http://127.0.0.1:")
    assert remote.dashboard_url in str(remote.status())
    try:
        with urllib.request.urlopen(remote.dashboard_url, timeout=20) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:  # token authentication may answer 401: it answered
        status = exc.code
    assert 200 <= status < 500


def test_a_port_of_the_head_is_forwarded_and_outlives_a_dropped_connection(
    remote: jc.Cluster, sshd_server: SSHServer
) -> None:
    """``forward`` through the session's SSH connection: a head port this machine can use
    (on a free port here, by default); a
    local port in use is refused naming a free one; a refused port closes the client at
    once; the forward goes on through the new connection after SSH drops; disconnect closes it."""
    from .test_forward import SERVER, STOP, _get

    port = free_port()
    remote.run_cell(SERVER.replace("PORT", str(port)), mode="driver", out=[]).result(60)
    url = remote.forward(port)
    (forward,) = remote.forwards
    assert forward.relays and forward.local_port != port and forward.note is None
    assert url == f"http://127.0.0.1:{forward.local_port}" and _get(url) == f"hello from {port}"
    assert f"{url} -> head {remote._link.target}:{port}" in str(remote.status())
    with pytest.raises(ValueError, match=rf"local port {port} is already in use on this machine; port \d+ is free"):
        remote.forward(port, local=port)

    nothing = free_port()
    refused = remote.forward(nothing)
    started = time.monotonic()
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _get(refused)
    assert time.monotonic() - started < 10
    assert remote.forwards[1].last_error == f"nothing listens on port {nothing} of the head {remote._link.target} " + (
        "(connection refused)"
    )
    assert remote.close_forward(nothing)

    remote._link.transport.conn.abort()  # type: ignore[attr-defined]  # the SSH connection drops
    assert _get(url) == f"hello from {port}"  # carried by the connection opened again
    deadline = time.monotonic() + 60
    while remote.link["state"] != "connected" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert remote.run_cell("z = 3").result(60).outputs["z"] == 3
    assert _get(url) == f"hello from {port}"
    session = remote.session
    remote.disconnect()
    try:
        assert not remote.forwards
        with pytest.raises(urllib.error.URLError):
            _get(url)
    finally:
        again = jc.connect(_target(sshd_server), session=session, **_options(sshd_server))
    assert again is remote
    remote.run_cell(STOP, mode="driver", out=[]).result(60)


def test_node_metrics_on_a_head_with_token_authentication(remote: jc.Cluster) -> None:
    """The head runs Ray with token authentication (as --start-head starts it); its nodes'
    metrics endpoints still serve the dashboard, through the session."""
    from jupyter_cluster._feed import MetricsFeed

    mode = remote.run_cell("import os\nmode = os.environ.get('RAY_AUTH_MODE')", mode="driver").result(60)
    assert mode.outputs["mode"] == "token"
    load = remote.status().data["nodes"][0]["load"]  # type: ignore[index]
    assert load is not None and load["stale"] is None and load["mem_total"] > 0, load
    feed = MetricsFeed.of(remote)
    got: list[Any] = []
    token = feed.subscribe(lambda kind, data: got.append(kind))
    try:
        assert feed.wait_first(30) and "metrics" in got
        (node,) = feed.nodes.values()
        assert node["stale"] is None and node["store_total"] > 0 and node["head"], node
    finally:
        feed.unsubscribe(token)


def test_agent_listens_on_no_tcp_port_of_its_own(remote: jc.Cluster, tmp_path: Path) -> None:
    pid = remote._link.welcome["pid"]
    agent_ports = _tcp_listeners(pid)
    # A plain Ray driver on the same cluster, for comparison: Ray's core worker in any
    # driver serves one gRPC port (workers send results to it); the agent has no more.
    address = remote.run_cell("addr = ray.get_runtime_context().gcs_address", mode="driver").result(60).outputs["addr"]
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, subprocess, ray
        ray.init(address={address!r}, log_to_driver=False)
        print(subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout.count(f"pid={{os.getpid()}},"))
    """)
    )
    env = {**__import__("os").environ, "RAY_AUTH_MODE": "token"}
    token = subprocess.run(
        ["bash", "-c", f"cat /proc/{pid}/environ | tr '\\0' '\\n' | sed -n 's/^RAY_AUTH_TOKEN=//p'"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    env["RAY_AUTH_TOKEN"] = token
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert len(agent_ports) == int(plain.stdout.strip().splitlines()[-1])
    socket_dir = f"~/.jupyter_cluster/sessions/{remote.session}"
    mode = subprocess.run(["bash", "-c", f"stat -c %a {socket_dir}"], capture_output=True, text=True).stdout.strip()
    assert mode == "700"


def _tcp_listeners(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


def test_a_connection_without_the_secret_is_refused(remote: jc.Cluster, sshd_server: SSHServer) -> None:
    async def attempt() -> Frame:
        async with asyncssh.connect(**sshd_server.connect_kwargs()) as conn:
            reader, writer = await conn.open_unix_connection(remote._link.transport.socket_path)  # type: ignore[attr-defined]
            write_frame(writer, Frame({"type": "hello", "secret": "guess", "session": "x", "last_seq": 0}))
            return await asyncio.wait_for(read_frame(reader), 10)

    answer = asyncio.run(attempt())
    assert answer.type == "refused"


def test_disconnect_keeps_work_running_and_connect_resumes(remote: jc.Cluster, sshd_server: SSHServer) -> None:
    cell = remote.run_cell(
        "import time\ntime.sleep(2)\nprint('finished while away')\nanswer = 42", pending_handles=True
    )
    remote.disconnect()
    assert jc.current() is None
    time.sleep(3)
    again = jc.connect(_target(sshd_server), session=remote.session, **_options(sshd_server))
    assert again is remote
    assert cell.result(30).outputs["answer"] == 42
    assert cell.stdout == "finished while away\n"


def test_a_new_kernel_resumes_the_session(remote: jc.Cluster, sshd_server: SSHServer, tmp_path: Path) -> None:
    remote.run_cell("import time\ntime.sleep(1.5)\nlater = 'kept'", pending_handles=True)
    remote.disconnect()
    script = tmp_path / "kernel.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        time.sleep(2.5)
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "jupyter_cluster")
        ip.run_line_magic("cluster", "connect {_target(sshd_server)} --session {remote.session} "
                          "--identity {sshd_server.identity} --known-hosts {sshd_server.known_hosts}")
        print("RESULT", ip.user_ns.get("later"))
        ip.run_cell("%%remote\\nafter = later + '!'")  # the session works on: new requests are not taken for old ones
        print("AFTER", ip.user_ns.get("after"))
        ip.run_line_magic("cluster", "disconnect")
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "RESULT kept" in done.stdout, done.stdout + done.stderr
    assert "AFTER kept!" in done.stdout, done.stdout + done.stderr
    assert "finished while detached" in done.stdout
    jc.connect(_target(sshd_server), session=remote.session, **_options(sshd_server))


@pytest.mark.slow
def test_the_link_survives_a_cut_longer_than_30_seconds(link_cutter: Any, sshd_server: SSHServer) -> None:
    cluster = jc.connect(
        _target(sshd_server, link_cutter.port),
        start_head=True,
        port=free_port(),
        **_options(sshd_server, link_cutter.known_hosts),
    )
    try:
        source = "import time\nfor i in range(70):\n    print(i, flush=True)\n    time.sleep(0.5)\nn = 70"
        cell = cluster.run_cell(source)
        time.sleep(3)
        link_cutter.cut()
        time.sleep(33)
        assert not cell.done()
        link_cutter.restore()
        result = cell.result(90)
        assert result.outputs["n"] == 70
        assert cell.stdout.split() == [str(i) for i in range(70)], "a line was lost or repeated"
    finally:
        cluster.down(force=True)


def test_stopping_ray_on_a_host_also_stops_a_child_started_while_it_stops(sshd_server: SSHServer) -> None:
    """What `down` runs on each host: the matched processes and all their descendants go, even a child started
    after the SIGTERM (Ray's dashboard starts a new forkserver when its modules die, and that forkserver matched
    nothing), and a process that ignores SIGTERM."""
    marker = f"jc-stop-{time.monotonic_ns()}"
    # A parent that ignores SIGTERM and starts a new child each time its child dies, as the dashboard does.
    # (A handler, not `trap ''`: an ignored signal stays ignored in the children.)
    respawning = f"exec -a {marker} bash -c 'trap true TERM; while true; do sleep 301 & wait; done'"
    subprocess.Popen(["bash", "-c", respawning], start_new_session=True)
    deadline = time.monotonic() + 10
    while not subprocess.run(["pgrep", "-f", "sleep 301"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "the test's process tree did not start"
        time.sleep(0.05)

    async def stop() -> None:
        target = SSHTarget.parse(_target(sshd_server), **_options(sshd_server))
        conn = await open_ssh(target)
        try:
            await RemoteHead(target, conn).stop_ray("[" + marker[0] + "]" + marker[1:])
        finally:
            conn.close()

    try:
        asyncio.run(stop())
        left = subprocess.run(["pgrep", "-af", f"{marker}|sleep 301"], capture_output=True, text=True).stdout
        assert not left, left
    finally:
        subprocess.run(["pkill", "-KILL", "-f", f"{marker}|sleep 301"])


def test_a_login_sends_a_keys_signed_request_first_and_goes_on_past_a_refused_key(
    sshd_server: SSHServer, tmp_path: Path
) -> None:
    """The login's first request is a key's signature (no "none" request to learn the methods, no query whether
    the server would take the key): sshd logs no postponed (queried) key. A key the server refuses is followed by
    the next; with no key at all the login fails as asyncssh's own does."""
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)

    async def login(keys: list[str]) -> int:
        """The client's port, once a command ran on the server."""
        conn = await asyncssh.connect(
            sshd_server.host,
            port=sshd_server.port,
            username=sshd_server.user,
            client_keys=keys,
            agent_path=None,
            known_hosts=str(sshd_server.known_hosts),
            client_factory=_quick_login_client(),
        )
        try:
            assert str((await conn.run("echo in", check=True)).stdout).strip() == "in"
            return int(conn.get_extra_info("sockname")[1])
        finally:
            conn.close()

    def logged(port: int) -> list[str]:
        """What sshd logged of the login from ``port`` (the server is shared: other tests' clients log too)."""
        return [line for line in sshd_server.log.read_text().splitlines() if f" port {port} ssh2" in line]

    one, two = (
        asyncio.run(login([str(sshd_server.identity)])),
        asyncio.run(login([str(stranger), str(sshd_server.identity)])),
    )
    for port in (one, two):
        lines = logged(port)
        assert any("Accepted publickey for root" in line for line in lines), lines
        assert not any("Postponed publickey" in line for line in lines), f"the client asked about its key: {lines}"
    assert any("Failed publickey for root" in line for line in logged(two)), "the stranger's key was offered first"
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(login([]))
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(login([str(stranger)]))


# Bad input ---------------------------------------------------------------------------
def test_unreachable_host_fails_fast_naming_host_and_port() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(jc.ClusterConnectionError, match=f"127.0.0.1 port {port}"):
        jc.connect(f"root@127.0.0.1:{port}", known_hosts="none")
    assert time.monotonic() - start < 20


def test_authentication_failure(sshd_server: SSHServer, tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(SSHAuthError, match="--identity"):
        jc.connect(_target(sshd_server), identity=str(key), known_hosts=str(sshd_server.known_hosts))


def test_a_keys_passphrase_is_asked_in_the_notebook(sshd_server: SSHServer, tmp_path: Path) -> None:
    """``--identity`` names a key under a passphrase: the notebook asks for it (as ``getpass`` does, nothing
    echoed) and the login goes on; a frontend that takes no input gets the refusal with the question in it."""
    key = tmp_path / "locked_ed25519"
    shutil.copy(sshd_server.identity, key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-p", "-q", "-P", "", "-N", "open sesame", "-f", str(key)], check=True)
    connect = (
        "import sys, jupyter_cluster as jc\n"
        f"jc.connect({_target(sshd_server)!r}, identity={str(key)!r}, known_hosts={str(sshd_server.known_hosts)!r}, "
        "python='/opt/nowhere/python3')"
    )
    kernel = Kernel()
    try:
        printed, asked = kernel.asking(connect, "open sesame")
        assert [(q["prompt"], q["password"]) for q in asked] == [(f"Enter passphrase for key '{key}': ", True)], asked
        assert "no Python at '/opt/nowhere/python3'" in printed, printed  # logged in: the head answered
        printed, asked = kernel.asking(connect, None)
        assert not asked
        assert "SSHAuthError" in printed and "refused the login" in printed, printed
        assert f"asked \"Enter passphrase for key '{key}':\"" in printed and "got no answer" in printed, printed
    finally:
        kernel.kc.stop_channels()
        kernel.km.shutdown_kernel(now=True)


def test_unknown_host_key_is_refused_with_how_to_accept(sshd_server: SSHServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="ssh-keyscan"):
        jc.connect(_target(sshd_server), identity=str(sshd_server.identity), known_hosts=str(empty))


def test_missing_python_on_the_head(sshd_server: SSHServer) -> None:
    with pytest.raises(HeadError, match="no Python at"):
        jc.connect(_target(sshd_server), python="/opt/nowhere/python3", **_options(sshd_server))


def test_head_python_without_ray(sshd_server: SSHServer, tmp_path: Path) -> None:
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(HeadError, match="has no Ray"):
        jc.connect(_target(sshd_server), python=str(bare / "bin" / "python"), **_options(sshd_server))


def test_bad_connect_leaves_the_current_session_alone(remote: jc.Cluster, sshd_server: SSHServer) -> None:
    jc._cluster.attach(remote)
    with pytest.raises(HeadError):
        jc.connect(_target(sshd_server), python="/opt/nowhere/python3", **_options(sshd_server))
    assert jc.current() is remote
    assert remote.run_cell("v = 1").result(60).outputs["v"] == 1


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("connect head.example --port 6380", "--port goes with --start-head"),
        ("connect head.example --start-head --port 0", "port must be a TCP port number"),
        ("connect head.example --start-head --port 70000", "port must be a TCP port number"),
        ("connect head.example --start-head --port six", "invalid int value"),
    ],
)
def test_connect_usage_errors_name_the_option(line: str, expected: str) -> None:
    """Refused before any connection is tried, the attached cluster left as it was."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_cluster")
    before = jc.current()
    with pytest.raises(UsageError, match=expected):
        shell.run_line_magic("cluster", line)
    assert jc.current() is before
