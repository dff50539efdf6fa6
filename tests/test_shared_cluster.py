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


def _others(cluster: jc.Cluster) -> tuple[set[int], dict[str, int], str]:
    """The other drivers' pids, the other sessions and the card's text (the session's cluster may have both
    already: earlier tests' detached sessions, their drivers)."""
    status = cluster.status()
    data = status.data or {}
    return {o["pid"] for o in data.get("others") or []}, dict(data.get("sessions") or {}), str(status)


def test_the_status_counts_other_drivers_on_the_cluster(cluster: jc.Cluster) -> None:
    agent = cluster._agent
    assert agent is not None
    pids, _, _ = _others(cluster)
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
        now, _, said = _others(cluster)
        assert now == pids | {driver.pid}, (pids, now)
        drivers = len(now)
        assert f"{drivers} other Ray driver{'s' * (drivers != 1)}" in said, said
        assert "also on this cluster:" in cluster.status()._repr_html_()
        # Down would stop this Ray, and the other driver's work with it: it refuses, and stops nothing.
        with pytest.raises(jc.ClusterError, match=r"others use this cluster \(.*other Ray driver.*--force"):
            cluster.down()
        assert cluster.alive and cluster.run_cell("x = 1\nx").result().value == 1
    finally:
        assert driver.stdin is not None
        driver.stdin.close()
        driver.wait(timeout=60)
    deadline = time.monotonic() + 30
    while driver.pid in _others(cluster)[0] and time.monotonic() < deadline:
        time.sleep(1)
    assert driver.pid not in _others(cluster)[0]


def test_the_status_counts_the_other_notebooks_on_the_agent(cluster: jc.Cluster) -> None:
    """Two kernels on one agent, each in a session of its own (over SSH, a kernel that resumes a session from
    another notebook; here a second kernel on the embedded cluster's agent, the transport aside): each one's
    status counts the other, attached or detached."""
    from .kernel import attach_second, text

    agent = cluster._agent
    assert agent is not None
    _, before, _ = _others(cluster)
    attached, detached = before.get("attached", 0), before.get("detached", 0)
    second = attach_second(agent.socket, agent.secret, name="shared-status")
    try:
        _, sessions, said = _others(cluster)
        assert sessions == {"attached": attached + 1, "detached": detached}, (before, sessions)
        assert f"{attached + detached + 1} other notebook" in said and "on this agent" in said, said
        with pytest.raises(jc.ClusterError, match=r"other notebook.* on this agent"):
            cluster.down()  # it would stop the agent the other notebook uses
        assert cluster.alive
        theirs = text(second.ok("print(jc.current().status())"))
        assert "other notebook" in theirs and "on this agent" in theirs, theirs  # the first, seen from the second
        second.ok("jc.current().disconnect()")  # detached: its session and work stay on the agent
        _, sessions, _ = _others(cluster)
        assert sessions == {"attached": attached, "detached": detached + 1}, (before, sessions)
        if attached == 0 and not _others(cluster)[0]:
            assert cluster._refuse() is None  # a detached notebook does not count
    finally:
        second.stop()
