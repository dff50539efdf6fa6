"""A cell's timeline: the tasks and actor calls it ran, from Ray's task events.

Which tasks are a cell's the agent knows already: its own task (or its ``--map`` chunks, or its
actor call) and every task or actor call its code started, nested ones too (see :mod:`._logs`).
Their events are Ray's task events, read from the GCS as Ray's own ``ray.timeline()`` reads them
(:data:`RAY_INTERNALS`): the state API serves the same events over the Ray dashboard's HTTP
server, which the embedded cluster does not run. Each task attempt becomes a span: its name, its
node, the worker process that ran it, its last state, and when it ran. A task's last events reach
the GCS about a second after it ends: a timeline asked for just after its cell waits for them, a
few seconds at most.

This module runs in the agent, off its event loop (the events grow with the cluster's work).
"""

from __future__ import annotations

import time
from typing import Any

#: What this leans on of Ray's, checked on Ray 2.60: ``ray._private.state.state._connect_and_get_accessor()``,
#: whose ``get_task_events()`` gives serialized ``gcs_pb2.TaskEvents`` (``ray.core.generated``).
RAY_INTERNALS = "ray._private.state.state._connect_and_get_accessor().get_task_events()"
#: States that end a task attempt.
ENDED = ("FINISHED", "FAILED")
#: How long a timeline waits for the last events of its cell's tasks (on a busy machine they came seconds late),
#: when its cell ended less than RECENT seconds ago.
SETTLE = 8.0
RECENT = 30.0
#: Spans sent at most; past that, a worker's consecutive spans of one name are merged.
MAX_SPANS = 20_000
#: What the notebook calls this project's own task functions.
OWN_NAMES = {"run_cell_task": "the cell", "run_map_chunk": "--map items", "CellNamespace.run": "the cell (actor)"}


def _events() -> list[Any]:
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    accessor = state._connect_and_get_accessor()
    return [gcs_pb2.TaskEvents.FromString(raw) for raw in accessor.get_task_events()]  # type: ignore[attr-defined]


def _node_ips() -> dict[str, str]:
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}


def spans(tasks: set[str], settle: float = SETTLE) -> list[dict[str, Any]]:
    """The spans of ``tasks`` (hex task ids): ``name``, ``node``, ``worker``, ``state``, ``start``, ``end``
    (seconds since the epoch; ``end`` None while it runs), one a task attempt, by start."""
    from ray.core.generated import common_pb2

    if not tasks:
        return []
    deadline = time.monotonic() + settle
    while True:
        merged: dict[tuple[str, int], dict[str, Any]] = {}
        for event in _events():
            task = event.task_id.hex()
            if task not in tasks:
                continue
            entry = merged.setdefault((task, event.attempt_number), {"ts": {}, "task": task})
            info = event.task_info
            if info.name:
                entry["name"] = info.name
            updates = event.state_updates
            for state, ns in updates.state_ts_ns.items():
                entry["ts"][common_pb2.TaskStatus.Name(state)] = ns / 1e9  # type: ignore[attr-defined]
            if updates.node_id:
                entry["node_id"] = updates.node_id.hex()
            if updates.worker_pid:
                entry["pid"] = updates.worker_pid
            if updates.HasField("error_info"):
                entry["error"] = common_pb2.ErrorType.Name(updates.error_info.error_type)  # type: ignore[attr-defined]
        # Every task heard of, and each attempt ended (none heard of yet is not settled: their events are on the way).
        heard = {entry["task"] for entry in merged.values()}
        settled = heard >= tasks and all(any(s in entry["ts"] for s in ENDED) for entry in merged.values())
        if settled or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    ips = _node_ips()
    out = []
    for entry in merged.values():
        ts = entry["ts"]
        start = ts.get("RUNNING") or ts.get("SUBMITTED_TO_WORKER")
        if start is None:
            continue  # never ran (cancelled while it waited)
        state = next((s for s in ENDED if s in ts), "RUNNING")
        node = ips.get(entry.get("node_id", ""), entry.get("node_id", "")[:8] or "?")
        name = entry.get("name", "?")
        out.append(
            {
                "name": OWN_NAMES.get(name, name),
                "node": node,
                "worker": f"{node} pid {entry.get('pid', '?')}",
                "state": state,
                "start": start,
                "end": ts.get(state) if state in ENDED else None,
                "error": entry.get("error", ""),
            }
        )
    out.sort(key=lambda span: span["start"])
    return _merged(out) if len(out) > MAX_SPANS else out


def _merged(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fewer spans: on each worker, consecutive spans of one name and state become one (a count kept)."""
    out: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}
    for span in found:
        previous = last.get(span["worker"])
        if previous is not None and previous["name"] == span["name"] and previous["state"] == span["state"]:
            previous["end"] = span["end"]
            previous["count"] = previous.get("count", 1) + 1
            continue
        span = dict(span)
        out.append(span)
        last[span["worker"]] = span
    return out


__all__ = ["MAX_SPANS", "RAY_INTERNALS", "spans"]
