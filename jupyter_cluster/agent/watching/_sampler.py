"""Sampling the cluster's metrics for the dashboards that watch them, and only then.

A kernel that shows a dashboard sends one long-lived ``watch_metrics`` request; until it
sends ``unwatch_metrics`` (or its session ends), each sample is one event of that request:
``{"t": time, "nodes": {node_id: what changed}, "left": [...], "cluster": totals,
"source": how}``. ``nodes`` holds the nodes shown (at most :data:`SHOWN`: the head, then
by address), the first event each whole, each later one only the fields that changed
since the last it got (:func:`._metrics.changes`); ``cluster`` is the whole cluster as one
(:func:`._metrics.totals` and ``count``, its nodes), a few hundred bytes whatever the node
count; ``source`` says where the figures come from, sent when it changed. Events travel
through the session like a cell's output: they survive a dropped link. While no watcher's
kernel is attached, nothing is sampled.

The figures come from one of two places (:meth:`MetricsSampler.use`):

- a Prometheus server that scrapes the cluster (:mod:`._prometheus`), given by the user or
  found where Ray's own setting (``RAY_PROMETHEUS_HOST``, default ``http://localhost:9090``)
  points, when it has this session's nodes: two queries a sample, whatever the node count;
- otherwise each node's own endpoint, scraped over HTTP on its ``MetricsExportPort`` in a
  thread pool. A scrape costs CPU in proportion to the nodes, so the sampler measures the
  CPU time each round took and spaces rounds so that scraping stays under :data:`BUDGET`
  of a core (1 s apart on a small cluster; some 25 s at a thousand nodes), which the
  ``source`` says.

Each round runs on a thread of its own: the event loop only hands the few shown nodes'
changes to the watchers. A node whose endpoint does not answer, or answers with an error,
keeps its last values and is marked ``stale`` with the reason (through Prometheus: its
``up`` is 0, or Prometheus itself did not answer). The endpoints served without a token on
a Ray 2.60 cluster started with token authentication; where a token is at hand it is sent
anyway (``Authorization: Bearer``), as Ray's own clients do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._sizing import own_memory
from ._metrics import LineCache, NodeSample, changes, keep_drawn, summarize, totals
from ._prometheus import DEFAULT_PROMETHEUS, PROMETHEUS_ENV, Prometheus, PrometheusError

log = logging.getLogger("jupyter_cluster.agent")

#: Extra endpoints to scrape as if they were nodes: a JSON list of
#: ``{"id", "address", "port"}`` (benchmarks and tests simulate nodes with it).
EXTRA_NODES_ENV = "JUPYTER_CLUSTER_METRICS_NODES"

#: The nodes a dashboard draws one by one (the cluster's totals count them all).
SHOWN = 32
#: The share of one core that a round's own work may take; rounds are spaced to keep to it. The rest of what a
#: dashboard costs the agent (sending what changed) comes on top: with 0.03 here, scraping 100 nodes took the
#: agent 3.8 % of a core against 0.7 % idle; 0.025 keeps the whole under 3 %.
BUDGET = 0.025
#: The longest wait between two rounds.
MAX_EVERY = 60.0
#: How often, while scraping, to look again for a Prometheus server where Ray's setting points.
PROBE_EVERY = 60.0


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
    source: dict[str, Any] = field(default_factory=dict)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def attached(self) -> bool:
        return getattr(self.session, "writer", None) is not None

    def delta(
        self, nodes: dict[str, NodeSample], now: float, cluster: NodeSample, source: dict[str, Any]
    ) -> dict[str, Any]:
        """What changed since this watcher's last event (when nothing did, just the time and the
        cluster's totals: the dashboard's clock goes on)."""
        changed = {}
        for node_id, sample in nodes.items():
            diff = changes(self.sent.get(node_id), sample)
            if diff:
                changed[node_id] = diff
        left = sorted(set(self.sent) - set(nodes))
        for node_id in left:
            del self.sent[node_id]
        self.sent.update({node_id: nodes[node_id] for node_id in changed})
        event = {"t": now, "nodes": changed, "left": left, "cluster": cluster}
        if source != self.source:
            event["source"] = self.source = source
        return event


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
    """Samples the cluster once per ``interval`` (or less often, see :data:`BUDGET`) while some
    attached watcher wants it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval: float = 1.0,
        timeout: float = 0.8,
        nodes_every: float = 5.0,
        list_nodes: Callable[[], list[dict[str, Any]]] | None = None,
        session_name: Callable[[], str] | None = None,
        available: Callable[[], dict[str, dict[str, float]]] | None = None,
        prometheus: str | None = None,
        budget: float = BUDGET,
        job: Callable[[], str | None] | None = None,
    ) -> None:
        self.loop = loop
        self.interval = interval
        self.budget = budget
        self.timeout = timeout
        self.nodes_every = nodes_every
        self.watchers: dict[str, Watcher] = {}
        #: The shown nodes' latest state, as sent to watchers, and the cluster's totals.
        self.nodes: dict[str, NodeSample] = {}
        self.cluster: NodeSample = {}
        #: Where the figures come from, and how often (the events' ``source``).
        self.source: dict[str, Any] = {"kind": "scrape", "every": interval}
        #: Seconds between rounds now (``interval``, or more to keep within :data:`BUDGET`).
        self.every = interval
        #: Rounds made, for tests and benchmarks.
        self.rounds = 0
        self._list_nodes = list_nodes or _ray_nodes
        self._available = available or _ray_available
        self._session_name = session_name or _ray_session_name
        #: The notebook's own Ray job (hex), whose work is told from other jobs' (None: not told apart).
        self._job = job or (lambda: None)
        #: Where to look for a Prometheus server when none was given (Ray's own setting).
        self._default_prometheus = prometheus or os.environ.get(PROMETHEUS_ENV) or DEFAULT_PROMETHEUS
        self._prometheus: Prometheus | None = None
        self._chosen = False  # the user chose the source (no looking for Prometheus then)
        self._probed_at = -PROBE_EVERY
        self._instances: list[str] = []
        self._instances_at = 0.0
        self._instances_error: PrometheusError | None = None
        self._endpoints: dict[str, Endpoint] = {}
        #: The whole cluster's resources, (in use, total) by name, as the last round's read of the GCS found them.
        self.gcs_resources: dict[str, tuple[float, float]] = {}
        self._all: dict[str, NodeSample] = {}
        self._listed_at = -nodes_every - 1.0
        self._cost = 0.0
        #: Counts the sources used: a round paces the rounds after it only if the source did not change meanwhile.
        self._source_id = 0
        self._changed = asyncio.Event()
        self._extra = _extra_endpoints()
        self._token = _token()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="metrics")
        #: Rounds run here, one at a time, whoever asks (the watchers' loop, ``%cluster status``).
        self._rounds = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-round")
        self._round_lock = threading.Lock()
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
        self._rounds.shutdown(wait=False, cancel_futures=True)

    async def use(self, prometheus: str | bool | None) -> dict[str, Any]:
        """Where the figures come from: a Prometheus server's URL (checked now: raises
        :class:`PrometheusError` when it does not answer), ``False`` for the nodes' own
        endpoints, ``None`` to look for a server where Ray's setting points (the default)."""
        if isinstance(prometheus, str):
            session = await self.loop.run_in_executor(self._pool, self._session_name)
            server = Prometheus(prometheus, session, job=self._job())
            version = await self.loop.run_in_executor(self._pool, server.check)
            self._prometheus, self._chosen = server, True
            self._instances = []
            self.source = {"kind": "prometheus", "url": server.url, "version": version, "every": self.interval}
        else:
            self._prometheus, self._chosen = None, prometheus is False
            self._probed_at = -PROBE_EVERY
            self.source = {"kind": "scrape", "every": self.interval}
        # Another source, another cost: the pace of the last one's rounds does not carry over (rounds of a thousand
        # nodes scraped, 25 s apart, kept a Prometheus that answers at once as slow for minutes), nor does that of
        # a round of the last source still running now.
        self._cost, self.every = 0.0, self.interval
        self._source_id += 1
        self._changed.set()
        return dict(self.source)

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
            try:  # until the next round is due, or the source changes (its first round comes at once)
                await asyncio.wait_for(self._changed.wait(), max(0.05, self.every - (time.monotonic() - started)))
            except asyncio.TimeoutError:
                pass
            self._changed.clear()

    def _send(self, watcher: Watcher, now: float) -> None:
        watcher.emit("metrics", watcher.delta(self.nodes, now, self.cluster, self.source))

    async def sample(self) -> dict[str, NodeSample]:
        """One round (on the rounds' thread): the shown nodes' state, also kept in ``nodes``."""
        self.nodes, self.cluster, self.source = await self.loop.run_in_executor(self._rounds, self._round)
        self.rounds += 1
        return self.nodes

    async def endpoints(self) -> dict[str, Endpoint]:
        """The nodes to scrape: Ray's live nodes (listed again every ``nodes_every`` s) and any extra."""
        return await self.loop.run_in_executor(self._rounds, self._current_endpoints)

    # ------------------------------------------------------------------ a round (blocking, off the loop)
    def _round(self) -> tuple[dict[str, NodeSample], NodeSample, dict[str, Any]]:
        with self._round_lock:
            source_now = self._source_id
            # Not counted in a round's cost: looking for Prometheus (at most once a minute, a request that fails at
            # once) and listing the nodes (every ``nodes_every`` s, not every round: at a thousand nodes, the list
            # costs more than a round through Prometheus, and would space every round by it).
            self._look_for_prometheus()
            endpoints = self._current_endpoints()
            server = self._prometheus
            if server is not None:
                self._list_instances(server)
            started, spent = time.thread_time(), 0.0
            if server is not None:
                nodes, cluster, source = self._from_prometheus(server, endpoints)
            else:
                nodes, cluster, spent = self._scrape(endpoints)
                source = {"kind": "scrape"}
            self._overlay_gcs(nodes, cluster, endpoints)
            if source_now == self._source_id:  # a round of the source just replaced does not pace the new one
                self._pace(time.thread_time() - started + spent)
            return nodes, cluster, {**source, "every": round(self.every, 2)}

    def _overlay_gcs(self, nodes: dict[str, NodeSample], cluster: NodeSample, endpoints: dict[str, Endpoint]) -> None:
        """The logical resources in use and the object store's bytes, from the GCS's resource view read now.

        Ray's own ``ray_resources`` and object-store gauges are exported every few seconds, so beside the cells'
        own counts (exact, at once) they lag; the GCS's view of what each node has free is current within half a
        second, the store's bytes the notebook's values hold included. It replaces them on the shown nodes and
        in the cluster's totals (all nodes); the host's load (CPU %, memory, GPUs)
        stays Ray's metrics'. One request a round, whatever the node count. Nodes the GCS does not list (extra
        endpoints of a benchmark) keep their metrics."""
        self.gcs_resources = {}  # none but this round's
        try:
            free = self._available()
        except Exception:
            log.debug("no resource view from the GCS this round", exc_info=True)
            return
        if not free:
            return
        summed: dict[str, tuple[float, float]] = {}
        for node_id, endpoint in endpoints.items():
            if node_id not in free or not endpoint.resources:
                continue
            view = {
                name: (max(0.0, total - free[node_id].get(name, 0.0)), total)
                for name, total in endpoint.resources
                if not name.startswith("node:")
            }
            for name, (used, total) in view.items():
                before = summed.get(name, (0.0, 0.0))
                summed[name] = (before[0] + used, before[1] + total)
            sample = nodes.get(node_id)
            if sample is not None:
                sample["resources"] = view
                if "object_store_memory" in view:
                    sample["store_used"], sample["store_total"] = view["object_store_memory"]
        self.gcs_resources = summed
        # The totals too, where the GCS lists every node they count (not where a benchmark's simulated nodes, which
        # only the metrics know, are among them).
        if summed and len(free) >= int(cluster.get("count", 0)):
            cluster["resources"] = summed
            if "object_store_memory" in summed:
                cluster["store_used"], cluster["store_total"] = summed["object_store_memory"]

    def _pace(self, cost: float) -> None:
        """Space rounds so that they take at most ``budget`` of a core (by a moving average of their CPU
        time, which starts from none: a first round, with nothing parsed yet, costs the most)."""
        self._cost = 0.7 * self._cost + 0.3 * cost
        self.every = min(MAX_EVERY, max(self.interval, self._cost / self.budget))

    def _current_endpoints(self) -> dict[str, Endpoint]:
        if time.monotonic() - self._listed_at > self.nodes_every:
            listed = self._list_nodes()
            self._listed_at = time.monotonic()
            found = {}
            for node in listed:
                port = node.get("MetricsExportPort")
                if node.get("Alive") and port:
                    resources = node.get("Resources", {})
                    head = "node:__internal_head__" in resources
                    totals_ = tuple((str(name), float(total)) for name, total in resources.items())
                    address = node["NodeManagerAddress"]
                    found[node["NodeID"]] = Endpoint(node["NodeID"], address, int(port), head, totals_)
            self._endpoints = found
        return {**self._endpoints, **self._extra}

    def _look_for_prometheus(self) -> None:
        """Where the user chose nothing: use the server Ray's setting names once it has this session's nodes."""
        if self._chosen or self._prometheus is not None or time.monotonic() - self._probed_at < PROBE_EVERY:
            return
        self._probed_at = time.monotonic()
        try:
            server = Prometheus(self._default_prometheus, self._session_name(), timeout=1.0, job=self._job())
            if server.covers() > 0:
                self._prometheus = server
                log.info("metrics from %s, which scrapes this cluster", server.url)
        except Exception as exc:  # none there: scrape
            log.debug("no Prometheus at %s: %s", self._default_prometheus, exc)

    def _scrape(self, endpoints: dict[str, Endpoint]) -> tuple[dict[str, NodeSample], NodeSample, float]:
        """Scrape every node at once; a node that fails keeps its last values, marked stale."""
        futures = {node_id: self._pool.submit(self._read, node_id, e) for node_id, e in endpoints.items()}
        everyone: dict[str, NodeSample] = {}
        spent = 0.0
        for node_id, future in futures.items():
            endpoint = endpoints[node_id]
            try:
                sample, cpu = future.result()
                spent += cpu
                sample["stale"] = None
            except Exception as exc:
                sample = dict(self._all.get(node_id) or _empty())
                sample["stale"] = _why(exc)
            sample.update(address=endpoint.address, head=endpoint.head)
            _with_capacity(sample, endpoint)
            if node_id == self._own_node():
                own_memory(sample)
            everyone[node_id] = sample
        self._all = everyone
        for node_id in set(self._parsed) - set(everyone):
            del self._parsed[node_id]
            self._lines.pop(node_id, None)
        cluster = totals(everyone.values())
        cluster["count"] = len(everyone)
        order = sorted(everyone, key=lambda i: _order(bool(everyone[i].get("head")), str(everyone[i]["address"]), i))
        return {node_id: everyone[node_id] for node_id in order[:SHOWN]}, cluster, spent

    def _own_node(self) -> str | None:
        """The node the agent runs on (its memory is read from its own cgroup where Ray read another)."""
        if not hasattr(self, "_own"):
            # Not `import ray` and its runtime context where this process is no driver: Ray would start or join a
            # cluster for it (ray.init on first use), and exit this process when that cluster ends.
            ray: Any = sys.modules.get("ray")
            self._own: str | None = None
            if ray is not None and ray.is_initialized():
                try:
                    self._own = ray.get_runtime_context().get_node_id()
                except Exception:
                    self._own = None
        return self._own

    def _read(self, node_id: str, endpoint: Endpoint) -> tuple[NodeSample, float]:
        started = time.thread_time()
        text = scrape(endpoint, self.timeout, self._token)
        last = self._parsed.get(node_id)
        if last is not None and last[0] == text:
            return dict(last[1]), time.thread_time() - started
        sample = summarize(text, kept=True, cache=self._lines.setdefault(node_id, LineCache()), job=self._job())
        self._parsed[node_id] = (text, sample)
        return dict(sample), time.thread_time() - started

    def _list_instances(self, server: Prometheus) -> None:
        """The nodes Prometheus scrapes, listed again every ``nodes_every`` s (a failure is the round's to say)."""
        self._instances_error = None
        if not self._instances or time.monotonic() - self._instances_at > self.nodes_every:
            try:
                self._instances = server.instances()
                self._instances_at = time.monotonic()
            except PrometheusError as exc:
                self._instances_error = exc

    def _from_prometheus(
        self, server: Prometheus, endpoints: dict[str, Endpoint]
    ) -> tuple[dict[str, NodeSample], NodeSample, dict[str, Any]]:
        source: dict[str, Any] = {"kind": "prometheus", "url": server.url}
        by_instance = {f"{e.address}:{e.port}": e for e in endpoints.values()}
        try:
            if self._instances_error is not None:
                raise self._instances_error
            order = sorted(
                self._instances,
                key=lambda i: _order(bool(by_instance.get(i) and by_instance[i].head), i.rsplit(":", 1)[0], i),
            )
            found = server.nodes(order[:SHOWN])
            cluster = server.totals()
        except PrometheusError as exc:
            source["error"] = str(exc)
            if not self._chosen:  # found, not chosen: back to scraping until it is there again
                self._prometheus = None
                log.warning("%s; scraping the nodes instead", exc)
            stale = {node_id: {**node, "stale": str(exc)} for node_id, node in self.nodes.items()}
            return stale, self.cluster, source
        if cluster.get("count", 0) == 0:
            source["error"] = (
                f"Prometheus at {server.url} has no metrics of this Ray session ({server.session}) yet: "
                "its scrape configuration should read Ray's service discovery file "
                "(prom_metrics_service_discovery.json in Ray's temporary folder) or list each node's metrics port"
            )
        nodes = {}
        for instance, sample in found.items():
            endpoint = by_instance.get(instance)
            node_id = endpoint.node_id if endpoint is not None else instance
            last = self.nodes.get(node_id)
            if sample.get("stale") and last is not None:  # Prometheus has no values of it now: its last ones
                sample = {**last, "stale": sample["stale"]}
            sample.setdefault("stale", None)
            if endpoint is not None:
                sample.update(address=endpoint.address, head=endpoint.head)
                _with_capacity(sample, endpoint)
            else:  # a node Ray's list does not have (yet): its address is what Prometheus scrapes
                sample.update(address=instance.rsplit(":", 1)[0], head=False)
            nodes[node_id] = sample
        return nodes, cluster, source


def _empty() -> NodeSample:
    return {"store": {}, "gpus": {}, "tasks": {}, "actors": {}}


def _with_capacity(sample: NodeSample, endpoint: Endpoint) -> None:
    """A node yet to report its resources: the GCS's totals (a raylet reports them some seconds after it starts)."""
    if endpoint.resources and not sample.get("resources"):
        sample["resources"] = {name: (0.0, total) for name, total in endpoint.resources}
        sample["store_total"] = dict(endpoint.resources).get("object_store_memory", 0.0)


def _order(head: bool, address: str, node_id: str) -> tuple[bool, list[Any], str]:
    """The head first, then by address, numbers as numbers (10.0.0.9 before 10.0.0.10)."""
    return (not head, [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", address)], node_id)


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())


def _ray_available() -> dict[str, dict[str, float]]:
    """What each node has free now, by node id, as the GCS knows it (``{}`` where this process is no Ray driver)."""
    ray: Any = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    from ray._private import state

    return {
        str(node): {k: float(v) for k, v in free.items()} for node, free in state.available_resources_per_node().items()
    }


def _ray_session_name() -> str:
    """This Ray session's name, the ``SessionName`` label of every metric Ray exports (raises
    :class:`LookupError` where this process is no driver of a Ray cluster)."""
    ray: Any = sys.modules.get("ray")  # not imported: no Ray session here (importing it would take seconds)
    node = getattr(ray._private.worker.global_worker, "node", None) if ray is not None else None
    if node is None:
        raise LookupError("this process is not connected to a Ray cluster")
    return str(node.session_name)


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


__all__ = ["BUDGET", "EXTRA_NODES_ENV", "SHOWN", "Endpoint", "MetricsSampler", "Watcher", "scrape"]
