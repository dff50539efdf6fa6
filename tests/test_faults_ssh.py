"""The faults of test_faults.py, met again on a head reached over SSH (a real sshd on loopback).

The agent there is a daemon started by the boot script, its workers run in the SSH
user's home: a module from the notebook's folder is not importable there unless it
travels with the cell, and a driver cell runs on that daemon's main thread.
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import importlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc

from .conftest import attached
from .sshd import SSHServer, free_port, sshd_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(300)


def _connect(server: SSHServer, **options: Any) -> jc.Cluster:
    target = f"{server.user}@{server.host}:{server.port}"
    return jc.connect(target, identity=str(server.identity), known_hosts=str(server.known_hosts), **options)


@pytest.fixture(scope="module")
def head(sshd_server: SSHServer) -> Iterator[jc.Cluster]:
    with attached(lambda: _connect(sshd_server, start_head=True, port=free_port())) as cluster:
        yield cluster


def test_a_module_of_the_notebook_travels_to_the_head(head: jc.Cluster, tmp_path: Path) -> None:
    source = "def double(x):\n    return 2 * x\n\nclass Box:\n    def __init__(self, v):\n        self.v = v\n"
    (tmp_path / "ssh_helpers.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        helpers = importlib.import_module("ssh_helpers")
        ns = {"ssh_helpers": helpers, "box": helpers.Box(4)}
        result = head.run_cell("r = ssh_helpers.double(box.v)\nout = ssh_helpers.Box(r)", namespace=ns).result(120)
        assert result.outputs["r"] == 8 and isinstance(result.outputs["out"], helpers.Box)
        # Without the source the head could not import it: its workers run in another folder.
        cell = head.run_cell("import os, sys\nwhere = os.getcwd()\nseen = str(sys.path)")
        outputs = cell.result(60).outputs
        assert str(tmp_path) not in outputs["seen"] and outputs["where"] != str(tmp_path)
        assert head.run_cell("ssh_helpers.double(5)", namespace=ns, mode="driver").result(60).value == 10
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ssh_helpers", None)


def test_a_driver_cell_on_the_head_stops_at_once(head: jc.Cluster) -> None:
    cell = head.run_cell("import time\nprint('sleeping', flush=True)\ntime.sleep(40)", mode="driver")
    deadline = time.monotonic() + 60
    while "sleeping" not in cell.stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    cell.cancel()
    with pytest.raises(KeyboardInterrupt, match="cancelled the remote cell"):
        cell.result(30)
    assert time.monotonic() - start < 3
    assert head.run_cell("6 * 7", mode="driver").result(60).value == 42


def test_an_actor_cell_on_the_head_times_out(head: jc.Cluster) -> None:
    start = time.monotonic()
    cell = head.run_cell("import time\ntime.sleep(40)", mode="actor", actor="ssh-sleeper", timeout=3)
    with pytest.raises(jc.CellTimeoutError):
        cell.result(60)
    assert time.monotonic() - start < 10


def test_a_failed_upstream_fails_its_readers_on_the_head(head: jc.Cluster) -> None:
    up = head.run_cell("import time\ntime.sleep(1)\nu = [][0]", pending_handles=True, label="Cell In[1]")
    ns: dict[str, Any] = dict(up.handles)
    down = head.run_cell("d = u + 1", namespace=ns, label="Cell In[2]")
    with pytest.raises(IndexError) as failed:
        down.result(60)
    error = failed.value
    assert isinstance(error, jc.RemoteError) and error.label == "Cell In[1]"
    assert "Cell In[2] did not run: its input `u` comes from Cell In[1]" in str(error)
    with pytest.raises(IndexError):
        head.run_cell("d = u + 1", namespace=ns)


def test_a_wait_on_a_detached_session_ends_at_once_and_resumes(head: jc.Cluster, sshd_server: SSHServer) -> None:
    cell = head.run_cell("import time\ntime.sleep(3)\nlater = 'kept'", pending_handles=True)
    handle = cell.handles["later"]
    head.disconnect()
    start = time.monotonic()
    with pytest.raises(jc.ClusterConnectionError, match=f"session {head.session} is detached.*--session"):
        handle.wait()
    assert time.monotonic() - start < 2
    again = _connect(sshd_server, session=head.session)
    assert again is head and handle.wait(60) and jc.get(handle) == "kept"


def test_handles_of_a_stopped_head_fail_at_once(sshd_server: SSHServer) -> None:
    cluster = _connect(sshd_server, start_head=True, port=free_port())
    cell = cluster.run_cell("import time\ntime.sleep(120)\nslow = 1", pending_handles=True)
    stored = cluster.put([1, 2, 3])
    cluster.down(force=True)
    for wait in (lambda: jc.get(cell.handles["slow"]), lambda: jc.get(stored), lambda: jc.wait([stored])):
        start = time.monotonic()
        with pytest.raises(jc.ClusterError, match="shut down"):
            wait()
        assert time.monotonic() - start < 5


def test_debug_and_breakpoint_work_over_ssh_after_a_dropped_link(
    head: jc.Cluster, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot of the failed cell's frames came with its error: %debug reads it after the link dropped and came
    back; a breakpoint()'s prompts and commands travel over the resumed link."""
    import io

    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_cluster")
    jc._cluster.attach(head)  # the magics' cluster (a test before this one connected to, and stopped, another)
    ip.run_cell("def inner(v):\n    local = v * 2\n    return local / 0\n")
    assert not ip.run_cell("%%remote\nvalue = 21\nout = inner(value)\n").success
    head._link.drop_connection()  # as a network failure would: the link reconnects and resumes the session
    head._link.call("ping", timeout=60)  # answered once the link is back
    assert head.link["state"] == "connected"
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("p local\nup\np value\nq\n"))
    ip.run_line_magic("debug", "")
    printed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "Post-mortem of" in printed and re.search(r"\b42\n", printed) and re.search(r"\b21\n", printed), printed
    monkeypatch.setattr(sys, "stdin", io.StringIO("p x\nc\n"))
    assert ip.run_cell("%%remote\nx = 5\nbreakpoint()\ny = x + 1\n").success
    assert ip.user_ns["y"] == 6 and re.search(r"\b5\n", capsys.readouterr().out)
