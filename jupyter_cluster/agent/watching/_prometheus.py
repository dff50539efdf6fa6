"""The cluster's metrics read from a Prometheus server's query API, at any number of nodes.

Ray's documented production setup has a Prometheus server scrape every node (its file
service discovery reads ``prom_metrics_service_discovery.json`` in the session folder,
kept up to date by Ray). Where there is one, the dashboard asks it instead of scraping
each node itself, and asks only for what it draws, already summed by Prometheus: each
sample is two queries of a few dozen series, whatever the node count.

- the cluster as one (:data:`TOTALS`): mean CPU and GPU utilisation, object store used
  and its capacity, tasks and actors by state, summed over this Ray session's nodes;
- the drawn families of the nodes shown (at most ``SHOWN`` of them, see
  :func:`._sampler.shown`), and each one's ``up`` (whether Prometheus's last scrape of it
  worked);
- every ``nodes_every`` seconds, the list of nodes (one series a node).

Every query is filtered on Ray's ``SessionName`` label: a Prometheus server keeps the
series of earlier sessions (and of other clusters) for minutes after they stop.
The server is read where the agent runs (on the head): ``http://localhost:9090``,
Ray's default ``RAY_PROMETHEUS_HOST``, is the head's own.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ._metrics import FAMILIES, STATE_KINDS, NodeSample, Sample, summarize_samples
from ._raylog import CELL_TASKS, OWN_TASKS, RAY_ACTORS

#: Ray's setting for where its dashboard finds Prometheus (and its default).
PROMETHEUS_ENV = "RAY_PROMETHEUS_HOST"
DEFAULT_PROMETHEUS = "http://localhost:9090"

#: The cluster's totals, each a query whose series carry the ``q`` label naming the field;
#: ``{s}`` is the session selector. One request answers them all (``or`` unions vectors
#: whose labels differ). ``JOB`` is the notebook's own Ray job: given one, other jobs' work is counted apart
#: (:data:`BY_JOB`), as :func:`._metrics.whose` does.
TOTALS = {
    "cpu": "avg(ray_node_cpu_utilization{s})",
    "gpu": "avg(ray_node_gpus_utilization{s})",
    "store_used": "sum(ray_object_store_memory{s})",
    "store_total": 'sum(ray_resources{s, Name="object_store_memory"})',
    "tasks": "sum by (State) (ray_tasks{s, Name!~SYSTEM, Name!~CELLS})",
    "actors": "sum by (State) (ray_actors{s, Name!~SYSTEM, Name!~CELLS})",
    "system_tasks": "sum by (State) (ray_tasks{s, Name=~SYSTEM})",
    "system_actors": "sum by (State) (ray_actors{s, Name=~SYSTEM})",
    "cell_tasks": "sum by (State) (ray_tasks{s, Name=~CELLS})",
    "cell_actors": "sum by (State) (ray_actors{s, Name=~CELLS})",
    "count": "count(ray_node_cpu_utilization{s})",
}
BY_JOB = {
    "tasks": 'sum by (State) (ray_tasks{s, Name!~SYSTEM, Name!~CELLS, JobId="JOB"})',
    "actors": 'sum by (State) (ray_actors{s, Name!~SYSTEM, Name!~CELLS, JobId="JOB"})',
    "cell_tasks": 'sum by (State) (ray_tasks{s, Name=~CELLS, JobId="JOB"})',
    "cell_actors": 'sum by (State) (ray_actors{s, Name=~CELLS, JobId="JOB"})',
    "other_tasks": 'sum by (State) (ray_tasks{s, Name!~SYSTEM, JobId!="JOB"})',
    "other_actors": 'sum by (State) (ray_actors{s, Name!~SYSTEM, JobId!="JOB"})',
}


#: The names of the system's tasks and actors (see :func:`._raylog.is_system`), as a PromQL regex.
SYSTEM = '"(.*:)?(' + "|".join(sorted(RAY_ACTORS | OWN_TASKS)) + r')(\\..*)?"'
#: The names of the cells' own tasks and actors (:data:`._raylog.CELL_TASKS`), as a PromQL regex.
CELLS = '"(.*:)?(' + "|".join(sorted(CELL_TASKS)) + r')(\\..*)?"'


class PrometheusError(Exception):
    """The server did not answer, or answered with an error (the message says which and what to do)."""


def _selector(session: str, extra: str = "") -> str:
    return "{" + f'SessionName="{session}"' + (f", {extra}" if extra else "") + "}"


def totals_query(session: str, job: str | None = None) -> str:
    """One PromQL expression for every field of :data:`TOTALS` (and :data:`BY_JOB`, given the notebook's own
    ``job``), each labelled ``q``."""
    selector = f'SessionName="{session}"'
    parts = []
    fields = {**TOTALS, **BY_JOB} if job else TOTALS
    for field, expr in fields.items():
        inner = expr.replace("{s}", "{" + selector + "}").replace("{s, ", "{" + selector + ", ")
        inner = inner.replace("~SYSTEM", "~" + SYSTEM).replace("~CELLS", "~" + CELLS)
        inner = inner.replace('"JOB"', f'"{job}"')
        parts.append(f'label_replace({inner}, "q", "{field}", "", "")')
    return " or ".join(parts)


def _regex(values: list[str]) -> str:
    """A PromQL string holding a regex that matches exactly these label values."""
    pattern = "|".join(re.escape(v) for v in values)
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


class Prometheus:
    """A Prometheus server's query API (blocking calls: run them off the event loop)."""

    def __init__(self, url: str, session: str, timeout: float = 2.0, job: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.job = job  # the notebook's own Ray job: other jobs' work is counted apart

    def __repr__(self) -> str:
        return f"Prometheus({self.url!r})"

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, OSError):
                pass
            said = f": {detail}" if detail else ""
            raise PrometheusError(f"Prometheus at {self.url} answered HTTP {exc.code}{said}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            why = f"{type(reason).__name__}: {reason}"
            raise PrometheusError(f"Prometheus at {self.url} did not answer ({why})") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url} answered with an error: {body!r:.300}")
        return body["data"]

    def check(self) -> str:
        """The server's version (raises :class:`PrometheusError` when it is no Prometheus API)."""
        data = self._get("/api/v1/status/buildinfo")
        return str(data.get("version", "?")) if isinstance(data, dict) else "?"

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: ``(labels, value)`` per series (``__name__`` among the labels)."""
        data = self._get("/api/v1/query", query=expr)
        if data.get("resultType") != "vector":
            raise PrometheusError(f"Prometheus at {self.url} answered a {data.get('resultType')}, not a vector")
        return [(dict(s["metric"]), float(s["value"][1])) for s in data["result"]]

    def instances(self) -> list[str]:
        """Every node of this session Prometheus scrapes, by its ``instance`` (host:port)."""
        series = self.query(f"group by (instance) (ray_node_cpu_utilization{_selector(self.session)})")
        return sorted(labels.get("instance", "") for labels, _ in series)

    def totals(self) -> NodeSample:
        """The cluster as one, as :func:`._metrics.totals` gives it, plus ``count``, the nodes it sums."""
        merged: NodeSample = {"cpu": 0.0, "gpu": None, "store_used": 0.0, **{kind: {} for kind in STATE_KINDS}}
        merged.update(store_total=0.0, count=0)
        for labels, value in self.query(totals_query(self.session, self.job)):
            field = labels.get("q", "")
            if field in STATE_KINDS:
                merged[field][labels.get("State", "")] = value
            elif field == "count":
                merged["count"] = int(value)
            elif field in merged:
                merged[field] = value
        return merged

    def nodes(self, instances: list[str]) -> dict[str, NodeSample]:
        """The drawn state of each of ``instances`` (a node Prometheus failed to scrape last is ``stale``)."""
        if not instances:
            return {}
        matching = f'instance=~"{_regex(instances)}"'
        names = "|".join(FAMILIES)
        expr = f'{{__name__=~"{names}", SessionName="{self.session}", {matching}}} or up{{{matching}}}'
        by_instance: dict[str, list[Sample]] = {i: [] for i in instances}
        up: dict[str, float] = {}
        for labels, value in self.query(expr):
            instance = labels.pop("instance", "")
            name = labels.pop("__name__", "")
            if instance not in by_instance:
                continue
            if name == "up":
                up[instance] = max(up.get(instance, 0.0), value)
            else:
                by_instance[instance].append((name, labels, value))
        nodes = {}
        for instance, samples in by_instance.items():
            node = summarize_samples(samples, self.job)
            if up.get(instance, 1.0) < 1.0:
                node["stale"] = f"Prometheus at {self.url} could not scrape it last time"
            nodes[instance] = node
        return nodes

    def covers(self) -> int:
        """How many nodes of this session the server has (0: it does not scrape this cluster)."""
        series = self.query(f"count(ray_node_cpu_utilization{_selector(self.session)})")
        return int(series[0][1]) if series else 0


__all__ = ["DEFAULT_PROMETHEUS", "PROMETHEUS_ENV", "TOTALS", "Prometheus", "PrometheusError", "totals_query"]
