"""One node's state, read from Ray's own Prometheus endpoint, and what changed since last time.

Every Ray node serves its metrics as Prometheus text on ``MetricsExportPort`` (see
``ray.nodes()``): about 230 KB in some 100 families on an idle node. Only the families
a dashboard draws are kept, line by line, before anything is parsed; those few are
parsed with ``prometheus_client``'s parser and summed into one flat
:class:`NodeSample`. Names and labels are those of Ray's reporter agent and its own
dashboard panels (``ray/dashboard/modules/reporter/reporter_agent.py``,
``ray/dashboard/modules/metrics/dashboards/default_dashboard_panels.py``); GPU memory
is recorded in MB although declared as bytes, as Ray's panels assume. Tasks and actors
are the user's (``tasks``, ``actors``) or the system's (``system_tasks``, ``system_actors``:
Ray's libraries' own actors and this project's helpers, by Ray's ``Name`` label). Given the
notebook's own Ray job, the work of other jobs (other notebooks' agents, scripts, submitted
jobs: Ray's ``JobId`` label) is counted apart (``other_tasks``, ``other_actors``). A dashboard
needs only what changed: :func:`changes` gives that.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._raylog import kind_of

#: The families drawn, and nothing else.
FAMILIES = (
    "ray_node_cpu_utilization",
    "ray_node_mem_used",
    "ray_node_mem_total",
    "ray_node_gpus_utilization",
    "ray_node_gram_used",
    "ray_node_gram_available",
    "ray_object_store_memory",
    "ray_resources",
    "ray_tasks",
    "ray_actors",
)
#: Tasks and actors by state: those the user's code started, the system's and the cells' own (see
#: :func:`._raylog.kind_of`), and those of other Ray jobs on the cluster.
STATE_KINDS = (
    "tasks",
    "actors",
    "system_tasks",
    "system_actors",
    "cell_tasks",
    "cell_actors",
    "other_tasks",
    "other_actors",
)
_PREFIXES = tuple(f"{name}{{" for name in FAMILIES) + tuple(f"{name} " for name in FAMILIES)
_MB = 1 << 20

NodeSample = dict[str, Any]


def keep_drawn(text: str) -> str:
    """The lines of ``text`` that belong to the drawn families (samples, and their ``# TYPE``)."""
    kept = []
    for line in text.splitlines():
        if line.startswith(_PREFIXES) or (line.startswith("# TYPE ") and line.split(" ", 3)[2] in FAMILIES):
            kept.append(line)
    return "\n".join(kept) + "\n"


Sample = tuple[str, dict[str, str], float]


def parse(text: str) -> list[Sample]:
    """The samples of a metrics text: ``(name, labels, value)``, by ``prometheus_client``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, s.labels, float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]


class LineCache:
    """Parses a node's kept lines, each only the first time it is seen.

    Between two scrapes of a node most lines are the same (its task counts, its
    resources); only the lines that changed (its CPU, its memory) are parsed again.
    """

    def __init__(self) -> None:
        self._lines: dict[str, list[Sample]] = {}

    def samples(self, kept: str) -> list[Sample]:
        lines = [line for line in kept.split("\n") if line and not line.startswith("#")]
        known = {line: self._lines[line] for line in lines if line in self._lines}
        for line in lines:
            if line not in known:
                known[line] = parse(line + "\n")
        self._lines = known  # only the current lines are kept
        return [sample for line in lines for sample in known[line]]


def summarize(text: str, kept: bool = False, cache: LineCache | None = None, job: str | None = None) -> NodeSample:
    """One node's state from its metrics text: CPU %, memory, object store by location and
    its capacity, each GPU, tasks and actors by state, and logical resources (used, total).
    ``kept``: the text holds only the drawn families already (see :func:`keep_drawn`);
    ``cache``: parse only the lines this node's cache has not seen; ``job``: the notebook's
    own Ray job (hex), whose tasks and actors are told from other jobs' (see :func:`whose`)."""
    text = text if kept else keep_drawn(text)
    return summarize_samples(cache.samples(text) if cache is not None else parse(text), job)


def whose(labels: dict[str, str], job: str | None = None) -> str:
    """The prefix of the field that counts a task or actor sample: the system's and the cells' own by name
    (:func:`._raylog.kind_of`), and, given the notebook's own ``job``, another job's work (``"other_"``: another
    notebook's cells and what their code started, a script, a submitted job) by Ray's ``JobId`` label.

    >>> whose({"Name": "f", "JobId": "01000000"}, "01000000"), whose({"Name": "f", "JobId": "02000000"}, "01000000")
    ('', 'other_')
    >>> whose({"Name": "run_cell_task", "JobId": "02000000"}, "01000000"), whose({"Name": "f", "JobId": "02000000"})
    ('other_', '')
    """
    kind = kind_of(labels.get("Name", ""))
    if job and kind != "system_" and labels.get("JobId", job) != job:
        return "other_"
    return kind


def summarize_samples(samples: Iterable[Sample], job: str | None = None) -> NodeSample:
    """One node's state from its samples of the drawn families (see :func:`summarize`)."""
    node: NodeSample = {"store": {}, "gpus": {}, "resources": {}, **{kind: {} for kind in STATE_KINDS}}
    for name, labels, value in samples:
        if name == "ray_node_cpu_utilization":
            node["cpu"] = value
        elif name == "ray_node_mem_used":
            node["mem_used"] = value
        elif name == "ray_node_mem_total":
            node["mem_total"] = value
        elif name == "ray_object_store_memory":
            location = labels.get("Location", "")
            node["store"][location] = node["store"].get(location, 0.0) + value
        elif name == "ray_resources":
            used, total = node["resources"].get(labels.get("Name", ""), (0.0, 0.0))
            if labels.get("State") == "USED":
                used += value
            total += value
            node["resources"][labels.get("Name", "")] = (used, total)
        elif name in ("ray_tasks", "ray_actors"):
            states = node[whose(labels, job) + name[4:]]
            states[labels.get("State", "")] = states.get(labels.get("State", ""), 0.0) + value
        elif name.startswith(("ray_node_gpus_", "ray_node_gram_")):
            gpu = node["gpus"].setdefault(labels.get("GpuIndex", "0"), {"name": labels.get("GpuDeviceName", "")})
            if name == "ray_node_gpus_utilization":
                gpu["utilization"] = value
            elif name == "ray_node_gram_used":
                gpu["memory_used"] = value * _MB
            else:
                gpu["memory_available"] = value * _MB
    node["store_used"] = sum(node["store"].values())
    node["store_total"] = node["resources"].get("object_store_memory", (0.0, 0.0))[1]
    return node


def changes(before: NodeSample | None, after: NodeSample) -> NodeSample:
    """The top-level fields of ``after`` that differ from ``before`` (all of them if there was none)."""
    if before is None:
        return dict(after)
    return {key: value for key, value in after.items() if before.get(key) != value}


def totals(nodes: Iterable[NodeSample]) -> NodeSample:
    """The cluster as one: CPU % (mean over nodes), GPU % (mean over GPUs), object store, tasks and actors."""
    nodes = list(nodes)
    gpus = [g.get("utilization", 0.0) for n in nodes for g in n.get("gpus", {}).values()]
    merged: NodeSample = {kind: {} for kind in STATE_KINDS}
    for node in nodes:
        for kind in STATE_KINDS:
            for state, count in node.get(kind, {}).items():
                merged[kind][state] = merged[kind].get(state, 0.0) + count
    merged["cpu"] = sum(n.get("cpu", 0.0) for n in nodes) / len(nodes) if nodes else 0.0
    merged["gpu"] = sum(gpus) / len(gpus) if gpus else None
    merged["store_used"] = sum(n.get("store_used", 0.0) for n in nodes)
    merged["store_total"] = sum(n.get("store_total", 0.0) for n in nodes)
    return merged


__all__ = [
    "FAMILIES",
    "STATE_KINDS",
    "LineCache",
    "NodeSample",
    "Sample",
    "changes",
    "keep_drawn",
    "parse",
    "summarize",
    "summarize_samples",
    "totals",
    "whose",
]
