"""Two real hosts (network namespaces, each with its own sshd): `up`, a map over both, `down`."""

from __future__ import annotations

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811
import subprocess
import sys
import time
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._ssh import HeadError

from .sshd import ssh_hosts  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(600)


def _options(host: Any) -> dict[str, Any]:
    return {"identity": str(host.identity), "known_hosts": str(host.known_hosts), "python": sys.executable}


def _processes(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and "<defunct>" not in line]


def test_up_makes_a_two_node_cluster_and_down_stops_it(ssh_hosts: Any, tmp_path: Any) -> None:
    """`up` of two hosts; a map runs on both; %cluster sync reaches the worker host (the CSV exists only beside
    the notebook, here, and a cell Ray runs on the worker host reads it from its working directory there);
    `down` stops every Ray process `up` started, on both hosts. (One `up` for all three: each takes a minute.)"""
    head, worker = ssh_hosts.head, ssh_hosts.worker
    previous = jc.current()
    folder = tmp_path / "notebook"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.csv").write_text("a,b\n1,2\n")
    cluster = jc.up(f"root@{head.host}", [f"root@{worker.host}"], **_options(head))
    marker = "|".join(f"({p})" for p in cluster.started.patterns)
    try:
        nodes = {n["address"] for n in cluster.status().data["nodes"]}
        assert nodes == {head.host, worker.host}
        source = "import time\ntime.sleep(1.5)\nnode = ray.util.get_node_ip_address()"
        result = cluster.run_cell(source, mode="map", map_over=("i", range(8)), cpus=1).result(180)
        assert set(result.outputs["node"]) == {head.host, worker.host}, "the map ran on both nodes"
        assert _processes(marker)

        synced = cluster.sync(folder)
        assert synced.sent_files == 1 and synced.working_dir.startswith("gcs://")
        source = (
            "import os, ray\nnode = ray.util.get_node_ip_address()\n"
            "rows = open('data/train.csv').read().splitlines()\ncwd = os.getcwd()"
        )
        on_worker = {f"node:{worker.host}": 0.01}
        outputs = cluster.run_cell(source, resources=on_worker).result(300).outputs
        assert outputs["node"] == worker.host, "it ran on the worker host"
        assert outputs["rows"] == ["a,b", "1,2"]
        assert not outputs["cwd"].startswith(str(folder)), "a copy Ray unpacked on that node"

        # The worker host is lost under a cell (its raylet killed): the cell fails naming the node; the next runs.
        lost = cluster.run_cell("import time\ntime.sleep(300)", resources=on_worker, retries=0)
        deadline = time.monotonic() + 120
        while lost.status != "running":
            assert time.monotonic() < deadline and not lost.done(), f"the cell did not start: {lost.status}"
            time.sleep(0.2)
        time.sleep(1)
        pids = subprocess.run(["ip", "netns", "pids", worker.netns], capture_output=True, text=True).stdout.split()
        raylets = [p for p in pids if _exists(p) and "raylet" in _cmdline(p).split(" ")[0]]
        assert raylets, "no raylet on the worker host"
        subprocess.run(["kill", "-9", *raylets], check=True)
        with pytest.raises(jc.RemoteError) as info:
            lost.result(180)
        assert f"the node it ran on, {worker.host}, was lost" in str(info.value), str(info.value)
        assert cluster.run_cell("after = 40 + 2").result(120).outputs["after"] == 42
    finally:
        cluster.down(force=True)
        if previous is not None and previous.alive:
            jc._cluster.attach(previous)
    assert not _processes(marker), "down stops every Ray process up started, on both hosts"
    for host in (head, worker):
        pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
        commands = [_cmdline(p) for p in pids if _exists(p)]
        assert not [c for c in commands if "ray" in c], commands


def _cmdline(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read().replace("\0", " ")


def _exists(pid: str) -> bool:
    try:
        open(f"/proc/{pid}/cmdline").close()
    except OSError:
        return False
    return True


def test_connect_to_a_head_without_ray_says_so(ssh_hosts: Any) -> None:
    with pytest.raises(HeadError, match="no Ray is running"):
        jc.connect(f"root@{ssh_hosts.head.host}", **_options(ssh_hosts.head))


@pytest.mark.slow
def test_up_with_a_worker_that_cannot_reach_the_head(ssh_hosts: Any) -> None:
    head, worker = ssh_hosts.head, ssh_hosts.worker
    block = ["ip", "netns", "exec", worker.netns, "ip", "route", "add", "blackhole", f"{head.host}/32"]
    subprocess.run(block, check=True)

    # Only Ray processes of these hosts (their address is on their command lines): other tests'
    # clusters start and stop workers meanwhile.
    def ours() -> set[str]:
        return {line for line in _processes("[r]aylet") if head.host in line or worker.host in line}

    before = ours()
    try:
        with pytest.raises(HeadError, match=f"worker {worker.host} could not join the head"):
            jc.up(f"root@{head.host}", [f"root@{worker.host}"], **_options(head))
    finally:
        subprocess.run([*block[:6], "del", *block[7:]], check=True)
    assert ours() <= before, "a failed up stops what it started"
