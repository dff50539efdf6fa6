"""What ``jc.train_torch`` and ``jc.tune`` share on the cluster: events and feasibility.

A run is one actor cell in an actor of its own on the head (see ``ephemeral`` in
:mod:`._cells`): the actor is the Ray Train or Ray Tune driver, and when the cell
ends the agent kills it, and with it every actor and placement group the run made
(Ray ties their lives to the actor that created them). Events go from any process
of the run (the runner, a training worker, a trial) straight to the notebook, as
markers on the cell's output relay.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

from ..cells._logs import unnoted

#: Where runs keep their results and checkpoints on the head, unless told otherwise.
DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), "ray_results", "jupyter_cluster")


class RunError(RuntimeError):
    """A run that cannot start or go on as asked (the message says what to change)."""


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` made of builtins only (numbers, strings, lists, dicts), to travel to a
    notebook that may not have numpy or torch: scalars become floats, the rest a short repr."""
    if value is None or type(value) in (bool, int, str, float):
        return value
    for kind in (bool, int, float, str):  # numpy's float64, a str subclass...: the builtin
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict) and depth < 4:
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and depth < 4 and len(value) <= 64:
        return [plain(v, depth + 1) for v in value]
    item = getattr(value, "item", None)  # numpy and torch scalars, one-element arrays
    if callable(item):
        try:
            size = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
            if size == 1:
                return plain(item(), depth + 1)
        except Exception:
            pass
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` with nested dicts flattened into ``outer/inner`` keys, as Ray Tune names them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    """The reported metrics, plain, flattened (see :func:`flat`)."""
    return flat({str(k): plain(v) for k, v in metrics.items()})


class Sender:
    """Sends a run's events and output to its notebook cell, from any process of the cluster.

    Each goes to the cell's output relay (an event as a marker batch, index -1, which the
    agent emits at once). Sends do not wait; :meth:`flush` waits until the relay holds
    all of them, which a process does before it ends (a trial that raised, a worker whose
    training is over) so that its last words are not lost with it.
    """

    def __init__(self, relay: str, cell_id: str) -> None:
        self.relay = relay
        self.cell_id = cell_id
        self.actor: Any = None
        self._pending: list[Any] = []
        self._lock = threading.Lock()
        if relay:
            from ..cells import _relays

            self.actor = _relays.relay(relay)

    def __reduce__(self) -> Any:  # Tune pickles its callbacks: the relay is found again by name
        return (Sender, (self.relay, self.cell_id))

    def __call__(self, kind: str, data: Any) -> None:
        self.push(0, -1, [(kind, data)])

    def push(self, stream: int, index: int, batch: list[tuple[str, Any]]) -> None:
        if self.actor is None:
            return
        with unnoted():
            ref = self.actor.push.remote(self.cell_id, stream, index, batch)
        with self._lock:
            self._pending.append(ref)
            if len(self._pending) >= 64:
                import ray

                _, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)

    def flush(self, timeout: float = 10.0) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            import ray

            ray.wait(pending, num_returns=len(pending), timeout=timeout)


def current_sender() -> Sender:
    """The :class:`Sender` to the notebook cell this runner actor runs now."""
    relay, cell_id = relay_of_current()
    return Sender(relay, cell_id)


def relay_of_current() -> tuple[str, str]:
    from ..cells._remote import current_spec

    if current_spec is None:
        return "", ""
    return current_spec.relay, current_spec.cell_id


class StreamTo:
    """A text stream that sends whole lines as the cell's output, each line prefixed."""

    def __init__(self, sender: Sender, stream: int, kind: str, prefix: str) -> None:
        from ..cells._execute import CellOutput

        self.prefix = prefix
        self.kind = kind
        self._partial = ""
        self._lock = threading.Lock()
        self.output = CellOutput(lambda index, batch: sender.push(stream, index, batch))

    def write(self, text: str) -> int:
        with self._lock:
            text = self._partial + text
            lines = text.split("\n")
            self._partial = lines.pop()
            for line in lines:
                self.output.add(self.kind, f"{self.prefix}{line}\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self.output.add(self.kind, f"{self.prefix}{self._partial}")
                self._partial = ""
        self.output.flush()

    def isatty(self) -> bool:
        return False


class Captured:
    """Within the block, this process's stdout and stderr go to the notebook cell."""

    def __init__(self, sender: Sender, stream: int, prefix: str) -> None:
        self.sender, self.stream, self.prefix = sender, stream, prefix

    def __enter__(self) -> Captured:
        self.saved = sys.stdout, sys.stderr
        if self.sender.actor is not None:
            sys.stdout = StreamTo(self.sender, 2 * self.stream, "stdout", self.prefix)
            sys.stderr = StreamTo(self.sender, 2 * self.stream + 1, "stderr", self.prefix)
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, StreamTo):
                stream.flush()
        sys.stdout, sys.stderr = self.saved
        self.sender.flush()


def cluster_totals() -> tuple[dict[str, float], list[dict[str, float]]]:
    """The cluster's resources in all, and each alive node's."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    totals: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals, nodes


def describe(resources: dict[str, float]) -> str:
    shown = []
    for key in ("CPU", "GPU"):
        shown.append(f"{resources.get(key, 0):g} {key}")
    shown += [
        f"{v:g} {k}"
        for k, v in sorted(resources.items())
        if k not in ("CPU", "GPU", "memory", "object_store_memory")
        and not k.startswith("node:")
        and not k.startswith("accelerator_type")
    ]
    return ", ".join(shown)


def fits(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether ``bundles`` can all be placed at once on ``nodes`` (first fit, largest first)."""
    free = [dict(n) for n in nodes]
    for bundle in sorted(bundles, key=lambda b: -sum(b.values())):
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            return False
    return True


def check_bundles(what: str, bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> str | None:
    """Why ``bundles`` can never run on this cluster, or None when they can."""
    bundles = [{k: v for k, v in b.items() if v} for b in bundles]
    if fits(bundles, nodes):
        return None
    totals: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            totals[key] = totals.get(key, 0.0) + value
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            need[key] = need.get(key, 0.0) + value
    per_node = "; ".join(describe(n) for n in nodes) or "no nodes"
    short = [k for k, v in need.items() if totals.get(k, 0.0) + 1e-9 < v]
    hint = ""
    if "GPU" in short and not totals.get("GPU"):
        hint = " This cluster has no GPU: leave use_gpu off (or gpus=0), or attach to a cluster with GPUs."
    elif short:
        hint = " Ask for fewer workers or less per worker."
    else:
        hint = " Each must fit on one node: ask for less per worker."
    asked = ", ".join(f"{v:g} {k}" for k, v in sorted(need.items()))
    return (
        f"{what} needs {asked} in all, and this cluster can never hold that: "
        f"it has {len(nodes)} node(s) with {per_node}.{hint}"
    )


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = [
    "DEFAULT_STORAGE",
    "Captured",
    "RunError",
    "Sender",
    "check_bundles",
    "cluster_totals",
    "current_sender",
    "finite",
    "numbers",
    "plain",
    "relay_of_current",
]
