"""Sampling every node's metrics for the dashboards that watch them, and only then.

A kernel that shows a dashboard sends one long-lived ``watch_metrics`` request; until it
sends ``unwatch_metrics`` (or its session ends), each sample that changed something is
one event of that request: ``{"t": time, "nodes": {node_id: what changed}, "left": [...]}``.
The first event a watcher gets holds every node whole, each later one only the fields
that changed since the last it got (:func:`._metrics.changes`): on an idle cluster, the
time alone, some 100 bytes a second. Events travel through the session like a cell's output:
they survive a dropped link. While no watcher's kernel is attached, nothing is scraped.

Each node is scraped over HTTP on its ``MetricsExportPort`` (in a thread pool, so the
agent's event loop never waits on a slow node). A node whose endpoint does not answer,
or answers with an error, keeps its last values and is marked ``stale`` with the reason.
The endpoint served without a token on a Ray 2.60 cluster started with token
authentication; where a token is at hand it is sent anyway (``Authorization: Bearer``),
as Ray's own clients do, so an endpoint that asks for it gets it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._metrics import LineCache, NodeSample, changes, keep_drawn, summarize

log = logging.getLogger("jupyter_cluster.agent")

#: Extra endpoints to scrape as if they were nodes: a JSON list of
#: ``{"id", "address", "port"}`` (benchmarks and tests simulate nodes with it).
EXTRA_NODES_ENV = "JUPYTER_CLUSTER_METRICS_NODES"


@dataclass(frozen=True)
class Endpoint:
    node_id: str
    address: str
    port: int
    head: bool = False
    #: The node's resources (CPU, GPU, object store...) as the GCS knows them, ``(name,
    #: total)``: a raylet reports its ``ray_resources`` metrics only some seconds after it
    #: starts, so a first scrape may lack them.
    resources: tuple[tuple[str, float], ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"


@dataclass
class Watcher:
    """One dashboard's subscription: what it was last sent, node by node."""

    watch_id: str
    session: Any
    emit: Callable[..., None]
    sent: dict[str, NodeSample] = field(default_factory=dict)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def attached(self) -> bool:
        return getattr(self.session, "writer", None) is not None

    def delta(self, nodes: dict[str, NodeSample], now: float) -> dict[str, Any]:
        """What changed since this watcher's last event (when nothing did, just the time:
        the dashboard's clock goes on)."""
        changed = {}
        for node_id, sample in nodes.items():
            diff = changes(self.sent.get(node_id), sample)
            if diff:
                changed[node_id] = diff
        left = sorted(set(self.sent) - set(nodes))
        for node_id in left:
            del self.sent[node_id]
        self.sent.update({node_id: nodes[node_id] for node_id in changed})
        return {"t": now, "nodes": changed, "left": left}


def _token() -> str | None:
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def scrape(endpoint: Endpoint, timeout: float, token: str | None = None) -> str:
    """The drawn families of one node's metrics text (blocking; raises on any failure)."""
    request = urllib.request.Request(endpoint.url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        text = answer.read().decode("utf-8", errors="replace")
    return keep_drawn(text)


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"its metrics endpoint answered HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    if isinstance(exc, TimeoutError | concurrent.futures.TimeoutError):
        return "its metrics endpoint did not answer in time"
    return f"its metrics endpoint failed ({type(exc).__name__}: {exc})"


class MetricsSampler:
    """Scrapes every node once per ``interval`` while some attached watcher wants it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float = 1.0,
        timeout: float = 0.8,
        nodes_every: float = 5.0,
        list_nodes: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.loop = loop
        self.interval = interval
        self.timeout = timeout
        self.nodes_every = nodes_every
        self.watchers: dict[str, Watcher] = {}
        #: Each node's latest state, as sent to watchers.
        self.nodes: dict[str, NodeSample] = {}
        #: Scrapes made, for tests and benchmarks.
        self.rounds = 0
        self._list_nodes = list_nodes or _ray_nodes
        self._endpoints: dict[str, Endpoint] = {}
        self._listed_at = 0.0
        self._extra = _extra_endpoints()
        self._token = _token()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="metrics")
        #: Each node's last drawn text and what it says: Ray refreshes most values every few
        #: seconds, so most scrapes find the same text, and need no parsing.
        self._parsed: dict[str, tuple[str, NodeSample]] = {}
        self._lines: dict[str, LineCache] = {}
        self._task: asyncio.Task[None] | None = None

    async def watch(self, watch_id: str, session: Any, emit: Callable[..., None]) -> None:
        """Send ``emit`` this cluster's metrics until :meth:`unwatch` (returns then)."""
        watcher = self.watchers[watch_id] = Watcher(watch_id, session, emit)
        if self.nodes and watcher.attached:  # a second dashboard starts from what is known
            self._send(watcher, time.time())
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        await watcher.stopped.wait()

    def unwatch(self, watch_id: str) -> bool:
        watcher = self.watchers.pop(watch_id, None)
        if watcher is None:
            return False
        watcher.stopped.set()
        return True

    def close(self) -> None:
        for watch_id in list(self.watchers):
            self.unwatch(watch_id)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        while self.watchers:
            started = time.monotonic()
            if any(w.attached for w in self.watchers.values()):
                try:
                    await self.sample()
                except Exception:
                    log.exception("sampling metrics failed")
                now = time.time()
                for watcher in list(self.watchers.values()):
                    if watcher.attached:
                        self._send(watcher, now)
            await asyncio.sleep(max(0.05, self.interval - (time.monotonic() - started)))

    def _send(self, watcher: Watcher, now: float) -> None:
        watcher.emit("metrics", watcher.delta(self.nodes, now))

    def _read(self, node_id: str, endpoint: Endpoint) -> NodeSample:
        text = scrape(endpoint, self.timeout, self._token)
        last = self._parsed.get(node_id)
        if last is not None and last[0] == text:
            return dict(last[1])
        sample = summarize(text, kept=True, cache=self._lines.setdefault(node_id, LineCache()))
        self._parsed[node_id] = (text, sample)
        return dict(sample)

    async def endpoints(self) -> dict[str, Endpoint]:
        """The nodes to scrape: Ray's live nodes (listed again every ``nodes_every`` s) and any extra."""
        if time.monotonic() - self._listed_at > self.nodes_every:
            listed = await self.loop.run_in_executor(self._pool, self._list_nodes)
            self._listed_at = time.monotonic()
            found = {}
            for node in listed:
                port = node.get("MetricsExportPort")
                if node.get("Alive") and port:
                    resources = node.get("Resources", {})
                    head = "node:__internal_head__" in resources
                    totals = tuple((str(name), float(total)) for name, total in resources.items())
                    address = node["NodeManagerAddress"]
                    found[node["NodeID"]] = Endpoint(node["NodeID"], address, int(port), head, totals)
            self._endpoints = found
        return {**self._endpoints, **self._extra}

    async def sample(self) -> dict[str, NodeSample]:
        """Scrape every node at once; a node that fails keeps its last values, marked stale."""
        endpoints = await self.endpoints()
        scrapes = {
            node_id: self.loop.run_in_executor(self._pool, self._read, node_id, endpoint)
            for node_id, endpoint in endpoints.items()
        }
        nodes: dict[str, NodeSample] = {}
        for node_id, future in scrapes.items():
            endpoint = endpoints[node_id]
            try:
                sample = await future
                sample["stale"] = None
            except Exception as exc:
                sample = dict(self.nodes.get(node_id) or {"store": {}, "gpus": {}, "tasks": {}, "actors": {}})
                sample["stale"] = _why(exc)
            sample.update(address=endpoint.address, head=endpoint.head)
            if endpoint.resources and not sample.get("resources"):  # not reported yet: the GCS's totals
                sample["resources"] = {name: (0.0, total) for name, total in endpoint.resources}
                sample["store_total"] = dict(endpoint.resources).get("object_store_memory", 0.0)
            nodes[node_id] = sample
        self.nodes = nodes
        for node_id in set(self._parsed) - set(nodes):
            del self._parsed[node_id]
            self._lines.pop(node_id, None)
        self.rounds += 1
        return nodes


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())


def _extra_endpoints() -> dict[str, Endpoint]:
    text = os.environ.get(EXTRA_NODES_ENV, "").strip()
    if not text:
        return {}
    try:
        listed = json.loads(text)
        return {str(e["id"]): Endpoint(str(e["id"]), str(e["address"]), int(e["port"])) for e in listed}
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s (%s): expected a JSON list of {id, address, port}", EXTRA_NODES_ENV, exc)
        return {}


__all__ = ["EXTRA_NODES_ENV", "Endpoint", "MetricsSampler", "Watcher", "scrape"]
