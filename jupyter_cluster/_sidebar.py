"""The kernel's side of the JupyterLab sidebar: the attached cluster, pushed over a comm.

``%load_ext jupyter_cluster`` registers the comm target ``jupyter_cluster`` and opens one
comm to the page, so that a panel already open finds this kernel; a panel that opens
later opens its own. Each comm gets the whole state first, then each part again when it
changes, as :data:`._cluster.watchers` report it: the link, the cells (running, then the
last ten), actors, trainings and sweeps, and port forwards. Nothing is polled. The node
bars come from the metrics feed the dashboards use: it samples only while some panel is
visible, and a panel gets them at most once per the interval it asked for. The messages
are those of ``labextension/src/messages.ts``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _cluster
from ._feed import MetricsFeed, other_jobs_said
from ._handles import format_metric
from ._links import browser_url
from ._version import __version__

if TYPE_CHECKING:
    from ._cell import RemoteCell
    from ._cluster import Cluster
    from ._runs import Run

log = logging.getLogger("jupyter_cluster")

COMM_TARGET = "jupyter_cluster"
PROTOCOL_VERSION = 1
#: Finished cells and runs the panel still lists.
RECENT_CELLS = 10
RECENT_RUNS = 5
#: A burst of changes (a ``--map`` cell's progress, a sweep's results) goes out as one message.
COALESCE = 0.1
#: The node bars' interval when a panel names none, and the shortest it may ask for (seconds).
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.5
#: Metrics that a training run reports beside what it learns.
COUNTERS = {"epoch", "step", "iteration", "training_iteration", "report"}


class Panel:
    """One comm to one sidebar: whether it is visible, and what it was last sent."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.visible = False
        self.interval = DEFAULT_INTERVAL
        self.sent: dict[str, Any] = {}

    def send(self, part: str, message: dict[str, Any]) -> None:
        """Send ``message`` unless it is what this panel has for ``part`` already."""
        if self.sent.get(part) == message:
            return
        self.sent[part] = message
        self.comm.send(message)


class Sidebar:
    """What every sidebar of this kernel shows, and the commands they send."""

    _instance: Sidebar | None = None

    def __init__(self) -> None:
        self.panels: dict[str, Panel] = {}
        self.cluster: Cluster | None = None
        self.cells: dict[str, RemoteCell] = {}
        #: The last cells that ended, as the panel lists them: what they said, not the cells (whose outputs would
        #: keep their objects in the cluster's store after the notebook let go of them).
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_CELLS)
        self.runs: dict[str, Run] = {}
        self.actors: list[dict[str, Any]] = []
        self.dashboard: Any = None
        self._lock = threading.RLock()
        self._dirty: set[str] = set()
        self._timer: threading.Timer | None = None
        self._nodes_due = 0.0
        self._feed: MetricsFeed | None = None
        self._feed_token: int | None = None
        self._actors_asked = False
        self._actors_again = False
        self._link_state: str | None = None
        _cluster.watchers.append(self._on_cluster)
        self._follow(_cluster.current())

    # ------------------------------------------------------------- comms
    @classmethod
    def install(cls, shell: Any) -> Sidebar | None:
        """Register the comm target in ``shell``'s kernel (once) and tell the page; None
        outside a kernel (a plain IPython) or without the ``comm`` package."""
        if getattr(shell, "kernel", None) is None:
            return None
        try:
            from comm import create_comm, get_comm_manager
        except ImportError:
            return None
        if cls._instance is None:
            sidebar = cls._instance = cls()
            get_comm_manager().register_target(COMM_TARGET, sidebar._on_open)
            sidebar._attach(create_comm(target_name=COMM_TARGET, data=sidebar._hello()))
        return cls._instance

    def _on_open(self, comm: Any, msg: dict[str, Any]) -> None:
        comm.send(self._hello())
        self._attach(comm)
        data = msg.get("content", {}).get("data") or {}
        if data.get("type"):
            self._on_message(self.panels[comm.comm_id], data)

    def _attach(self, comm: Any) -> None:
        panel = Panel(comm)
        with self._lock:
            self.panels[comm.comm_id] = panel
        comm.on_msg(lambda msg: self._on_message(panel, msg["content"]["data"]))
        comm.on_close(lambda msg: self._detach(panel))
        for part in ("link", "cells", "actors", "runs", "forwards"):
            panel.send(part, self._build(part))

    def _detach(self, panel: Panel) -> None:
        with self._lock:
            self.panels.pop(panel.comm.comm_id, None)
        self._watch_nodes()

    @staticmethod
    def _hello() -> dict[str, Any]:
        return {"type": "hello", "version": PROTOCOL_VERSION, "package_version": __version__}

    # ---------------------------------------------------------- commands
    def _on_message(self, panel: Panel, data: Any) -> None:
        if not isinstance(data, dict):
            log.warning("the sidebar sent %r, which is not a command", data)
            return
        kind = data.get("type")
        if kind == "watch":
            panel.visible = data.get("visible") is True
            interval = data.get("interval")
            if not isinstance(interval, (int, float)) or isinstance(interval, bool):
                interval = DEFAULT_INTERVAL
            panel.interval = max(MIN_INTERVAL, float(interval))
            if panel.visible:  # what was held back while it was hidden
                panel.send("link", self._build("link"))
            self._watch_nodes()
            return
        request = data.get("request")
        handler = self._commands().get(str(kind))
        if handler is None:
            self._reply(panel, request, False, f"unknown command {kind!r}")
            return
        cluster = self.cluster
        if cluster is None:
            self._reply(panel, request, False, "no cluster is attached: run `%cluster local` or `%cluster connect`")
            return

        def run() -> None:
            try:
                message, outputs = handler(cluster, data)
            except Exception as exc:
                self._reply(panel, request, False, f"{type(exc).__name__}: {exc}")
            else:
                self._reply(panel, request, True, message, outputs)

        if kind == "dashboard":  # widgets are made on the kernel's thread
            run()
        else:  # the rest wait on the agent: not on the kernel's thread
            threading.Thread(target=run, name=f"jupyter_cluster sidebar {kind}", daemon=True).start()

    def _commands(self) -> dict[str, Callable[[Cluster, dict[str, Any]], tuple[str, list[Any] | None]]]:
        return {
            "cancel": self._cancel,
            "kill_actor": self._kill_actor,
            "dashboard": self._open_dashboard,
            "detach": self._detach_cluster,
            "down": self._down,
        }

    @staticmethod
    def _reply(panel: Panel, request: Any, ok: bool, message: str, outputs: list[Any] | None = None) -> None:
        reply: dict[str, Any] = {"type": "reply", "request": request, "ok": ok, "message": message}
        if outputs is not None:
            reply["outputs"] = outputs
        panel.comm.send(reply)

    def _cancel(self, cluster: Cluster, data: dict[str, Any]) -> tuple[str, None]:
        cell_id = _text(data, "cell", "the cell's id")
        cell = cluster.cells.get(cell_id)
        if cell is None or not cell.cancel():
            raise LookupError(f"cell {cell_id} is not running any more")
        return f"cancelling {cell.label}", None

    def _kill_actor(self, cluster: Cluster, data: dict[str, Any]) -> tuple[str, None]:
        name = _text(data, "name", "the actor's name")
        cluster.kill_actor(name)
        return f"killed actor {name}", None

    def _open_dashboard(self, cluster: Cluster, data: dict[str, Any]) -> tuple[str, list[Any]]:
        from IPython.utils.capture import capture_output

        from .widgets import _dashboard

        # The pane gets BokehJS with the widget: the page may not have it yet.
        with capture_output(stdout=False, stderr=False) as loading:
            from bokeh.io import output_notebook
            from bokeh.resources import INLINE

            output_notebook(resources=INLINE, hide_banner=True)
        outputs = [_output(o.data, o.metadata) for o in loading.outputs]
        dashboard = self.dashboard
        if dashboard is None or dashboard.closed or dashboard.cluster is not cluster:
            with capture_output(stdout=False, stderr=False):  # nothing to print into: no cell runs
                dashboard = self.dashboard = _dashboard.Dashboard(cluster)
        outputs.append(_output(dashboard._repr_mimebundle_(), {}))
        return "dashboard", outputs

    def _detach_cluster(self, cluster: Cluster, data: dict[str, Any]) -> tuple[str, None]:
        cluster.disconnect()
        return f"detached from session {cluster.session}; `%cluster connect` resumes it", None

    def _down(self, cluster: Cluster, data: dict[str, Any]) -> tuple[str, None]:
        cluster.down()
        return "the cluster is down", None

    # ------------------------------------------------------ what changes
    def _on_cluster(self, kind: str, data: Any) -> None:
        if kind == "current":
            self._follow(data)
        elif data is not None and self._of_current(data):
            if kind == "cell":
                self._watch_cell(data)
            elif kind == "run":
                with self._lock:
                    self.runs[data.cell.cell_id] = data
                self._mark("runs")
            elif kind == "link":
                link = data._link
                if link.state == self._link_state:
                    self._mark("rtt")
                    return
                self._link_state = link.state
                self._send("link")  # at once: a short outage shows too, not only its end
                if link.state == "connected":
                    self._ask_actors()
                    self._watch_nodes()
            elif kind == "actors":
                self._ask_actors()
            elif kind == "forwards":
                self._mark("forwards")

    def _of_current(self, data: Any) -> bool:
        cluster = getattr(data, "cluster", data)
        if hasattr(data, "cell"):  # a run
            cluster = data.cell.cluster
        return cluster is self.cluster

    def _follow(self, cluster: Cluster | None) -> None:
        with self._lock:
            if cluster is self.cluster:
                return
            self._unwatch_feed()
            self.cluster = cluster
            self.cells.clear()
            self.recent.clear()
            self.runs.clear()
            self.actors = []
            self._link_state = cluster._link.state if cluster is not None else None
        if cluster is not None:
            for cell in list(cluster.cells.values()):
                self._watch_cell(cell)
            self._ask_actors()
        self._mark("link", "cells", "actors", "runs", "forwards")
        self._watch_nodes()

    def _watch_cell(self, cell: RemoteCell) -> None:
        with self._lock:
            if cell.cell_id in self.cells:
                return
            self.cells[cell.cell_id] = cell
        cell.subscribe(lambda event, data: self._on_cell_event(cell, event, data))
        self._mark("cells")
        if cell.mode == "actor":
            self._ask_actors()

    def _on_cell_event(self, cell: RemoteCell, event: str, data: Any) -> None:
        if event == "stream":
            return
        run = cell.cell_id in self.runs
        if event in ("train", "tune"):
            if run:
                self._mark("runs")
            return
        if event in ("done", "error", "lost"):
            with self._lock:
                if self.cells.pop(cell.cell_id, None) is not None:
                    self.recent.appendleft(cell_state(cell))
                if run:
                    self._trim_runs()
            if cell.mode == "actor":
                self._ask_actors()
        self._mark(*(("cells", "runs") if run else ("cells",)))

    def _trim_runs(self) -> None:
        finished = [key for key, run in self.runs.items() if run.done()]
        for key in finished[: max(0, len(finished) - RECENT_RUNS)]:
            del self.runs[key]

    def _ask_actors(self) -> None:
        """Ask the agent for its actors (one question at a time; a change meanwhile asks again)."""
        cluster = self.cluster
        if cluster is None or not cluster.alive or cluster._link.state != "connected":
            return
        with self._lock:
            if self._actors_asked:
                self._actors_again = True
                return
            self._actors_asked = True

        def on_event(event: str, data: Any) -> None:
            if event == "done" and cluster is self.cluster:
                self.actors = [
                    {
                        "name": name,
                        "node": actor.get("node"),
                        "running": actor.get("running"),
                        "error": actor.get("error"),
                    }
                    for name, actor in sorted(data.get("actors", {}).items())
                ]
                self._mark("actors")
            if event in ("done", "error", "lost"):
                with self._lock:
                    again, self._actors_again = self._actors_again, False
                    self._actors_asked = False
                if again:
                    self._ask_actors()

        cluster._link.request("status", {}, on_event)

    # ------------------------------------------------------------- nodes
    def _watch_nodes(self) -> None:
        """Sample the nodes while some panel is visible, and only then."""
        with self._lock:
            wanted = self.cluster is not None and any(p.visible for p in self.panels.values())
            if wanted and self._feed is None:
                assert self.cluster is not None
                self._feed = MetricsFeed.of(self.cluster)
                self._feed_token = self._feed.subscribe(self._on_metrics)
            elif not wanted:
                self._unwatch_feed()
        if wanted:
            self._mark("nodes")

    def _unwatch_feed(self) -> None:
        feed, token = self._feed, self._feed_token
        self._feed = self._feed_token = None
        if feed is not None and token is not None:
            feed.unsubscribe(token)

    def _on_metrics(self, kind: str, data: Any) -> None:
        if kind == "metrics":
            self._mark("nodes")
        elif kind == "ended":  # the link gave up: watched again when one is connected
            with self._lock:
                self._unwatch_feed()

    def _interval(self) -> float:
        visible = [p.interval for p in self.panels.values() if p.visible]
        return min(visible) if visible else DEFAULT_INTERVAL

    # ------------------------------------------------------------ sending
    def _mark(self, *parts: str) -> None:
        with self._lock:
            self._dirty.update(parts)
            self._arm(COALESCE)

    def _arm(self, delay: float) -> None:
        if self._timer is None:
            self._timer = threading.Timer(delay, self._flush)
            self._timer.daemon = True
            self._timer.start()

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            parts, self._dirty = self._dirty, set()
            if "nodes" in parts:
                wait = self._nodes_due - time.monotonic()
                if wait > 0:  # not yet: the interval the panels asked for
                    parts.discard("nodes")
                    self._dirty.add("nodes")
                    self._arm(wait)
                else:
                    self._nodes_due = time.monotonic() + self._interval()
            panels = list(self.panels.values())
        for part in sorted(parts):
            self._send(part, panels)

    def _send(self, part: str, panels: list[Panel] | None = None) -> None:
        """Send ``part`` to the panels that want it (node bars and round trips: the visible ones)."""
        if panels is None:
            with self._lock:
                panels = list(self.panels.values())
        try:
            message = self._build(part)
        except Exception:
            log.exception("the sidebar's %s part could not be built", part)
            return
        key = "link" if part == "rtt" else part
        for panel in panels:
            if panel.visible or part not in ("nodes", "rtt"):
                try:
                    with self._lock:  # one message at a time per comm, in order
                        panel.send(key, message)
                except Exception:
                    log.exception("a sidebar comm failed")

    # --------------------------------------------------------- the parts
    def _build(self, part: str) -> dict[str, Any]:
        cluster = self.cluster
        if part in ("link", "rtt"):
            return {"type": "link", "link": link_state(cluster) if cluster is not None else None}
        if part == "nodes":
            feed = self._feed
            nodes = feed.nodes if feed is not None else {}
            # How old the figures are as they leave (by this kernel's clock: the head's and the browser's may
            # differ): the panel greys them, with their age, once that and their time on its side pass 2 s.
            received = feed.received if feed is not None else None
            age = max(0.0, time.time() - received) if received is not None else 0.0
            nodes_state = [node_state(i, n) for i, n in sorted(nodes.items())]
            # The rest of the cluster's work, counted apart from this notebook's (which the sections list).
            others = other_jobs_said(feed.totals()) if feed is not None else ""
            return {"type": "nodes", "t": time.time(), "age": round(age, 2), "nodes": nodes_state, "others": others}
        with self._lock:
            if part == "cells":
                running = sorted(self.cells.values(), key=lambda c: c.submitted, reverse=True)
                return {"type": "cells", "cells": [cell_state(c) for c in running] + list(self.recent)}
            if part == "actors":
                return {"type": "actors", "actors": list(self.actors)}
            if part == "runs":
                runs = sorted(self.runs.values(), key=lambda r: r.started, reverse=True)
                return {"type": "runs", "runs": [run_state(r) for r in runs]}
        if part == "forwards":
            return {"type": "forwards", "forwards": forwards(cluster)}
        raise ValueError(part)


# ------------------------------------------------------------------ the parts, as sent


def link_state(cluster: Cluster) -> dict[str, Any]:
    info = cluster.link
    rtt = info.get("rtt")
    return {
        "state": info["state"],
        "kind": cluster.kind,
        "target": info["target"],
        "session": info["session"],
        "rtt": round(rtt, 4) if rtt is not None else None,
        "since": info.get("since"),
        "attempts": info.get("attempts", 0),
        "last_error": info.get("last_error", ""),
        "error": info.get("error"),
        "ray": cluster.ray_version,
        "python": cluster.python,
        "ray_dashboard": browser_url(cluster.dashboard_url),  # as the browser reaches it (see _links)
    }


def node_state(node_id: str, node: dict[str, Any]) -> dict[str, Any]:
    """A node's bars. CPU: the CPUs Ray's tasks and actors hold (what the cluster's work uses, not the host's load)."""
    used_cpus, cpus = (float(x) for x in node.get("resources", {}).get("CPU", (0.0, 0.0)))
    gpus = node.get("gpus") or {}
    gpu = gram = None
    if gpus:
        gpu = {"used": round(sum(g.get("utilization", 0.0) for g in gpus.values()) / 100, 2), "total": len(gpus)}
        used = sum(g.get("memory_used", 0.0) for g in gpus.values())
        gram = {"used": used, "total": used + sum(g.get("memory_available", 0.0) for g in gpus.values())}
    return {
        "id": node_id,
        "address": str(node.get("address", node_id)),
        "head": bool(node.get("head")),
        "alive": not node.get("stale"),
        "cpu": {"used": round(used_cpus, 2), "total": cpus},
        "gpu": gpu,
        "gram": gram,
        "ram": {"used": _mib(node.get("mem_used", 0.0)), "total": node.get("mem_total", 0.0)},
        "store": {"used": _mib(node.get("store_used", 0.0)), "total": node.get("store_total", 0.0)},
    }


def _mib(value: float) -> float:
    """Bytes to the MiB: a bar moves no less, and an idle node's bytes stop changing."""
    return float(round(value / 2**20) * 2**20)


def cell_state(cell: RemoteCell) -> dict[str, Any]:
    return {
        "id": cell.cell_id,
        "label": cell.label,
        "mode": cell.mode,
        "where": cell.where,
        "node": cell.node,
        "status": cell.status,
        "submitted": cell.submitted,
        "finished": cell.finished,
        "progress": list(cell.progress) if cell.mode == "map" else None,
        "tasks_running": cell.running_tasks if cell.mode == "map" else None,
        "foreground": cell.foreground and not cell.done(),
    }


def run_state(run: Run) -> dict[str, Any]:
    """A run's line: its state, counts of trials (or workers) by state, its best metric (a sweep's: the best
    trial's last result, among those that did not fail, as its view and result say)."""
    cell = run.cell
    metric, mode, best = run.metric, run.mode, None
    states: dict[Any, str] = {}
    last: dict[Any, float] = {}
    for event in list(run.events):
        kind = event.get("type")
        if run.kind == "tune" and kind == "trial":
            states[event["trial"]] = event["state"]
        elif run.kind == "tune" and kind == "result":
            states.setdefault(event["trial"], "RUNNING")
            value = event.get("metrics", {}).get(metric)
            if _number(value):
                last[event["trial"]] = value
            if event.get("stopped"):
                states[event["trial"]] = "STOPPED"
        elif run.kind == "train" and kind == "report":
            states.setdefault(event["rank"], "RUNNING")
            if event["rank"] == 0:
                metrics = event.get("metrics", {})
                if metric is None:
                    metric = next((k for k, v in metrics.items() if k not in COUNTERS and _number(v)), None)
                if metric is not None and _number(metrics.get(metric)):
                    best = metrics[metric]
        elif run.kind == "train" and kind == "error":
            states[event.get("rank")] = "ERROR"
    scored = [value for trial, value in last.items() if states.get(trial) != "ERROR"]
    if scored:
        best = min(scored) if mode == "min" else max(scored)
    ended = getattr(run, "ended", None)  # set as the run's end event comes, which the cell's may not be yet
    if ended is not None or cell.done():  # the run ended: none of its workers or trials runs any more
        states = {key: "FINISHED" if state == "RUNNING" else state for key, state in states.items()}
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state.lower()] = counts.get(state.lower(), 0) + 1
    status = cell.status if cell.status != "queued" else "starting"
    return {
        "id": cell.cell_id,
        "kind": run.kind,
        "label": run.label,
        "status": status,
        "metric": metric,
        "mode": mode,
        "best": best,
        # As the run's widget writes it (one formatter: a number shown twice is the same number).
        "best_text": None if best is None else format_metric(best),
        "counts": counts,
        "started": run.started,
        "finished": ended or (cell.finished if cell.done() else None),  # the end its widget and result time
        "cell": cell.cell_id,
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def forwards(cluster: Cluster | None) -> list[dict[str, str]]:
    """The Ray dashboard's forward and those of ``Cluster.forward``: name, URL here, what it reaches."""
    if cluster is None:
        return []
    from ._connect import DASHBOARD_PORT

    found = []
    if cluster.dashboard_url and cluster.kind != "embedded local":  # the embedded cluster's own is no forward
        link = browser_url(cluster.dashboard_url) or ""
        found.append({"name": "Ray dashboard", "local": link, "remote": f"head:{DASHBOARD_PORT}"})
    for forward in cluster.forwards:
        remote = f"{forward.where}:{forward.remote_port}"
        if forward.last_error:
            remote += f" (last connection failed: {forward.last_error})"
        found.append({"name": f"port {forward.remote_port}", "local": forward.link, "remote": remote})
    return found


def _text(data: dict[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{data.get('type')} needs {what} in {key!r} (got {value!r})")
    return value


def _output(data: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    return {"output_type": "display_data", "data": data, "metadata": metadata}


__all__ = ["COMM_TARGET", "Panel", "Sidebar", "cell_state", "link_state", "node_state", "run_state"]
