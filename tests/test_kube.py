"""``%cluster connect k8s:NAMESPACE/RAYCLUSTER`` with the real ``kubectl``, against a stand-in API server.

No Kubernetes runs here: :mod:`tests.kube` speaks the API server's protocol to the ``kubectl`` on this machine
(discovery, pods by KubeRay's labels, events, ``pods/exec`` over WebSocket ``v5`` and SPDY ``v4``). The
RayCluster's head "pod" is a network-namespace host (10.213.0.2) where Ray runs; the stand-in's exec runs each
command there (``ip netns exec``). Checked: cells of every kind through ``kubectl exec``, the dashboard forwarded,
the exec stream cut by an API server restart mid-cell and resumed with nothing lost or repeated (over either
protocol), Ray's token from the container's environment, a replaced head pod named and the new one attached, and
each way the attach can fail said as such (no RayCluster, a head pod pending with its events, ``pods/exec``
forbidden with the rule to ask for, a head container without the Python asked for, no ``kubectl``).
"""

# Test parameters named after the imported fixtures redefine them, as pytest intends.
# ruff: noqa: F811

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster._kube import KubeError
from jupyter_cluster._ssh import HeadError

from .conftest import attached, check_exactly_once, counting
from .kube import KubeState, Pod, StandInAPIServer
from .sshd import free_port, ssh_hosts  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(600)

NAMESPACE, CLUSTER = "ray", "raycluster-kuberay"
HEAD_POD = "raycluster-kuberay-head-x7k2p"
LINES = 12
SOURCE = counting(LINES)


def _head_pod(netns: str, name: str = HEAD_POD, phase: str = "Running") -> Pod:
    labels = {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head", "ray.io/is-ray-node": "yes"}
    return Pod(name, NAMESPACE, labels, ["ray-head", "autoscaler"], phase=phase, runs_in=["ip", "netns", "exec", netns])


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInAPIServer]:
    assert shutil.which("kubectl"), "no kubectl on PATH: these tests drive the real one (Debian's kubectl package)"
    server = StandInAPIServer(tmp_path_factory.mktemp("kube")).start()
    saved = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(server.kubeconfig())
    try:
        yield server
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved


@pytest.fixture(scope="module")
def ray_head(ssh_hosts: Any) -> Iterator[str]:
    """Ray on the namespace host ``head``, as KubeRay's head container runs it (started here through
    ``ip netns exec``, itself a command that runs a program on the head); yields its address."""
    command = f"ip netns exec {ssh_hosts.head.netns}"
    with attached(lambda: jc.connect(via=command, python=sys.executable, start_head=True, port=free_port())) as starter:
        assert starter.started is not None
        yield starter.started.address


@pytest.fixture
def raycluster(kube: StandInAPIServer, ssh_hosts: Any) -> Iterator[StandInAPIServer]:
    """The RayCluster and its running head pod; the stand-in as the test left it is reset after."""
    state = kube.state
    state.rayclusters[(NAMESPACE, CLUSTER)] = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                                              "metadata": {"name": CLUSTER, "namespace": NAMESPACE}}  # fmt: skip
    state.pods[(NAMESPACE, HEAD_POD)] = _head_pod(ssh_hosts.head.netns)
    try:
        yield kube
    finally:
        state.pods.clear()
        state.rayclusters.clear()
        state.events.clear()
        state.exec_forbidden.clear()
        state.exec_protocols = KubeState().exec_protocols


def _attach(address: str, **kw: Any) -> jc.Cluster:
    return jc.connect(f"k8s:{NAMESPACE}/{CLUSTER}", address=address, python=sys.executable, **kw)


def test_cells_of_every_kind_through_kubectl_exec(raycluster: StandInAPIServer, ray_head: str) -> None:
    cluster = _attach(ray_head)
    try:
        assert cluster.kind == f"k8s:{NAMESPACE}/{CLUSTER} (pod {HEAD_POD})", cluster.kind
        source = (
            "import socket\nudp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nudp.connect(('10.213.0.1', 9))\n"
        )
        task = cluster.run_cell(source + "node = udp.getsockname()[0]", out=["node"]).result(120)
        assert task.outputs == {"node": "10.213.0.2"}, task.outputs  # in the head pod
        assert cluster.run_cell("k = 1\nk", mode="actor", actor="kube").result(120).value == 1
        assert cluster.run_cell("ray.get(ray.put(7))", mode="driver").result(120).value == 7
        mapped = cluster.run_cell("y = i + 1", mode="map", map_over=("i", range(10))).result(120)
        assert mapped.outputs["y"] == list(range(1, 11))
        # Everything went through the real kubectl's exec (WebSocket), into the head pod's first container.
        execs = [r for r in raycluster.state.requests if r.startswith("EXEC ")]
        assert execs and set(execs) == {f"EXEC {NAMESPACE}/{HEAD_POD}"}, execs
        assert raycluster.state.protocols and set(raycluster.state.protocols) <= {"v5.channel.k8s.io"}
        assert raycluster.state.containers == {"ray-head"}
        assert f"k8s:{NAMESPACE}/{CLUSTER}" in str(cluster.status())
        hint = cluster._link.transport.resume_hint(cluster.session)
        expected = f"%cluster connect k8s:{NAMESPACE}/{CLUSTER} --session {cluster.session} --python {sys.executable}"
        assert hint == expected, hint
    finally:
        cluster.down(force=True)


def test_an_api_server_restart_mid_cell_loses_nothing(raycluster: StandInAPIServer, ray_head: str) -> None:
    """Every exec stream is cut with the API server; the link runs ``kubectl exec`` again once it is back."""
    cluster = _attach(ray_head)
    try:
        cell = cluster.run_cell(SOURCE)
        time.sleep(2)
        raycluster.stop()
        time.sleep(5)
        assert not cell.done()
        raycluster.start()
        check_exactly_once(cell, LINES)
    finally:
        if raycluster.loop is None:
            raycluster.start()
        cluster.down(force=True)


def test_a_replaced_head_pod_is_named_with_what_went_with_it_and_the_new_one_attached(
    raycluster: StandInAPIServer, ray_head: str, ssh_hosts: Any
) -> None:
    """KubeRay replaced the head pod (another name; here the same host, so that the new pod has a Ray): the cells
    in flight fail naming the old pod, the new one and what went with it, and the notebook attaches to the new pod
    by itself, a new session there; the next cell runs on it."""
    cluster = _attach(ray_head, reconnect_for=60)
    new_pod = "raycluster-kuberay-head-q9w4z"
    successor = None
    try:
        cluster.run_cell("kept = 1", mode="driver").result(120)
        state = raycluster.state
        del state.pods[(NAMESPACE, HEAD_POD)]
        state.pods[(NAMESPACE, new_pod)] = _head_pod(ssh_hosts.head.netns, new_pod)
        raycluster.stop()  # the old pod's exec streams end with it
        raycluster.start()
        cell = cluster.run_cell("2", mode="driver")
        with pytest.raises(Exception, match=f"head pod {HEAD_POD} .* was replaced by {new_pod}") as lost:
            cell.result(120)
        said = str(lost.value)
        assert "the driver's namespace" in said and "attaches to the new head now" in said, said
        successor = jc.current()  # waits for the attach under way
        assert successor is not None and successor is not cluster, successor
        assert successor.kind == f"k8s:{NAMESPACE}/{CLUSTER} (pod {new_pod})", successor.kind
        assert successor.session != cluster.session
        assert successor.run_cell("3", mode="driver").result(120).value == 3
        # A new session: the old driver's namespace did not come along.
        assert "kept" in str(successor.run_cell("kept", mode="driver").exception(120))
    finally:
        cluster.down(force=True)
        if successor is not None:
            successor.down(force=True)


def test_rays_token_is_read_where_kuberays_auth_options_put_it(
    raycluster: StandInAPIServer, ray_head: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KubeRay's ``authOptions: {mode: token}`` gives the head container ``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN``
    (from its Secret), and no ``~/.ray/auth_token``: the agent, started through ``kubectl exec``, joins with that
    token; without it, Ray's refusal is said as such. The container's home is a folder of its own (this machine's
    ``~/.ray/auth_token``, which other test processes use, is left alone)."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)  # the kernel gives none: the container's is the one used
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    home = Path(tempfile.mkdtemp(prefix="jc-pod-home-"))  # short: the agent's socket is in it
    pod = raycluster.state.pods[(NAMESPACE, HEAD_POD)]
    pod.env = {"HOME": str(home)}
    with pytest.raises(jc.ClusterConnectionError, match="token"):
        _attach(ray_head)
    pod.env = {"HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    cluster = _attach(ray_head)
    try:
        said = cluster.run_cell(
            "import os\nos.environ['HOME'], os.environ['RAY_AUTH_TOKEN'] == " + repr(token), mode="driver"
        )
        assert said.result(120).value == (str(home), True)
        assert not (home / ".ray" / "auth_token").exists()
    finally:
        cluster.down(force=True)
        shutil.rmtree(home, ignore_errors=True)


def test_an_api_server_with_the_older_exec_protocol(raycluster: StandInAPIServer, ray_head: str) -> None:
    """An API server without the WebSocket protocol ``v5.channel.k8s.io`` (before Kubernetes 1.30): ``kubectl``
    falls back to SPDY/3.1 and ``v4.channel.k8s.io``. The agent is found, values go both ways, cells run, and a cut
    stream is resumed with nothing lost or repeated."""
    raycluster.state.exec_protocols = ()
    raycluster.state.protocols.clear()
    cluster = _attach(ray_head)
    try:
        assert set(raycluster.state.protocols) == {"spdy/v4.channel.k8s.io"}, raycluster.state.protocols
        assert cluster.run_cell("6 * 7").result(120).value == 42
        handle = cluster.put(b"v4" * 100_000)
        assert cluster.get(handle) == b"v4" * 100_000
        cell = cluster.run_cell(SOURCE)
        time.sleep(2)
        raycluster.stop()
        raycluster.start()
        check_exactly_once(cell, LINES)
    finally:
        cluster.down(force=True)


def test_a_head_container_without_that_python(raycluster: StandInAPIServer) -> None:
    with pytest.raises(HeadError, match="there is no Python at '/no/such/python' on the head: pass --python"):
        jc.connect(f"k8s:{NAMESPACE}/{CLUSTER}", python="/no/such/python")


def test_no_such_raycluster(kube: StandInAPIServer) -> None:
    with pytest.raises(KubeError, match=r"no RayCluster 'nope' in namespace 'ray' \(`kubectl get rayclusters -n ray`"):
        jc.connect("k8s:ray/nope")


def test_a_head_pod_still_pending_is_said_with_its_events(raycluster: StandInAPIServer, ssh_hosts: Any) -> None:
    state = raycluster.state
    state.pods[(NAMESPACE, HEAD_POD)] = _head_pod(ssh_hosts.head.netns, phase="Pending")
    message = "0/3 nodes are available: 3 Insufficient cpu."
    state.events[HEAD_POD] = [{"kind": "Event", "reason": "FailedScheduling", "message": message,
                               "involvedObject": {"kind": "Pod", "name": HEAD_POD}}]  # fmt: skip
    with pytest.raises(KubeError) as refused:
        jc.connect(f"k8s:{NAMESPACE}/{CLUSTER}")
    said = str(refused.value)
    assert f"the head pod {HEAD_POD} of RayCluster '{CLUSTER}' is not running yet (Pending)" in said, said
    assert f"FailedScheduling: {message}" in said, said


def test_exec_forbidden_names_the_permission_to_ask_for(raycluster: StandInAPIServer) -> None:
    raycluster.state.exec_forbidden.add(NAMESPACE)
    with pytest.raises(jc.ClusterConnectionError) as refused:
        jc.connect(f"k8s:{NAMESPACE}/{CLUSTER}", python=sys.executable)
    said = str(refused.value)
    assert 'cannot create resource "pods/exec"' in said, said  # kubectl's own line
    assert 'resources: ["pods/exec"], verbs: ["create", "get"]' in said and "Ray on Kubernetes" in said, said


def test_no_kubectl_says_to_install_it(kube: StandInAPIServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KubeError, match="k8s: needs `kubectl` on this machine's PATH"):
        jc.connect(f"k8s:{NAMESPACE}/{CLUSTER}")


def test_a_malformed_spec_says_what_to_give() -> None:
    with pytest.raises(ValueError, match=r"give k8s:NAMESPACE/RAYCLUSTER"):
        jc.connect("k8s:just-a-name")
