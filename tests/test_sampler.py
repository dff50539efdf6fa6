"""The agent's metrics sampler on its own: real HTTP endpoints, a fake session (no Ray needed).

What it must do besides drawing-independent parsing (``test_metrics.py``): scrape only
while a watcher's kernel is attached; send a watcher everything first and then only what
changed; tell a node that left; keep a node whose endpoint fails, marked stale; send
Ray's token where one is at hand; stop when the last watcher goes.
"""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_cluster.agent.watching._sampler import MetricsSampler

IDLE = (Path(__file__).parent / "data" / "ray_metrics_idle.txt").read_bytes()


class _Node(http.server.BaseHTTPRequestHandler):
    body = IDLE
    token: str | None = None
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def node() -> Iterator[tuple[type[_Node], int]]:
    handler = type("Node", (_Node,), {"hits": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, server.server_address[1]
    server.shutdown()
    server.server_close()


class Session:
    def __init__(self, attached: bool = True) -> None:
        self.writer: object | None = object() if attached else None


def _listing(port: int, ids: list[str]) -> list[dict[str, Any]]:
    return [
        {"NodeID": i, "Alive": True, "NodeManagerAddress": "127.0.0.1", "MetricsExportPort": port, "Resources": {}}
        for i in ids
    ]


def test_only_while_attached_and_only_what_changed(node: tuple[type[_Node], int]) -> None:
    handler, port = node
    ids = ["a", "b"]

    async def scenario() -> None:
        sampler = MetricsSampler(
            asyncio.get_running_loop(), interval=0.05, nodes_every=0, list_nodes=lambda: _listing(port, ids), budget=1
        )
        session = Session(attached=False)
        events: list[dict[str, Any]] = []
        watch = asyncio.ensure_future(sampler.watch("w1", session, lambda kind, data: events.append(data)))
        await asyncio.sleep(0.3)
        assert sampler.rounds == 0 and handler.hits == 0 and not events  # detached: nothing scraped
        session.writer = object()
        await asyncio.sleep(0.3)
        assert sampler.rounds >= 2
        first = events[0]
        assert set(first["nodes"]) == {"a", "b"} and first["nodes"]["a"]["address"] == "127.0.0.1"
        assert first["nodes"]["a"]["stale"] is None and "mem_total" in first["nodes"]["a"]
        assert len(events) >= 2 and all(e["nodes"] == {} for e in events[1:]), "an unchanged node was sent again"
        ids.remove("b")
        await asyncio.sleep(0.3)
        assert [e["left"] for e in events if e["left"]] == [["b"]] and events[-1]["nodes"] == {}
        assert sampler.unwatch("w1") and not sampler.unwatch("w1")
        await asyncio.wait_for(watch, 1)
        await asyncio.sleep(0.3)  # a scrape already on its way may still land (seen on a loaded machine)
        hits = handler.hits
        await asyncio.sleep(0.3)
        assert handler.hits == hits, "it kept scraping with no one watching"
        sampler.close()

    asyncio.run(scenario())


def test_a_failing_endpoint_keeps_its_values_marked_stale(node: tuple[type[_Node], int]) -> None:
    handler, port = node

    async def scenario() -> None:
        sampler = MetricsSampler(asyncio.get_running_loop(), timeout=0.5, list_nodes=lambda: _listing(port, ["a"]))
        nodes = await sampler.sample()
        assert nodes["a"]["stale"] is None
        handler.token = "secret"  # now it wants a token we do not have
        nodes = await sampler.sample()
        assert nodes["a"]["stale"] == "its metrics endpoint answered HTTP 401"
        assert nodes["a"]["mem_total"] > 0  # the last values stay
        sampler.close()

    asyncio.run(scenario())


def test_a_node_yet_to_report_its_resources_has_the_gcs_capacity(node: tuple[type[_Node], int]) -> None:
    """A raylet exports ``ray_resources`` only some seconds after it starts; until then its
    CPUs, GPUs and store capacity come from the node table, not 0s that draw empty bars."""
    handler, port = node
    handler.body = b"\n".join(line for line in IDLE.split(b"\n") if not line.startswith(b"ray_resources"))
    listing = _listing(port, ["a"])
    listing[0]["Resources"] = {"object_store_memory": 2.5e8, "CPU": 3.0, "GPU": 1.0}

    async def scenario() -> None:
        sampler = MetricsSampler(asyncio.get_running_loop(), list_nodes=lambda: listing)
        early = (await sampler.sample())["a"]
        assert early["store_total"] == 2.5e8
        assert early["resources"]["CPU"] == (0.0, 3.0) and early["resources"]["GPU"] == (0.0, 1.0)
        handler.body = IDLE  # once reported, the metrics' own figures are used
        reported = (await sampler.sample())["a"]
        assert reported["store_total"] > 0 and reported["store_total"] != 2.5e8
        assert reported["resources"]["CPU"][1] != 3.0 and "GPU" not in reported["resources"]
        sampler.close()

    asyncio.run(scenario())


def test_what_is_in_use_comes_from_the_gcs_resource_view_read_in_the_same_round(node: tuple[type[_Node], int]) -> None:
    """Ray's gauges of resources and store bytes lag by seconds; the GCS's view of what each node has free is
    current. A round reads it once and gives every shown node, and the cluster's totals, the same instant: in
    use plus free is the total, and the store's bytes include what objects hold now."""
    _, port = node
    listing = _listing(port, ["a", "b"])
    for entry in listing:
        entry["Resources"] = {"CPU": 2.0, "object_store_memory": 1e9, "node:127.0.0.1": 1.0}
    free = {"a": {"CPU": 0.5, "object_store_memory": 7.5e8}, "b": {"CPU": 2.0, "object_store_memory": 1e9}}

    async def scenario() -> None:
        sampler = MetricsSampler(
            asyncio.get_running_loop(), list_nodes=lambda: listing, available=lambda: free, nodes_every=0
        )
        nodes = await sampler.sample()
        assert nodes["a"]["resources"] == {"CPU": (1.5, 2.0), "object_store_memory": (2.5e8, 1e9)}
        assert (nodes["a"]["store_used"], nodes["a"]["store_total"]) == (2.5e8, 1e9)
        assert nodes["b"]["resources"]["CPU"] == (0.0, 2.0)
        assert sampler.cluster["resources"]["CPU"] == (1.5, 4.0) and sampler.cluster["store_used"] == 2.5e8
        free["a"] = {"CPU": 2.0, "object_store_memory": 1e9}  # the work ended: the next round says so
        assert (await sampler.sample())["a"]["resources"]["CPU"] == (0.0, 2.0)
        sampler.close()

    asyncio.run(scenario())


def test_rays_token_is_sent_where_one_is_at_hand(node: tuple[type[_Node], int], monkeypatch: Any) -> None:
    handler, port = node
    handler.token = "t0ken"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0ken")

    async def scenario() -> None:
        sampler = MetricsSampler(asyncio.get_running_loop(), list_nodes=lambda: _listing(port, ["a"]))
        assert (await sampler.sample())["a"]["stale"] is None
        sampler.close()

    asyncio.run(scenario())


def test_bad_extra_nodes_are_ignored_with_a_warning(monkeypatch: Any, caplog: Any) -> None:
    monkeypatch.setenv("JUPYTER_CLUSTER_METRICS_NODES", '[{"id": "x"}]')

    async def scenario() -> None:
        sampler = MetricsSampler(asyncio.get_running_loop(), list_nodes=list)
        assert await sampler.endpoints() == {}
        sampler.close()

    asyncio.run(scenario())
    assert "JUPYTER_CLUSTER_METRICS_NODES" in caplog.text


def test_a_sampler_outside_a_ray_driver_neither_starts_nor_joins_a_cluster() -> None:
    """Ray's API starts or joins a cluster on first use (``ray.init``), and a process so joined is ended by Ray when
    that cluster ends: a sampler in a process with Ray imported but not connected must not touch it."""
    code = (
        "import asyncio, ray\n"
        "from jupyter_cluster.agent.watching._sampler import MetricsSampler\n"
        "async def main():\n"
        "    sampler = MetricsSampler(asyncio.get_running_loop(), list_nodes=lambda: [])\n"
        "    own = sampler._own_node()\n"
        "    sampler.close()\n"
        "    return own\n"
        "print(asyncio.run(main()), ray.is_initialized())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "False"], done.stdout + done.stderr
