"""What a cell asks of the cluster: Ray options, and whether any node can ever give it.

A request no node can hold (``--gpus 1`` on a CPU-only cluster) would wait for ever
in Ray's queue; it is refused at once, naming what each node has.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from ._objects import CellRequestError

#: Ray's own default for ``max_retries`` of a task (``ray_constants.DEFAULT_TASK_MAX_RETRIES``).
RAY_TASK_RETRIES = 3


def format_resources(resources: dict[str, float]) -> str:
    shown = []
    for key, value in sorted(resources.items()):
        if key.startswith("node:") or key.endswith("_group") or "_group_" in key:
            continue
        if key in ("memory", "object_store_memory"):
            shown.append(f"{key} {value / 2**30:.1f} GiB")
        else:
            shown.append(f"{key} {value:g}")
    return ", ".join(shown)


def ray_options(options: dict[str, Any]) -> dict[str, Any]:
    """Ray's ``.options(...)`` for a cell's ``--cpus/--gpus/--memory/--resources``."""
    out: dict[str, Any] = {}
    if options.get("cpus") is not None:
        out["num_cpus"] = options["cpus"]
    if options.get("gpus") is not None:
        out["num_gpus"] = options["gpus"]
    if options.get("memory") is not None:
        out["memory"] = options["memory"]
    if options.get("resources"):
        out["resources"] = dict(options["resources"])
    if options.get("runtime_env"):
        out["runtime_env"] = options["runtime_env"]
    return out


def task_options(options: dict[str, Any]) -> dict[str, Any]:
    """:func:`ray_options`, with ``--retries`` for a task (a worker that died is retried;
    an exception in the cell is not: it is the cell's answer)."""
    out = ray_options(options)
    if options.get("retries") is not None:
        out["max_retries"] = options["retries"]
        out["retry_exceptions"] = False
    return out


def retries(options: dict[str, Any]) -> int:
    """How many times Ray retries a task of these options whose worker died."""
    given = options.get("retries")
    return RAY_TASK_RETRIES if given is None else int(given)


class ClusterResources:
    """The cluster's nodes (cached for a moment) and the feasibility check."""

    def __init__(self) -> None:
        self._nodes: tuple[float, list[dict[str, Any]]] = (0.0, [])

    def nodes(self, max_age: float = 2.0) -> list[dict[str, Any]]:
        stamp, nodes = self._nodes
        if time.monotonic() - stamp > max_age:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._nodes = (time.monotonic(), nodes)
        return nodes

    def cpus(self) -> float:
        return sum(n.get("Resources", {}).get("CPU", 0) for n in self.nodes()) or 1

    @staticmethod
    def request(options: dict[str, Any], default_cpus: float) -> dict[str, float]:
        opts = ray_options(options)
        request = {"CPU": float(opts.get("num_cpus", default_cpus)), "GPU": float(opts.get("num_gpus", 0))}
        if "memory" in opts:
            request["memory"] = float(opts["memory"])
        request.update({k: float(v) for k, v in opts.get("resources", {}).items()})
        return request

    def check_feasible(self, options: dict[str, Any], default_cpus: float = 1) -> None:
        """Refuse at once a request that no node of the cluster can ever hold."""
        request = self.request(options, default_cpus)
        wanted = {k: v for k, v in request.items() if v}
        if not wanted:
            return
        nodes = self.nodes()
        for node in nodes:
            have = node.get("Resources", {})
            if all(have.get(k, 0.0) >= v for k, v in wanted.items()):
                return
        asked = ", ".join(f"{k} {v:g}" for k, v in wanted.items())
        if "memory" in wanted:
            asked = asked.replace(f"memory {wanted['memory']:g}", f"memory {wanted['memory'] / 2**30:.1f} GiB")
        have = "; ".join(
            f"node {n.get('NodeManagerAddress')}: {format_resources(n.get('Resources', {}))}" for n in nodes
        )
        raise CellRequestError(
            f"no node of this cluster can ever provide {asked}; the cluster has {have}. "
            "Ask for less, or attach to a cluster that has it."
        )


__all__ = ["ClusterResources", "format_resources", "ray_options", "retries", "task_options"]
