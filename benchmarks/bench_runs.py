"""What ``jc.train_torch`` and ``jc.tune`` cost over Ray Train and Ray Tune themselves.

On one embedded cluster (2 CPUs), side by side and interleaved (``--rounds`` of each):

- **Train**: the same training function on 2 workers (``--epochs`` reports, a little
  work and a 0.2 s pause each), run by ``jc.train_torch`` and by ``TorchTrainer.fit()``
  in a ``--driver`` cell on the agent, as a user would write it there. ``jc.train_torch``
  leaves out Ray Train's placement-group cleaner (it asks the Ray dashboard, which the
  embedded cluster does not run, and each stop waits out its timeouts) and has the
  controller poll the workers every 0.5 s; a third variant runs ``fit()`` directly with
  those same two settings, so the helper's own cost shows on its own.
- **Tune**: 4 trials of 10 iterations, by ``jc.tune`` and by ``Tuner.fit()`` in a
  ``--driver`` cell.
- **Latency**: each report carries the worker's (or trial's) clock when ``report()`` was
  called; the notebook side records when the widget had the row (the training view's
  ``on_event`` returned). Same machine, same clock.

Run: ``python benchmarks/bench_runs.py [--rounds 3] [--epochs 20]``.
Targets: helper / direct <= 1.05 (median wall time); report -> widget median <= 0.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jupyter_cluster as jc
from jupyter_cluster.widgets._training import TrainingView
from jupyter_cluster.widgets._trials import TrialsView


def train_func(config: dict[str, Any]) -> None:
    import time

    import ray.train
    import torch
    from ray.train.torch import prepare_model

    model = prepare_model(torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(config["epochs"]):
        x = torch.randn(256, 32)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.2)
        ray.train.report({"epoch": epoch, "loss": float(loss), "sent": time.time()})


def trainable(config: dict[str, Any]) -> None:
    import time

    from ray import tune

    for i in range(10):
        time.sleep(0.1)
        tune.report({"score": config["x"] * i, "sent": time.time()})


DIRECT_TRAIN = """
import os, time
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
if same_setup:
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
else:
    os.environ.pop("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", None)
trainer = TorchTrainer(
    train_func,
    train_loop_config={"epochs": epochs},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(storage_path=os.path.expanduser("~/ray_results/bench")),
)
if same_setup:
    from jupyter_cluster.agent.runs._train import _without_cleaner
    _without_cleaner(trainer)
start = time.perf_counter()
trainer.fit()
seconds = time.perf_counter() - start
"""

DIRECT_TUNE = """
import os, time
from ray import tune
tuner = tune.Tuner(
    trainable,
    param_space={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
    tune_config=tune.TuneConfig(metric="score", mode="max"),
    run_config=tune.RunConfig(storage_path=os.path.expanduser("~/ray_results/bench"), verbose=0),
)
start = time.perf_counter()
tuner.fit()
seconds = time.perf_counter() - start
"""


def helper_train(epochs: int, latencies: list[float]) -> float:
    start = time.perf_counter()
    run = jc.train_torch(train_func, num_workers=2, config={"epochs": epochs}, block=False, progress=False)
    _watch(run, TrainingView("bench", 2), latencies)
    run.result()
    return time.perf_counter() - start


def helper_tune(latencies: list[float]) -> float:
    start = time.perf_counter()
    space = {"x": jc.grid_search([1.0, 2.0, 3.0, 4.0])}
    run = jc.tune(trainable, space, metric="score", mode="max", block=False, progress=False)
    _watch(run, TrialsView("bench", "score", "max"), latencies)
    run.result()
    return time.perf_counter() - start


def _watch(run: Any, view: Any, latencies: list[float]) -> None:
    """Draw the run's events into ``view``; note, per report, when the widget had it."""

    def listen(event: str, data: Any) -> None:
        if event != run.kind or not isinstance(data, dict):
            return
        view.on_event(event, data, run)
        sent = (data.get("metrics") or {}).get("sent")
        if data.get("type") in ("report", "result") and sent is not None:
            latencies.append(time.time() - sent)

    run.cell.subscribe(listen)


def direct(source: str, **inputs: Any) -> float:
    cluster = jc.current()
    assert cluster is not None
    cell = cluster.run_cell(source, mode="driver", namespace=inputs, out=["seconds"])
    return float(cell.result().outputs["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    jc.local(cpus=2)
    times: dict[str, list[float]] = {k: [] for k in ("helper", "direct", "direct_same", "tune_helper", "tune_direct")}
    train_latency: list[float] = []
    tune_latency: list[float] = []
    try:
        # A first run of each warms up imports and worker processes; it is not counted.
        helper_train(2, [])
        direct(DIRECT_TUNE, trainable=trainable)
        for r in range(args.rounds):
            # Interleaved, the order turned each round.
            order = ["helper", "direct", "direct_same"] if r % 2 == 0 else ["direct_same", "direct", "helper"]
            for kind in order:
                if kind == "helper":
                    seconds = helper_train(args.epochs, train_latency)
                else:
                    same = kind == "direct_same"
                    seconds = direct(DIRECT_TRAIN, train_func=train_func, epochs=args.epochs, same_setup=same)
                times[kind].append(seconds)
                print(f"round {r + 1}: train {kind:12s} {seconds:6.1f} s", flush=True)
            for kind in ["tune_helper", "tune_direct"] if r % 2 == 0 else ["tune_direct", "tune_helper"]:
                seconds = (
                    helper_tune(tune_latency) if kind == "tune_helper" else direct(DIRECT_TUNE, trainable=trainable)
                )
                times[kind].append(seconds)
                print(f"round {r + 1}: {kind:18s} {seconds:6.1f} s", flush=True)
    finally:
        cluster = jc.current()
        if cluster is not None:
            cluster.down()
    med = {k: statistics.median(v) for k, v in times.items()}
    print()
    print(f"Train, 2 workers, {args.epochs} reports ({args.rounds} rounds, median wall time):")
    print(f"  jc.train_torch                          {med['helper']:6.1f} s")
    print(
        f"  TorchTrainer.fit() in a driver cell     {med['direct']:6.1f} s   ratio {med['helper'] / med['direct']:.2f}"
    )
    print(
        f"  the same, without the cleaner, 0.5 s poll {med['direct_same']:4.1f} s   "
        f"ratio {med['helper'] / med['direct_same']:.2f}"
    )
    print("Tune, 4 trials x 10 iterations:")
    print(f"  jc.tune                                 {med['tune_helper']:6.1f} s")
    print(
        f"  Tuner.fit() in a driver cell            {med['tune_direct']:6.1f} s   "
        f"ratio {med['tune_helper'] / med['tune_direct']:.2f}"
    )
    for name, values in (("train report", train_latency), ("tune result", tune_latency)):
        values = sorted(values)
        p95 = values[int(0.95 * (len(values) - 1))]
        print(
            f"{name} -> widget: median {statistics.median(values) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
            f"max {values[-1] * 1000:.0f} ms ({len(values)} reports)"
        )


if __name__ == "__main__":
    main()
