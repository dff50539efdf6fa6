"""What a ``jc.train_torch`` run holds in memory: Ray Train's defaults, a lean run, local mode; idle workers.

Side by side on one embedded cluster (2 CPUs): the same training function (PyTorch, 2
workers, a few epochs) run with ``lean=False`` (every helper Ray Train starts), lean (the
default: no preemption watcher, autoscaling coordinator or dataset manager on a cluster
without an autoscaler, and no datasets), and in Ray Train's local mode (``num_workers=0``).
While each runs, every process of the cluster (the agent and all it started: Ray's daemons,
the workers and actors) and this process (the notebook's side) is sampled every 0.2 s for its
anonymous memory (``RssAnon``: what a cgroup's ``total_rss`` counts; page cache aside), by
what it is (``ray::ClassName``, the daemon's name). The peak of the sum, and each kind's peak,
are printed, with what each helper that a lean run leaves out held in the run with them.

Then idle workers: after a task that imports PyTorch, how much the idle worker processes
hold 3 s later, with Ray's default (one idle worker kept per CPU) and as a small container's
embedded cluster sets it (``num_workers_soft_limit`` 0: idle workers end after 1 s), each on a
cluster of its own.

Run: ``python benchmarks/bench_train_footprint.py [--epochs 4]``. The lean run's helpers left
out should save their whole footprint, 130 MiB or more each (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from collections import defaultdict
from typing import Any

import jupyter_cluster as jc

MiB = 2**20
HELPERS = ("PreemptionWatcher", "_AutoscalingCoordinatorActor", "DatasetManager")


def train_func(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    from ray.train.torch import prepare_model

    model = prepare_model(torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(config["epochs"]):
        loss = model(torch.randn(512, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.5)
        ray.train.report({"epoch": epoch, "loss": float(loss)})


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children[parent].append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kind_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    match = re.match(r"ray::([\w:.-]+)", cmdline)
    if match:
        title = match.group(1)
        if title.startswith("cell-namespace:"):  # a named CellNamespace: a run's actor, or an --actor cell's
            return "CellNamespace"
        return title.split(".", 1)[0]
    if "jupyter_cluster.agent" in cmdline:
        return "agent"
    for name in (
        "raylet",
        "gcs_server",
        "dashboard_agent",
        "runtime_env_agent",
        "log_monitor",
        "monitor.py",
        "dashboard.py",
    ):
        if name in cmdline:
            return name
    return cmdline[:40]


def anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Every 0.2 s, the anonymous memory of the cluster's processes and this one, by kind."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak_total = 0
        self.peak_kind: dict[str, int] = defaultdict(int)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            by_kind: dict[str, int] = defaultdict(int)
            for pid in [os.getpid(), *descendants(self.root)]:
                by_kind["notebook (this process)" if pid == os.getpid() else kind_of(pid)] += anon(pid)
            self.peak_total = max(self.peak_total, sum(by_kind.values()))
            for kind, size in by_kind.items():
                self.peak_kind[kind] = max(self.peak_kind[kind], size)
            self.stop.wait(0.2)


def settle(root: int, timeout: float = 60.0) -> None:
    """Until the last run's processes are gone (a killed actor's process takes a moment to exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(kind_of(p) in ("TrainController", "RayTrainWorker", *HELPERS[:1]) for p in descendants(root)):
            return
        time.sleep(0.5)


def measure(cluster: jc.Cluster, label: str, **kwargs: Any) -> Sampler:
    agent = cluster._agent
    assert agent is not None
    settle(agent.process.pid)
    sampler = Sampler(agent.process.pid)
    sampler.start()
    started = time.perf_counter()
    result = jc.train_torch(train_func, progress=False, **kwargs)
    took = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    assert result.error is None, result.error
    print(f"\n{label}: {took:.1f} s, peak anonymous memory {sampler.peak_total / MiB:,.0f} MiB")
    for kind, size in sorted(sampler.peak_kind.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {kind:<32} {size / MiB:8,.0f} MiB")
    return sampler


def idle_workers(soft_limit: int | None) -> float:
    """MiB the idle workers hold 3 s after a task that imported PyTorch, on a fresh cluster."""
    if soft_limit is None:
        os.environ.pop("RAY_num_workers_soft_limit", None)
    else:
        os.environ["RAY_num_workers_soft_limit"] = str(soft_limit)  # noqa: SIM112 (Ray reads it as written)
    cluster = jc.local(cpus=2)
    try:

        def with_torch(x: int) -> int:
            import torch

            return int(torch.ones(4).sum()) + x

        jc.get(jc.map(with_torch, range(4), progress=False))
        time.sleep(3)
        agent = cluster._agent
        assert agent is not None
        idle = [p for p in descendants(agent.process.pid) if kind_of(p) == "IDLE"]
        return sum(anon(p) for p in idle) / MiB
    finally:
        cluster.down()
        os.environ.pop("RAY_num_workers_soft_limit", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    config = {"epochs": args.epochs}

    cluster = jc.local(cpus=2)
    try:
        # Ray's defaults last: its autoscaling coordinator is detached and would outlive its run into the others.
        lean = measure(cluster, "lean (2 workers)", num_workers=2, config=config)
        local = measure(cluster, "local mode (num_workers=0)", num_workers=0, config=config)
        full = measure(
            cluster, "Ray Train's defaults (lean=False, 2 workers)", num_workers=2, config=config, lean=False
        )
    finally:
        cluster.down()
    print("\nWhat each helper a lean run leaves out held in the run with Ray Train's defaults:")
    saved = 0
    for helper in HELPERS:
        size = full.peak_kind.get(helper, 0)
        saved += size
        print(f"  {helper:<32} {size / MiB:8,.0f} MiB (lean: {lean.peak_kind.get(helper, 0) / MiB:,.0f})")
    print(f"  together                         {saved / MiB:8,.0f} MiB")
    print(
        f"\npeak anonymous memory: defaults {full.peak_total / MiB:,.0f} MiB, lean {lean.peak_total / MiB:,.0f} MiB "
        f"({(full.peak_total - lean.peak_total) / MiB:,.0f} MiB less), local mode {local.peak_total / MiB:,.0f} MiB "
        f"({(full.peak_total - local.peak_total) / MiB:,.0f} MiB less)"
    )
    kept = idle_workers(None)
    given_back = idle_workers(0)
    print(
        f"\nidle workers 3 s after a PyTorch task: {kept:,.0f} MiB with Ray's default, {given_back:,.0f} MiB with "
        f"num_workers_soft_limit 0 ({kept - given_back:,.0f} MiB given back)"
    )


if __name__ == "__main__":
    main()
