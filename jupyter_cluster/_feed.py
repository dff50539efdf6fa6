"""The cluster's metrics in the kernel: one subscription to the agent, shared by every widget.

The first widget that subscribes sends the agent a ``watch_metrics`` request; its events
are deltas (see :mod:`.agent._sampler`), merged here into each shown node's latest state,
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

from .agent._metrics import NodeSample, totals

if TYPE_CHECKING:
    from ._cluster import Cluster
    from ._link import PendingRequest

log = logging.getLogger("jupyter_cluster")

#: ``callback(kind, data)``: kind is "metrics" (data: the delta), "link" (the link's
#: state changed) or "ended" (the watch ended: data is why).
Listener = Callable[[str, Any], None]

HISTORY = 3600


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


__all__ = ["MetricsFeed"]
