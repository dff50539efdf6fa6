"""What the embedded cluster listens on, as ``ss`` lists the sockets of every process it started.

This project's own listeners are on loopback only: the agent serves a Unix socket in a 0700 folder and no TCP
port, Ray's dashboard is on 127.0.0.1, and port forwards listen on 127.0.0.1. Ray 2.60's own servers are not:
its GCS, raylets and workers (C++ gRPC servers) listen on every interface whatever node address they are given
(``ray.init`` and ``ray start`` turn 127.0.0.1 into the machine's address: ``services.resolve_ip_for_localhost``),
and some of its Python agents on the machine's address. They are behind Ray's token: a driver without it is
refused (``tests/test_users_apart.py`` tries it as another user). The test lists them, so that a Ray that binds
them otherwise shows here, and fails on a listener of any other process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

import jupyter_cluster as jc

LOOPBACK = ("127.0.0.1", "[::1]", "::1", "[::ffff:127.0.0.1]")


def descendants(pid: int) -> set[int]:
    """``pid`` and every process under it."""
    children: dict[int, list[int]] = {}
    for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout.splitlines():
        if line.strip():
            child, parent = map(int, line.split())
            children.setdefault(parent, []).append(child)
    found, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening(pids: set[int]) -> list[tuple[str, str, str, int]]:
    """``(protocol, local address, process name, pid)`` of every listening socket of ``pids``."""
    found = []
    for protocol, flags in (("tcp", "-ltnpH"), ("udp", "-lunpH")):
        out = subprocess.run(["ss", flags], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            owners = {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids
            if owners:
                name = re.search(r'\(\("([^"]+)"', line)
                found.append((protocol, line.split()[3], name.group(1) if name else "?", min(owners)))
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_rays(pid: int, name: str) -> bool:
    """Whether process ``pid`` is one of Ray's: its C++ servers, its workers and agents, its dashboard."""
    return name in ("gcs_server", "raylet") or name.startswith("ray::") or "/ray/" in command_line(pid)


def test_the_embedded_cluster_s_own_listeners_are_on_loopback_and_ray_s_are_listed(cluster: jc.Cluster) -> None:
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2)")
    agent = cluster._agent
    assert agent is not None, "the session's cluster is the embedded one"
    target, here = _free_port(), _free_port()
    url = cluster.forward(target, local=here)  # a forward to another port: it listens here, in this process
    assert url == f"http://127.0.0.1:{here}", url
    try:
        pids = descendants(agent.process.pid) | {os.getpid()}
        sockets = listening(pids)
        assert len(sockets) >= 5, sockets  # Ray's GCS, raylet, object manager, workers...: it did list them
        assert ("tcp", f"127.0.0.1:{here}") in {s[:2] for s in sockets}, sockets  # the forward, on loopback
        outside = [s for s in sockets if s[1].rsplit(":", 1)[0] not in LOOPBACK]
        # The agent is a Ray driver: Ray's core worker in its process serves gRPC as every worker's does (Ray's);
        # the agent's own code serves only its Unix socket.
        theirs = [s for s in outside if is_rays(s[3], s[2]) or s[3] == agent.process.pid]
        others = [s for s in outside if s not in theirs]
        assert not others, "listening beyond loopback, and not Ray's:\n" + "\n".join(map(str, others))
        print("Ray's listeners beyond loopback (behind its token):\n" + "\n".join(map(str, theirs)))
        dashboard = cluster.dashboard_url
        if dashboard is not None:
            port = dashboard.rsplit(":", 1)[-1].strip("/")
            assert [s for s in sockets if s[1].endswith(f":{port}")], sockets
            assert all(s[1].rsplit(":", 1)[0] in LOOPBACK for s in sockets if s[1].endswith(f":{port}")), sockets
    finally:
        cluster.close_forward(target)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
