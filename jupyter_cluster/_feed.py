"""The cluster's metrics in the kernel: one subscription to the agent, shared by every widget.

The first widget that subscribes sends the agent a ``watch_metrics`` request; its events
are deltas (see :mod:`.agent.watching._sampler`), merged here into each shown node's latest state,
the cluster's totals (all its nodes, summed on the agent or by Prometheus), where the
figures come from, and a short history of the totals. When the last widget unsubscribes, the feed
sends ``unwatch_metrics`` and the agent stops sampling. Callbacks run on the link's
thread; they must be quick (they hand the delta to Bokeh's ``stream``/``patch``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .agent.watching._metrics import NodeSample, totals

if TYPE_CHECKING:
    from ._cluster import Cluster
    from ._link import PendingRequest

log = logging.getLogger("jupyter_cluster")

#: ``callback(kind, data)``: kind is "metrics" (data: the delta), "link" (the link's
#: state changed) or "ended" (the watch ended: data is why).
Listener = Callable[[str, Any], None]

HISTORY = 3600


#: Ray's fine-grained states (``ray_tasks{State}``, ``ray_actors{State}``) summed into these.
GROUPS = {
    "tasks": ("pending", "running", "finished", "failed"),
    "actors": ("pending", "alive", "restarting", "dead"),
}


def _group(kind: str, state: str) -> str | None:
    if kind == "tasks":
        if state.startswith("RUNNING"):
            return "running"
        if state in ("FINISHED", "FAILED"):
            return state.lower()
        return "pending"  # PENDING_*, SUBMITTED_TO_WORKER, GETTING_AND_PINNING_ARGS...
    if state in ("ALIVE", "RESTARTING", "DEAD"):  # ALIVE_IDLE, ALIVE_RUNNING_TASKS: kinds of ALIVE
        return state.lower()
    if state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY"):
        return "pending"
    return None


def state_groups(cluster: NodeSample, system: bool = False, whose: str = "") -> dict[tuple[str, str], float]:
    """``{("tasks", "running"): 3.0, ...}`` from a cluster's totals: the tasks and actors the notebook's code
    started, or with ``system`` those of Ray's libraries' own actors and this project's helpers, or with
    ``whose="other_"`` those of the cluster's other Ray jobs (other notebooks, scripts, submitted jobs).

    Never below zero: Ray counts a task's states where it is owned and where it runs, and the
    two gauges, read a moment apart, can sum to -1 for a state a task is leaving."""
    groups: dict[tuple[str, str], float] = {}
    for kind in GROUPS:
        for state, count in cluster.get(("system_" if system else whose) + kind, {}).items():
            group = _group(kind, state)
            if group is not None:
                groups[kind, group] = groups.get((kind, group), 0.0) + count
    return {key: max(0.0, round(count)) for key, count in groups.items()}


def _groups_said(groups: dict[tuple[str, str], float]) -> str:
    return ", ".join(
        f"{count:.0f} {kind[:-1] if count == 1 else kind} {group}"
        for kind, group in (("actors", "alive"), ("tasks", "running"), ("tasks", "pending"))
        if (count := groups.get((kind, group), 0.0))
    )


def system_said(cluster: NodeSample) -> str:
    """The system's work now, apart from the user's (``system: 3 actors alive, 1 task running``), or ''."""
    parts = _groups_said(state_groups(cluster, system=True))
    return "system: " + parts if parts else ""


def other_jobs_said(cluster: NodeSample) -> str:
    """The cluster's other Ray jobs' work now, apart from this notebook's (``other notebooks and drivers: 1 actor
    alive, 4 tasks running``: their cells and what their code started), or ''.

    >>> other_jobs_said({"other_tasks": {"RUNNING": 4.0, "FINISHED": 9.0}, "other_actors": {"ALIVE": 1.0}})
    'other notebooks and drivers: 1 actor alive, 4 tasks running'
    """
    parts = _groups_said(state_groups(cluster, whose="other_"))
    return "other notebooks and drivers: " + parts if parts else ""


class MetricsFeed:
    """The agent's metrics for one cluster, while anything listens."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: The nodes drawn one by one (the agent sends at most ``SHOWN``).
        self.nodes: dict[str, NodeSample] = {}
        #: The whole cluster as one (``count``: its nodes), as the agent last sent it.
        self.cluster_totals: NodeSample = {}
        #: Where the figures come from: ``{"kind": "scrape" | "prometheus", "every": s, ...}``.
        self.source: dict[str, Any] = {}
        #: ``(time, totals)`` of each sample, oldest first.
        self.history: deque[tuple[float, NodeSample]] = deque(maxlen=HISTORY)
        self.deltas = 0
        #: When the last sample came, by this kernel's clock (None: none yet).
        self.received: float | None = None
        self._listeners: dict[int, Listener] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._request: PendingRequest | None = None
        self._first = threading.Event()

    @classmethod
    def of(cls, cluster: Cluster) -> MetricsFeed:
        feed = getattr(cluster, "_metrics_feed", None)
        if feed is None:
            feed = cluster._metrics_feed = cls(cluster)
        return feed

    @property
    def watching(self) -> bool:
        return self._request is not None

    def subscribe(self, listener: Listener) -> int:
        with self._lock:
            token = next(self._ids)
            self._listeners[token] = listener
            if self._request is None:
                self._first.clear()
                self._request = self.cluster._link.request("watch_metrics", {}, self._on_event)
        return token

    def unsubscribe(self, token: int) -> None:
        with self._lock:
            self._listeners.pop(token, None)
            request, last = self._request, not self._listeners
            if last:
                self._request = None
        if last and request is not None and not self.cluster._link.closed:
            self.cluster._link.request("unwatch_metrics", {"watch": request.id})

    def wait_first(self, timeout: float) -> bool:
        """Until the first sample arrived (True), or ``timeout`` passed."""
        return self._first.wait(timeout)

    def totals(self) -> NodeSample:
        """The whole cluster as one (the agent's sums; summed here from the nodes of an older agent)."""
        return self.cluster_totals or totals(self.nodes.values())

    @property
    def count(self) -> int:
        """The cluster's nodes, shown or not."""
        return int(self.cluster_totals.get("count", len(self.nodes)))

    def _on_event(self, event: str, data: Any) -> None:
        if event == "metrics":
            for node_id, diff in data["nodes"].items():
                self.nodes.setdefault(node_id, {}).update(diff)
            for node_id in data["left"]:
                self.nodes.pop(node_id, None)
            self.cluster_totals = data.get("cluster") or {}
            if "source" in data:
                self.source = data["source"]
            self.deltas += 1
            # By this kernel's clock: the agent's ``t`` is the head's, which may differ.
            self.received = time.time()
            self.history.append((data["t"], self.totals()))
            self._first.set()
            self._tell("metrics", data)
        elif event == "link":
            self._tell("link", data)
        elif event in ("done", "error", "lost"):
            with self._lock:
                self._request = None
            self._first.set()
            why = data if event != "done" else None
            self._tell("ended", why.get("message", why) if isinstance(why, dict) else why)

    def _tell(self, kind: str, data: Any) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(kind, data)
            except Exception:
                log.exception("a metrics listener failed")


__all__ = ["GROUPS", "MetricsFeed", "other_jobs_said", "state_groups", "system_said"]
