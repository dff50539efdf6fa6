"""The dashboard's figures through a real Prometheus server (Debian's ``prometheus``), and
scraping that keeps to its CPU budget as nodes grow.

Simulated nodes (:mod:`tests.prometheus`) are 127.0.0.2 and up, each serving a recorded Ray
node's metrics with this session's name and a CPU figure of its own. The first tests drive
the agent's sampler in this process against them (no Ray); the last attach a dashboard of
the shared embedded cluster to a Prometheus that reads Ray's own service discovery file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster import InputError
from jupyter_cluster.agent.watching._metrics import summarize
from jupyter_cluster.agent.watching._sampler import SHOWN, MetricsSampler

from .prometheus import DATA, PROMETHEUS, PrometheusServer, SimulatedNodes, address

SESSION = "session_2026-11-25_00-00-00_000000_1"
NODES = 40
DRAWN = ("cpu", "mem_used", "mem_total", "store", "store_used", "store_total", "resources", "tasks", "actors")

pytestmark = pytest.mark.timeout(300)


#: Each simulated node runs tasks and actors of two Ray jobs: the notebook's own (``OURS``) and another notebook's.
OURS = "01000000"
WORK = "".join(
    f'ray_{family}{{Name="{name}",State="{state}",JobId="{job}",SessionName="{SESSION}"}} {count}\n'
    for family, name, state, job, count in (
        ("tasks", "step", "RUNNING", OURS, 2),
        ("tasks", "run_map_chunk", "RUNNING", OURS, 1),
        ("tasks", "step", "RUNNING", "02000000", 3),
        ("tasks", "run_cell_task", "RUNNING", "02000000", 1),
        ("actors", "Counter", "ALIVE", "02000000", 1),
        ("actors", "ServeController", "ALIVE", "02000000", 1),
    )
)


@pytest.fixture(scope="module")
def simulated() -> Iterator[SimulatedNodes]:
    assert Path(PROMETHEUS).exists(), "no prometheus: `bash scripts/test.sh` installs Debian's package (as root)"
    nodes = SimulatedNodes(NODES, SESSION, (DATA / "ray_metrics_idle.txt").read_text() + WORK)
    yield nodes
    nodes.close()


@pytest.fixture(scope="module")
def prometheus(simulated: SimulatedNodes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), None, simulated.targets)
    server.wait_for(f'count(ray_node_cpu_utilization{{SessionName="{SESSION}"}})', NODES)
    yield server
    server.stop()


def _sampler(session: str = SESSION, **kwargs: Any) -> MetricsSampler:
    return MetricsSampler(asyncio.get_running_loop(), list_nodes=list, session_name=lambda: session, **kwargs)


def test_prometheus_sums_every_node_and_details_the_first(
    simulated: SimulatedNodes, prometheus: PrometheusServer
) -> None:
    one = summarize(simulated.text)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        sampler = _sampler()
        try:
            source = await sampler.use(prometheus.url)
            nodes = await sampler.sample()
            return source, nodes, sampler.cluster
        finally:
            sampler.close()

    source, nodes, cluster = asyncio.run(scenario())
    assert source["kind"] == "prometheus" and source["url"] == prometheus.url and source["version"].startswith("2.")
    # The first SHOWN nodes by address, numbers as numbers, each as its own scrape says.
    assert list(nodes) == [f"{host}:{simulated.port}" for host in simulated.hosts[:SHOWN]]
    for instance, node in nodes.items():
        host = instance.split(":")[0]
        assert node["address"] == host and node["stale"] is None and node["head"] is False
        assert node["cpu"] == SimulatedNodes.cpu(host)
        for field in DRAWN[1:]:
            assert node[field] == one[field], (field, node[field], one[field])
    # The cluster: every node, summed by Prometheus.
    cpus = [SimulatedNodes.cpu(host) for host in simulated.hosts]
    assert cluster["count"] == NODES
    assert cluster["cpu"] == pytest.approx(sum(cpus) / NODES)
    assert cluster["store_total"] == pytest.approx(NODES * one["store_total"])
    assert cluster["store_used"] == pytest.approx(NODES * one["store_used"])
    for kind in ("tasks", "actors"):
        assert cluster[kind] == {state: pytest.approx(NODES * n) for state, n in one[kind].items()}, kind


def test_other_jobs_work_is_counted_apart_through_prometheus_as_when_scraped(
    simulated: SimulatedNodes, prometheus: PrometheusServer
) -> None:
    """Told the notebook's own Ray job, Prometheus's sums count the other jobs' tasks and actors apart (by Ray's
    ``JobId``), as the agent's own scrape does: the same figures either way."""
    one = summarize(simulated.text, job=OURS)
    assert one["tasks"] == {"RUNNING": 2.0} and one["other_tasks"] == {"RUNNING": 4.0}

    async def both() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        sampler = _sampler(job=lambda: OURS, timeout=10.0)
        try:
            await sampler.use(prometheus.url)
            nodes = await sampler.sample()
            through = dict(sampler.cluster)
            await sampler.use(False)
            await sampler.sample()
            return nodes, through, dict(sampler.cluster)
        finally:
            sampler.close()

    monkey = pytest.MonkeyPatch()
    monkey.setenv("JUPYTER_CLUSTER_METRICS_NODES", simulated.endpoints_env())
    try:
        nodes, through, scraped = asyncio.run(both())
    finally:
        monkey.undo()
    for kind in ("tasks", "cell_tasks", "other_tasks", "actors", "other_actors", "system_actors"):
        expected = {state: pytest.approx(NODES * n) for state, n in one[kind].items()}
        assert through[kind] == expected, (kind, through[kind])
        assert scraped[kind] == expected, (kind, scraped[kind])
    for node in nodes.values():
        assert node["other_tasks"] == one["other_tasks"] and node["tasks"] == one["tasks"]


def test_found_where_rays_setting_points_once_it_has_this_sessions_nodes(prometheus: PrometheusServer) -> None:
    async def source_of(session: str) -> dict[str, Any]:
        sampler = _sampler(session, prometheus=prometheus.url)
        try:
            await sampler.sample()
            return sampler.source
        finally:
            sampler.close()

    assert asyncio.run(source_of(SESSION))["kind"] == "prometheus"
    assert asyncio.run(source_of("session_of_another_cluster"))["kind"] == "scrape"


def test_a_node_it_cannot_scrape_and_a_server_that_stops(
    simulated: SimulatedNodes, prometheus: PrometheusServer
) -> None:
    failing = address(3)
    instance = f"{failing}:{simulated.port}"

    async def scenario() -> None:
        sampler = _sampler()
        try:
            await sampler.use(prometheus.url)
            assert all(n["stale"] is None for n in (await sampler.sample()).values())
            simulated.failing.add(failing)
            prometheus.wait_for(f'up{{instance="{instance}"}}', 0)
            nodes = await sampler.sample()
            assert nodes[instance]["stale"] == f"Prometheus at {prometheus.url} could not scrape it last time"
            assert nodes[instance]["cpu"] == SimulatedNodes.cpu(failing), "its last values stay"
            assert sum(1 for n in nodes.values() if n["stale"]) == 1
            simulated.failing.clear()
            prometheus.wait_for(f'up{{instance="{instance}"}}', 1)

            prometheus.stop()  # the server itself: every node keeps its values, marked stale, and the source says why
            before = sampler.cluster
            nodes = await sampler.sample()
            assert sampler.source["kind"] == "prometheus" and "did not answer" in sampler.source["error"]
            assert all(n["stale"] and "did not answer" in n["stale"] for n in nodes.values())
            assert nodes[instance]["cpu"] == SimulatedNodes.cpu(failing) and sampler.cluster == before
            prometheus.start()
            prometheus.wait_for('count(up{job="simulated"} == 1)', NODES)
            nodes = await sampler.sample()
            assert "error" not in sampler.source and all(n["stale"] is None for n in nodes.values())
        finally:
            simulated.failing.clear()
            sampler.close()

    asyncio.run(scenario())


def test_scraping_many_nodes_is_spaced_out_to_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Prometheus the agent scrapes each node; the more nodes, the further apart the rounds
    (what one round cost / the budget), and the source says how often. A few nodes: every interval."""
    many = SimulatedNodes(400, SESSION)

    async def every(nodes: SimulatedNodes, count: int) -> tuple[float, dict[str, Any]]:
        monkeypatch.setenv("JUPYTER_CLUSTER_METRICS_NODES", nodes.endpoints_env() if count else "[]")
        sampler = _sampler(interval=0.5, timeout=5.0, prometheus="http://127.0.0.1:1")
        try:
            for _ in range(4):
                await sampler.sample()
            return sampler.every, sampler.source
        finally:
            sampler.close()

    try:
        spaced, source = asyncio.run(every(many, 400))
        assert len(many.hosts) == 400 and many.hits >= 1600
    finally:
        many.close()
    assert spaced > 1.0 and source == {"kind": "scrape", "every": round(spaced, 2)}, (spaced, source)
    few = SimulatedNodes(2, SESSION)
    try:
        assert asyncio.run(every(few, 2))[0] == 0.5
    finally:
        few.close()


def test_a_new_source_starts_at_the_interval(monkeypatch: pytest.MonkeyPatch, prometheus: PrometheusServer) -> None:
    """Rounds spaced out for many scraped nodes do not slow the source that replaces them: Prometheus answers
    every interval at once (seen: 17.6 s apart at first, after scraping 1,000 nodes every 25 s)."""
    many = SimulatedNodes(400, SESSION)

    async def switch() -> tuple[float, float, dict[str, Any]]:
        monkeypatch.setenv("JUPYTER_CLUSTER_METRICS_NODES", many.endpoints_env())
        sampler = _sampler(interval=0.5, timeout=5.0, prometheus="http://127.0.0.1:1")
        try:
            for _ in range(3):
                await sampler.sample()
            spaced = sampler.every
            await sampler.use(prometheus.url)
            await sampler.sample()
            return spaced, sampler.every, sampler.source
        finally:
            sampler.close()

    try:
        spaced, after, source = asyncio.run(switch())
    finally:
        many.close()
    assert spaced > 1.0, spaced
    assert after < 1.0 and source["kind"] == "prometheus" and source["every"] == round(after, 2), (after, source)


def test_a_round_in_flight_when_the_source_changes(
    monkeypatch: pytest.MonkeyPatch, prometheus: PrometheusServer
) -> None:
    """A dashboard switched to Prometheus while a slow round of scraped nodes runs: that round does not pace
    the new source, and the new source's first round comes at once, not after the old spacing (seen: rounds
    18 s apart through Prometheus at 1,000 nodes, read just after the switch)."""
    many = SimulatedNodes(400, SESSION)

    async def switch() -> tuple[float, float, float]:
        monkeypatch.setenv("JUPYTER_CLUSTER_METRICS_NODES", many.endpoints_env())
        # A tiny budget spaces the scraped rounds far apart (up to MAX_EVERY).
        sampler = _sampler(interval=0.5, timeout=5.0, prometheus="http://127.0.0.1:1", budget=0.0005)
        events: list[dict[str, Any]] = []
        try:
            await sampler.sample()
            spaced = sampler.every
            hits = many.hits
            watch = asyncio.ensure_future(
                sampler.watch("w", types.SimpleNamespace(writer=object()), lambda kind, data: events.append(data))
            )
            while many.hits == hits:  # a scraped round is on its way
                await asyncio.sleep(0.01)
            switched = time.monotonic()
            await sampler.use(prometheus.url)
            while not any(e.get("source", {}).get("kind") == "prometheus" for e in events):
                await asyncio.sleep(0.05)
                assert time.monotonic() - switched < spaced / 2, "the new source waited out the old spacing"
            took = time.monotonic() - switched
            sampler.unwatch("w")
            await asyncio.wait_for(watch, 5)
            return spaced, took, sampler.every
        finally:
            sampler.close()

    try:
        spaced, took, every = asyncio.run(switch())
    finally:
        many.close()
    assert spaced >= 20.0, spaced
    # The scraped round in flight at the switch is not counted: only Prometheus's rounds pace it. (Those are paced
    # by the same tiny budget, so how far depends on the machine's load: the old spacing is what must not carry.)
    assert took < 10.0 and every < spaced / 2, (took, spaced, every)


# ---------------------------------------------------------------------- through a notebook's cluster


@pytest.fixture
def ray_prometheus(
    cluster: jc.Cluster, simulated: SimulatedNodes, tmp_path: Path
) -> Iterator[tuple[PrometheusServer, str]]:
    """A Prometheus scraping the shared cluster's node and the simulated nodes (relabelled with this Ray
    session's name). Ray writes its service discovery file from its dashboard, which the embedded cluster
    does not run: the node is a static target, as Ray's docs also allow."""
    out = cluster.run_cell(
        "node = ray._private.worker.global_worker.node\n"
        "session = node.session_name\n"
        "head = [f\"{n['NodeManagerAddress']}:{n['MetricsExportPort']}\" for n in ray.nodes() if n['Alive']]\n",
        mode="driver",
        out=["session", "head"],
    ).result()
    session, head = out.outputs["session"], out.outputs["head"]
    ours = SimulatedNodes(NODES, session)
    server = PrometheusServer(tmp_path / "prometheus", None, head + ours.targets)
    try:
        server.wait_for(f'count(ray_node_cpu_utilization{{SessionName="{session}"}})', NODES + 1)
        yield server, session
    finally:
        with contextlib.suppress(Exception):
            cluster.metrics_source(None)  # the agent's other dashboards scrape again
        server.stop()
        ours.close()


@pytest.mark.ray
def test_a_dashboard_through_prometheus(cluster: jc.Cluster, ray_prometheus: tuple[PrometheusServer, str]) -> None:
    server, _ = ray_prometheus
    dash = jc.dashboard(prometheus=server.url)
    try:
        deadline = time.monotonic() + 30
        while dash.feed.count != NODES + 1 or len(dash.feed.nodes) != SHOWN:
            assert time.monotonic() < deadline, (dash.feed.count, len(dash.feed.nodes))
            time.sleep(0.2)
        heads = [n for n in dash.feed.nodes.values() if n.get("head")]
        assert len(heads) == 1 and heads[0]["store_total"] > 0, "the head is drawn, with its store"
        simulated = sorted(n["address"] for n in dash.feed.nodes.values() if not n.get("head"))
        assert simulated == sorted(address(i) for i in range(SHOWN - 1))
        assert dash.feed.source["kind"] == "prometheus" and dash.feed.source["url"] == server.url, dash.feed.source
        assert "error" not in dash.feed.source, dash.feed.source
        deadline = time.monotonic() + 10  # the header is redrawn on the dashboard's next tick after the feed's
        while "from Prometheus" not in dash.header.value or f"{NODES + 1} nodes" not in dash.header.value:
            assert time.monotonic() < deadline, dash.header.value
            time.sleep(0.2)
        assert f"{NODES + 1} nodes ({SHOWN} drawn" in dash.header.value, dash.header.value
        assert f"{NODES + 1} nodes" in dash.snapshot()
        totals = dash.feed.totals()
        assert totals["count"] == NODES + 1 and totals["store_total"] > heads[0]["store_total"]
    finally:
        dash.close()


@pytest.mark.ray
def test_a_wrong_prometheus_is_a_clear_error_and_loses_nothing(cluster: jc.Cluster, shell: Any) -> None:
    cluster.run_cell("kept = 41", mode="driver").result()
    cases = [
        ("http://127.0.0.1:1", "Prometheus at http://127.0.0.1:1 did not answer"),
        ("http://127.0.0.1:1", "The URL is read on the head, where the agent runs"),
        ("localhost:9090", "is no URL"),
        (5, "prometheus must be a URL"),
        (True, "prometheus must be a URL"),
    ]
    for given, said in cases:
        with pytest.raises(InputError) as caught:
            jc.dashboard(prometheus=given)
        assert said in str(caught.value), str(caught.value)
    assert cluster.run_cell("kept += 1", mode="driver", out=["kept"]).result().outputs == {"kept": 42}
    magic = shell.run_cell("%cluster dashboard --prometheus http://127.0.0.1:1")
    assert isinstance(magic.error_in_exec, InputError) and "did not answer" in str(magic.error_in_exec)
    assert cluster.metrics_source(False)["kind"] == "scrape"
    assert cluster.metrics_source(None)["kind"] == "scrape"
