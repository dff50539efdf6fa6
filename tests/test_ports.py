"""The embedded cluster listens on loopback only: every TCP and UDP socket that any process it started listens
on (Ray's GCS, raylet, object manager, workers, agents, its dashboard, and the agent itself), as ``ss`` lists
them, is on 127.0.0.1 or ::1. No other machine (a café's Wi-Fi, a shared host's network) reaches any of them."""

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


def listening(pids: set[int]) -> list[tuple[str, str, str]]:
    """``(protocol, local address, process name)`` of every listening socket of ``pids``."""
    found = []
    for protocol, flags in (("tcp", "-ltnpH"), ("udp", "-lunpH")):
        out = subprocess.run(["ss", flags], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
            if owners & pids:
                name = re.search(r'\(\("([^"]+)"', line)
                found.append((protocol, line.split()[3], name.group(1) if name else "?"))
    return found


def test_the_embedded_cluster_listens_on_loopback_only(cluster: jc.Cluster) -> None:
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2)")
    agent = cluster._agent
    assert agent is not None, "the session's cluster is the embedded one"
    pids = descendants(agent.process.pid)
    sockets = listening(pids)
    assert len(sockets) >= 5, sockets  # Ray's GCS, raylet, object manager, workers...: it did list them
    outside = [s for s in sockets if not s[1].rsplit(":", 1)[0] in LOOPBACK]
    assert not outside, "listening beyond loopback:\n" + "\n".join(map(str, outside))
    assert os.getpid() not in pids
