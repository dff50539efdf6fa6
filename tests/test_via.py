"""``%cluster connect --via COMMAND``: a head reached through a command that runs a program there.

The command is OpenSSH's own client (``ssh -i KEY -p PORT root@HOST``), to a network-namespace host with an sshd
of its own, where ``--start-head`` starts Ray: every kind of cell, values both ways, a port forward and Ray's
dashboard go through relays the command runs on the head. The stream is cut mid-cell (the command killed, as a
``kubectl exec`` that ends with its API server's connection) and resumed with nothing lost or repeated. A command
that cannot be found, that fails with an error of its own (kubectl's "Forbidden"), or that exits at once, and a
head without the Python asked for, each get an error that names the command and what it said.
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster import ClusterConnectionError, _via
from jupyter_cluster._ssh import HeadError
from jupyter_cluster._via import CommandTransport

from .conftest import attached, check_exactly_once, counting, run
from .kernel import Kernel
from .sshd import SSHServer, free_port, ssh_hosts, sshd_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(600)

#: The namespace host the command reaches (tests/sshd.py's ``ssh_hosts``).
HEAD = "10.213.0.2"
LINES = 12
SOURCE = counting(LINES)


def ssh_command(endpoint: Any) -> str:
    """OpenSSH's client to ``endpoint``, as a user would give it to ``--via`` (the command to run goes after it)."""
    return shlex.join(endpoint.ssh_argv("")[:-1])


@pytest.fixture(scope="module")
def via_head(ssh_hosts: Any) -> Iterator[jc.Cluster]:
    """The namespace host ``head`` (10.213.0.2), reached by OpenSSH's client, with Ray started there."""
    command = ssh_command(ssh_hosts.head)
    with attached(lambda: jc.connect(via=command, python=sys.executable, start_head=True, port=free_port())) as cluster:
        yield cluster


def test_every_kind_of_cell_through_the_command(via_head: jc.Cluster) -> None:
    cluster = via_head
    assert cluster.kind.startswith("via ssh ") and cluster.started_here
    assert isinstance(cluster._link.transport, CommandTransport)
    # On the namespace host: its own address is the one a packet to the bridge leaves from.
    source = "import socket\nudp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nudp.connect(('10.213.0.1', 9))\n"
    task = cluster.run_cell(source + "node = udp.getsockname()[0]\nx = 6 * 7", out=["node", "x"]).result(120)
    assert task.outputs == {"node": HEAD, "x": 42}, task.outputs
    assert cluster.run_cell("count = 1\ncount", mode="actor", actor="via").result(120).value == 1
    assert cluster.run_cell("count += 1\ncount", mode="actor", actor="via").result(120).value == 2
    assert cluster.run_cell("ray.get(ray.put('driver'))", mode="driver").result(120).value == "driver"
    mapped = cluster.run_cell("y = i * i", mode="map", map_over=("i", range(20))).result(120)
    assert mapped.outputs["y"] == [i * i for i in range(20)]
    # A value both ways (8 MiB), through the command's stream.
    big = bytes(range(256)) * (1 << 15)
    handle = cluster.put(big)
    assert cluster.get(handle) == big
    # A port of the head's loopback, forwarded: each connection is a relay the command runs there.
    port = free_port()
    cluster.run_cell(
        "import http.server, threading\n"
        f"httpd = http.server.ThreadingHTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler)\n"
        "threading.Thread(target=httpd.serve_forever, daemon=True).start()",
        mode="driver",
    ).result(120)
    url = cluster.forward(port)
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200
    cluster.run_cell("httpd.shutdown()\nhttpd.server_close()", mode="driver").result(60)
    assert cluster.close_forward(port)
    # Its status says how the head is reached, and a detached session is resumed through the same command.
    assert "via ssh" in str(cluster.status())
    transport = cluster._link.transport
    assert isinstance(transport, CommandTransport)
    hint = transport.resume_hint(cluster.session)
    assert hint.startswith(f"%cluster connect --via {shlex.quote(transport.target.describe())} --session "), hint


def test_a_cut_stream_is_resumed_with_nothing_lost_or_repeated(via_head: jc.Cluster) -> None:
    """The command ends mid-cell (a ``kubectl exec`` whose API server went away ends so): the link runs it again
    and the cell's lines and result arrive once each."""
    cluster = via_head
    transport = cluster._link.transport
    assert isinstance(transport, CommandTransport)
    cell = cluster.run_cell(SOURCE)
    time.sleep(2)
    first = transport._proc
    assert first is not None and first.returncode is None
    transport.discard()  # the command killed, and the relay on the head with its stream
    check_exactly_once(cell, LINES)
    assert transport._proc is not None and transport._proc is not first
    assert cluster.run_cell("1 + 1", mode="driver").result(60).value == 2


def test_a_command_that_cannot_run_is_named() -> None:
    with pytest.raises(ClusterConnectionError, match=r"--via: cannot run 'no-such-command-jc' .*PATH"):
        jc.connect(via="no-such-command-jc exec -i pod --")


def test_a_command_that_fails_is_named_with_its_last_lines() -> None:
    forbidden = (
        'Error from server (Forbidden): pods "ray-head-x" is forbidden: User "alice" cannot create resource '
        '"pods/exec" in API group "" in the namespace "ray"'
    )
    command = shlex.join(["sh", "-c", f"echo {shlex.quote(forbidden)} >&2; exit 1", "--"])
    with pytest.raises(ClusterConnectionError) as failed:
        jc.connect(via=command)
    said = str(failed.value)
    assert "failed (exit status 1)" in said and forbidden in said and "sh -c" in said, said


def test_a_command_that_exits_at_once_says_so() -> None:
    with pytest.raises(ClusterConnectionError, match=r"--via `true` failed \(exit status 0\), saying nothing"):
        jc.connect(via="true")


def test_a_command_that_hangs_is_named_with_how_long_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_via, "PROBE_TIMEOUT", 3.0)
    command = shlex.join(["sh", "-c", "sleep 600", "--"])  # runs, reads nothing, says nothing
    with pytest.raises(ClusterConnectionError, match=r"--via `sh -c 'sleep 600' --` did not end within 3 s"):
        jc.connect(via=command)


def test_a_silent_stream_is_dropped_and_resumed(via_head: jc.Cluster, ssh_hosts: Any) -> None:
    """The command stalls mid-cell (stopped: a ``kubectl`` whose connection hangs, a host that drops packets): after
    the keepalive's silence the link gives it up, runs the command again, and nothing is lost or repeated."""
    assert via_head.started is not None
    command = ssh_command(ssh_hosts.head)
    address = via_head.started.address
    cluster = jc.connect(via=command, python=sys.executable, address=address, keepalive=3, reconnect_for=60)
    try:
        transport = cluster._link.transport
        assert isinstance(transport, CommandTransport)
        cell = cluster.run_cell(SOURCE)
        time.sleep(2)
        stalled = transport._proc
        assert stalled is not None
        os.kill(stalled.pid, signal.SIGSTOP)
        check_exactly_once(cell, LINES)
        assert transport._proc is not stalled and stalled.returncode is not None  # the stalled one was ended
    finally:
        cluster.down(force=True)


def test_a_head_without_that_python_is_told_apart_from_the_command(sshd_server: SSHServer) -> None:
    with pytest.raises(HeadError, match="there is no Python at '/no/such/python' on the head: pass --python"):
        jc.connect(via=ssh_command(sshd_server), python="/no/such/python")


def test_the_magic_takes_via_and_refuses_it_beside_a_head(shell: Any, sshd_server: SSHServer) -> None:
    done = run(shell, f"%cluster connect root@elsewhere --via {shlex.quote(ssh_command(sshd_server))}")
    assert done.error_in_exec is not None and "both a head and --via" in str(done.error_in_exec)
    done = run(shell, "%cluster connect --via 'no-such-command-jc --'")
    assert done.error_in_exec is not None and "cannot run 'no-such-command-jc'" in str(done.error_in_exec)


PASSPHRASE = "correct horse battery staple"


def test_the_commands_own_prompt_is_asked_in_the_notebook(via_head: jc.Cluster, ssh_hosts: Any, tmp_path: Path) -> None:
    """OpenSSH's client with a key under a passphrase asks for it on its terminal: the notebook asks the user (as
    ``getpass`` does, nothing echoed), at connect and again when a cut stream is resumed mid-cell; a frontend that
    takes no input gets an error that names the question."""
    endpoint = ssh_hosts.head
    key = tmp_path / "locked_ed25519"
    shutil.copy(endpoint.identity, key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-p", "-q", "-P", "", "-N", PASSPHRASE, "-f", str(key)], check=True)
    argv = endpoint.ssh_argv("")[:-1]
    argv[argv.index("-i") + 1] = str(key)
    argv[argv.index("BatchMode=yes")] = "BatchMode=no"
    command = shlex.join(argv)
    kernel = Kernel()
    try:
        printed, asked = kernel.asking(
            "import sys, jupyter_cluster as jc\n"
            f"cluster = jc.connect(via={command!r}, python=sys.executable)\n"
            "print('answer', cluster.run_cell('6 * 7', mode='driver').result(60).value)",
            PASSPHRASE,
        )
        assert "answer 42" in printed, printed
        assert asked and all(f"Enter passphrase for key '{key}'" in q["prompt"] and q["password"] for q in asked), asked
        at_connect = len(asked)
        # The stream cut mid-cell: the command is run again, and its question asked by the cell that waits.
        printed, asked = kernel.asking(
            f"cell = cluster.run_cell({SOURCE!r})\n"
            "import time; time.sleep(2)\n"
            "cluster._link.transport.discard()\n"
            f"cell.result(120)\nprint('lines', cell.stdout.split() == [str(i) for i in range({LINES})])",
            PASSPHRASE,
        )
        assert "lines True" in printed, printed
        assert len(asked) == 1 and asked[0]["password"], asked
        # A frontend that takes no input (nbclient, papermill): the error names the question.
        printed, asked = kernel.asking(f"jc.connect(via={command!r}, python=sys.executable)", None)
        assert not asked
        assert "ClusterConnectionError" in printed and "Enter passphrase for key" in printed, printed
        assert "got no answer" in printed, printed
        # The attached session went on meanwhile.
        printed, _ = kernel.asking("print('still', cluster.run_cell('1 + 1', mode='driver').result(60).value)", None)
        assert "still 2" in printed, printed
        print("questions at connect:", at_connect)
    finally:
        kernel.stop()
