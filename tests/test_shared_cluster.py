"""One cluster, other notebooks and drivers on it: what a notebook's status says of them.

A second Ray driver joins the session's embedded cluster (a plain ``ray.init(address=...)`` in a process of its
own, with the cluster's token, as a script or a job would). The notebook's status card (text and HTML) counts it
as other work on the cluster, which the notebook's own lists (cells, actors, what its cells started) leave out;
once that driver exits, the card no longer counts it. While it runs, ``down`` (which would stop the cluster under
it) refuses and stops nothing. A second notebook on the same agent (a session of its own,
as a kernel that resumes a session over SSH has) is counted too, attached and then detached, from both sides; while
it is attached, ``down`` (which would stop the agent it uses) refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import jupyter_cluster as jc

JOIN = """
import sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("joined", flush=True)
sys.stdin.read()
"""


def test_the_status_counts_other_drivers_on_the_cluster(cluster: jc.Cluster) -> None:
    agent = cluster._agent
    assert agent is not None
    before = cluster.status()
    assert "also on this cluster" not in str(before), str(before)
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    driver = subprocess.Popen(
        [sys.executable, "-c", JOIN, str(agent.ready["gcs"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "joined"
        status = cluster.status()
        assert "also on this cluster: 1 other Ray driver" in str(status), str(status)
        assert "also on this cluster: 1 other Ray driver" in status._repr_html_()
        others = (status.data or {}).get("others") or []
        assert [o["pid"] for o in others] == [driver.pid], others
        # Down would stop this Ray, and the other driver's work with it: it refuses, and stops nothing.
        with pytest.raises(jc.ClusterError, match=r"others use this cluster \(1 other Ray driver\).*--force"):
            cluster.down()
        assert cluster.alive and cluster.run_cell("x = 1\nx").result().value == 1
    finally:
        assert driver.stdin is not None
        driver.stdin.close()
        driver.wait(timeout=60)
    deadline = time.monotonic() + 30
    while "also on this cluster" in str(cluster.status()) and time.monotonic() < deadline:
        time.sleep(1)
    assert "also on this cluster" not in str(cluster.status())


def test_the_status_counts_the_other_notebooks_on_the_agent(cluster: jc.Cluster) -> None:
    """Two kernels on one agent, each in a session of its own (over SSH, a kernel that resumes a session from
    another notebook; here a second kernel on the embedded cluster's agent, the transport aside): each one's
    status counts the other, attached or detached."""
    from .kernel import attach_second, text

    agent = cluster._agent
    assert agent is not None
    second = attach_second(agent.socket, agent.secret, name="shared-status")
    try:
        said = str(cluster.status())
        assert "also on this cluster: 1 other notebook on this agent" in said, said
        with pytest.raises(jc.ClusterError, match=r"1 other notebook on this agent"):
            cluster.down()  # it would stop the agent the other notebook uses
        assert cluster.alive
        theirs = text(second.ok("print(jc.current().status())"))
        assert "1 other notebook on this agent" in theirs, theirs  # the first one, seen from the second
        second.ok("jc.current().disconnect()")  # detached: its session and work stay on the agent
        said = str(cluster.status())
        assert "1 other notebook on this agent (1 detached)" in said, said
        assert cluster._refuse_if_shared() is None  # a detached notebook's kernel is gone: down goes ahead
    finally:
        second.stop()
