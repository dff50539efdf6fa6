"""``jc.train_torch`` and ``jc.tune`` on the shared embedded cluster (2 CPUs), for real.

Runs are Ray Train and Ray Tune runs; their results are checked against what the
training functions did. After every run that was stopped or failed, the cluster is
checked for leftovers: no Ray Train worker, trial or runner actor alive, no placement
group holding resources, both CPUs free again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster import CellInterrupted, InputError, RunError, SpaceError
from jupyter_cluster._handles import format_duration

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

LEFTOVERS = """
import ray
from ray._private import state
from ray.util.placement_group import placement_group_table

kinds = ("RayTrainWorker", "TrainController", "ImplicitFunc", "CellNamespace")
alive = sorted(
    a["ActorClassName"] for a in state.actors().values()
    if a["State"] != "DEAD" and any(k in a["ActorClassName"] for k in kinds)
)
groups = [g for g in placement_group_table().values() if g["state"] != "REMOVED"]
free = ray.available_resources().get("CPU", 0)
"""


def leftovers(cluster: jc.Cluster, wait: float = 20.0) -> dict[str, Any]:
    """What is still alive of earlier runs, once it had ``wait`` s to go (the shared
    cluster's own named actors of other tests excepted: only runs' kinds are counted)."""
    deadline = time.monotonic() + wait
    while True:
        out = cluster.run_cell(LEFTOVERS, mode="driver", out=["alive", "groups", "free"]).result().outputs
        runs = [a for a in out["alive"] if a != "CellNamespace"]
        clean = not runs and not out["groups"] and out["free"] >= 2
        if clean or time.monotonic() > deadline:
            return {**out, "alive": runs}
        time.sleep(1.0)


def assert_clean(cluster: jc.Cluster) -> None:
    found = leftovers(cluster)
    assert found["alive"] == [], f"actors of a run still alive: {found['alive']}"
    assert found["groups"] == [], f"placement groups still held: {found['groups']}"
    assert found["free"] >= 2, found


# ------------------------------------------------------------------ bad input


def train_ok(config: dict[str, Any]) -> None:
    import ray.train

    ray.train.report({"loss": 1.0})


def test_bad_input_is_refused_before_anything_runs(cluster: jc.Cluster) -> None:
    cases: list[tuple[Any, str]] = [
        (lambda: jc.train_torch(train_ok, num_workers=-1), "num_workers must be a whole number (0: Ray Train's local"),
        (lambda: jc.train_torch(train_ok, num_workers=0, use_gpu=True), "use_gpu=True needs num_workers=1 or more"),
        (lambda: jc.train_torch(train_ok, num_workers="2"), "not '2'"),
        (lambda: jc.train_torch(train_ok, num_workers=2, use_gpu="yes"), "use_gpu must be True or False"),
        (lambda: jc.train_torch("train_ok", num_workers=2), "train_func must be a function"),
        (lambda: jc.train_torch(num_workers=2), "needs a train_func"),
        (lambda: jc.train_torch(train_ok, num_workers=2, config=[1]), "config must be a dict"),
        (lambda: jc.train_torch(train_ok, num_workers=2, model_creator=train_ok), "not both"),
        (lambda: jc.train_torch(model_creator=train_ok, num_workers=2, epochs=1), "missing: data_creator"),
        (
            lambda: jc.train_torch(
                model_creator=train_ok,
                data_creator=train_ok,
                optimizer_creator=train_ok,
                loss_creator=train_ok,
                num_workers=2,
            ),
            "needs epochs=N",
        ),
        (lambda: jc.train_torch(train_ok, num_workers=1, resources_per_worker={"CPU": -1}), "resources_per_worker"),
        (lambda: jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="least"), 'mode must be "min" or "max"'),
        (lambda: jc.tune(train_ok, {"lr": 0.1}, metric="", mode="min"), "metric must name"),
        (lambda: jc.tune(train_ok, [0.1], metric="loss", mode="min"), "param_space must be a dict"),
        (
            lambda: jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="min", scheduler="asah"),
            "unknown scheduler 'asah'",
        ),
        (lambda: jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="min", search_alg="grid"), "unknown search_alg"),
        (lambda: jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="min", num_samples=0), "num_samples"),
        (
            lambda: jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="min", reuse_actors="yes"),
            "reuse_actors must be True, False or None",
        ),
        (lambda: jc.uniform(1.0, 0.1), "the lower bound must be below the upper one"),
        (lambda: jc.loguniform(0, 1), "must be positive"),
        (lambda: jc.randint(3, 3), "is empty"),
        (lambda: jc.choice([]), "no options"),
        (lambda: jc.choice("abc"), "takes a list"),
        (lambda: jc.grid_search([]), "non-empty list"),
    ]
    for call, message in cases:
        with pytest.raises((InputError, SpaceError)) as caught:
            call()
        assert message in str(caught.value), (message, str(caught.value))
    assert cluster.cells == {}, "nothing may have been sent"


def test_a_search_domain_of_another_library_is_refused(cluster: jc.Cluster) -> None:
    import optuna

    space = {"model": {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)}, "layers": 2}
    with pytest.raises(SpaceError) as caught:
        jc.tune(train_ok, space, metric="loss", mode="min")
    message = str(caught.value)
    assert "param_space['model']['lr'] is a optuna.distributions.FloatDistribution" in message
    assert "jc.loguniform" in message


def test_a_train_func_that_cannot_be_sent_names_what_cannot(cluster: jc.Cluster) -> None:
    lock = threading.Lock()

    def train_locked(config: dict[str, Any]) -> None:
        with lock:
            pass

    with pytest.raises(InputError) as caught:
        jc.train_torch(train_locked, num_workers=1)
    message = str(caught.value)
    assert "train_locked" in message and "`lock`" in message and "lock" in message.split("`lock`")[1], message
    assert cluster.run_cell("x = 1").result().outputs == {"x": 1}  # the cluster goes on


EVER_STARTED = """
from ray._private import state

kinds = ("RayTrainWorker", "TrainController", "ImplicitFunc", "SynchronizationActor", "PreemptionWatcher",
         "_AutoscalingCoordinatorActor", "DatasetManager")
started = sorted((a["ActorClassName"], a["ActorID"]) for a in state.actors().values()
                 if any(k in a["ActorClassName"] for k in kinds))
"""
#: A lean run's helpers, left out without an autoscaler and in a run without datasets (agent/runs/_lean.py).
LEFT_OUT = ("PreemptionWatcher", "_AutoscalingCoordinatorActor", "DatasetManager")


def run_actors_ever_started(cluster: jc.Cluster) -> set[tuple[str, str]]:
    """``(class, id)`` of every Ray Train and Tune actor this cluster has ever had (workers, controllers, trials,
    Ray Train's helpers), dead ones included."""
    out = cluster.run_cell(EVER_STARTED, mode="driver", out=["started"]).result().outputs["started"]
    return {(kind, actor) for kind, actor in out}


def kinds_started(before: set[tuple[str, str]], after: set[tuple[str, str]]) -> list[str]:
    return sorted({kind for kind, _ in after - before})


def test_what_the_cluster_can_never_hold_fails_at_once(cluster: jc.Cluster) -> None:
    before = run_actors_ever_started(cluster)
    with pytest.raises(RunError) as caught:
        jc.train_torch(train_ok, num_workers=5)
    assert "training with 5 worker(s) needs 5 CPU" in str(caught.value)
    assert "2 CPU" in str(caught.value), str(caught.value)
    with pytest.raises(RunError) as caught:
        jc.train_torch(train_ok, num_workers=1, use_gpu=True)
    assert "no GPU" in str(caught.value) and "use_gpu" in str(caught.value)
    with pytest.raises(RunError) as caught:
        jc.tune(train_ok, {"lr": 0.1}, metric="loss", mode="min", resources_per_trial={"CPU": 3})
    assert "each trial needs 3 CPU" in str(caught.value)
    assert run_actors_ever_started(cluster) == before, "each refusal comes before any worker or trial starts"
    assert_clean(cluster)


# ---------------------------------------------------------------------- train


def train_two_workers(config: dict[str, Any]) -> None:
    import os
    import tempfile

    import ray.train
    import torch
    from ray.train.torch import prepare_model

    rank = ray.train.get_context().get_world_rank()
    model = prepare_model(torch.nn.Linear(2, 1))
    for epoch in range(1, config["epochs"] + 1):
        print(f"epoch {epoch} on rank {rank}")
        metrics = {"epoch": epoch, "loss": 1.0 / epoch + rank, "shared": 2.0 * epoch}
        if rank == 0 and epoch == config["epochs"]:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "note.txt"), "w") as f:
                    f.write("epoch 3")
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
        if config.get("fail_at") == epoch and rank == 1:
            raise ValueError(f"rank {rank} gave up at epoch {epoch}")


@pytest.fixture
def in_a_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs draw their live view, as in a notebook."""
    from jupyter_cluster import _cluster

    monkeypatch.setattr(_cluster, "_in_kernel", lambda: True)


def test_train_torch_reports_every_worker_and_fetches_the_checkpoint(
    cluster: jc.Cluster, tmp_path: Any, in_a_notebook: None
) -> None:
    before = run_actors_ever_started(cluster)
    run = jc.train_torch(train_two_workers, num_workers=2, config={"epochs": 3}, block=False)
    result = run.wait()
    assert result.error is None
    # A lean run on a cluster without an autoscaler: its controller and workers, none of the helpers left out.
    kinds = kinds_started(before, run_actors_ever_started(cluster))
    assert "TrainController" in kinds and "RayTrainWorker" in kinds, kinds
    assert not set(LEFT_OUT) & set(kinds), f"a helper a fixed cluster does not need started: {kinds}"
    # The live view ends with the result's own run time: one clock, one number.
    shown = format_duration(result.elapsed)
    assert f"run time {shown}" in run.widget.snapshot() and f"done in {shown}" in repr(result), run.widget.snapshot()
    frame = result.metrics
    assert sorted(frame["rank"]) == [0, 0, 0, 1, 1, 1]
    assert list(frame.columns[:3]) == ["rank", "report", "time"]
    by_rank = frame.pivot_table(index="epoch", columns="rank", values="loss")
    assert by_rank[0].tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    assert by_rank[1].tolist() == pytest.approx([2.0, 1.5, 4 / 3])
    assert result.final == {"epoch": 3, "loss": pytest.approx(1 / 3), "shared": 6.0}
    assert result.checkpoint is not None
    folder = jc.get(result.checkpoint)
    assert sorted(p.name for p in folder.iterdir()) == ["model.pt", "note.txt"]
    assert (folder / "note.txt").read_text() == "epoch 3"
    state = result.checkpoint.state_dict()
    assert sorted(state) == ["bias", "weight"] and tuple(state["weight"].shape) == (1, 2)
    copy = result.checkpoint.to_directory(tmp_path / "copy")
    assert (copy / "model.pt").read_bytes() == (folder / "model.pt").read_bytes()


def test_a_worker_that_raises_fails_the_run_with_its_own_traceback(cluster: jc.Cluster) -> None:
    result = jc.train_torch(train_two_workers, num_workers=2, config={"epochs": 3, "fail_at": 2})
    assert isinstance(result.error, ValueError), repr(result.error)
    assert "rank 1 gave up at epoch 2" in str(result.error)
    frames = result.error.failure.frames
    assert frames and frames[-1][0] == __file__ and frames[-1][2] == "train_two_workers", frames
    assert 'raise ValueError(f"rank {rank} gave up at epoch {epoch}")' in frames[-1][3]
    assert {(r["rank"], r["epoch"]) for r in result.reports} >= {(0, 1), (1, 1), (0, 2), (1, 2)}
    assert_clean(cluster)


def test_interrupting_a_training_run_stops_its_workers(cluster: jc.Cluster) -> None:
    def train_forever(config: dict[str, Any]) -> None:
        import time

        import ray.train

        step = 0
        while True:
            step += 1
            ray.train.report({"step": step})
            time.sleep(0.2)

    run = jc.train_torch(train_forever, num_workers=2, block=False)
    deadline = time.monotonic() + 120
    while sum(e.get("type") == "report" for e in run.events) < 4:
        assert time.monotonic() < deadline, "no reports"
        assert not run.done(), run.cell.exception()
        time.sleep(0.2)
    assert run.cancel()
    with pytest.raises(CellInterrupted):
        run.result(timeout=60)
    assert_clean(cluster)
    assert cluster.run_cell("y = 2").result().outputs == {"y": 2}


# ----------------------------------------------------------------------- tune


def trainable(config: dict[str, Any]) -> None:
    from ray import tune

    for i in range(1, 5):
        if config["lr"] > 0.5 and i == 3:
            raise ArithmeticError(f"lr {config['lr']} diverged")
        tune.report({"score": config["lr"] * i + config.get("bias", 0.0), "step": i})


def test_tune_marks_a_trial_that_raises_and_goes_on(cluster: jc.Cluster, in_a_notebook: None) -> None:
    space = {"lr": jc.grid_search([0.1, 0.2, 0.9]), "bias": jc.uniform(0.0, 0.01)}
    run = jc.tune(trainable, space, metric="score", mode="max", block=False)
    result = run.wait()
    # The live view's best is the result's (the failed trial's higher peak aside), and so is its run time.
    best = run.widget.best()
    assert best is not None and best[1]["last"] == result.best_result["score"], (best, result.best_result)
    assert f"run time {format_duration(result.elapsed)}" in run.widget.snapshot()
    trials = result.trials.set_index("config/lr")
    assert list(trials.loc[[0.1, 0.2], "state"]) == ["TERMINATED", "TERMINATED"]
    assert trials.loc[0.9, "state"] == "ERROR"
    assert "lr 0.9 diverged" in trials.loc[0.9, "error"] and "ArithmeticError" in trials.loc[0.9, "error"]
    failure = result.failures[trials.loc[0.9, "trial"]]
    assert isinstance(failure, ArithmeticError)  # raise it: its traceback is the trainable's own lines
    assert failure.failure.frames[-1][0] == __file__ and failure.failure.frames[-1][2] == "trainable"
    assert trials.loc[0.2, "iterations"] == 4
    assert result.best_config["lr"] == 0.2 and 0.0 <= result.best_config["bias"] <= 0.01
    assert result.best_result["score"] == pytest.approx(0.8 + result.best_config["bias"])
    assert len(result.history) >= 10
    assert_clean(cluster)


def test_a_metric_no_trial_reports_is_a_clear_error(cluster: jc.Cluster) -> None:
    with pytest.raises(RunError) as caught:
        jc.tune(trainable, {"lr": 0.1}, metric="accuracy", mode="max")
    message = str(caught.value)
    assert "metric='accuracy'" in message and "score, step" in message, message
    assert_clean(cluster)


@pytest.mark.slow
def test_schedulers_and_search_algorithms(cluster: jc.Cluster) -> None:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    optuna = jc.tune(
        trainable,
        {"lr": tune.uniform(0.01, 0.4)},  # Ray Tune's own domain
        metric="score",
        mode="max",
        num_samples=3,
        search_alg="optuna",
        scheduler=ASHAScheduler(max_t=4, grace_period=1),  # a Ray scheduler object
    )
    assert len(optuna.trials) == 3 and (optuna.trials["state"] != "ERROR").all()
    assert 0.01 <= optuna.best_config["lr"] <= 0.4
    bayes = jc.tune(
        trainable,
        {"lr": jc.uniform(0.01, 0.4), "bias": jc.uniform(0.0, 1.0)},
        metric="score",
        mode="max",
        num_samples=3,
        search_alg="bayesopt",
        search_options={"random_search_steps": 2},
    )
    assert len(bayes.trials) == 3 and {"config/lr", "config/bias"} <= set(bayes.trials.columns)
    assert (bayes.trials["state"] == "TERMINATED").all() and bayes.trials["error"].isna().all()
    band = jc.tune(
        trainable,
        {"lr": jc.choice([0.1, 0.2, 0.3, 0.4])},
        metric="score",
        mode="max",
        num_samples=4,
        scheduler="hyperband",
        scheduler_options={"max_t": 4},
    )
    assert len(band.trials) == 4 and band.trials["error"].isna().all()


def test_cancelling_a_sweep_stops_its_trials_and_survives_a_dropped_link(cluster: jc.Cluster) -> None:
    def slow(config: dict[str, Any]) -> None:
        import time

        from ray import tune

        for i in range(1, 10_000):
            time.sleep(0.1)
            tune.report({"score": i * config["lr"]})

    run = jc.tune(slow, {"lr": jc.grid_search([1.0, 2.0, 3.0])}, metric="score", mode="max", block=False)
    deadline = time.monotonic() + 120
    while sum(e.get("type") == "result" for e in run.events) < 3:
        assert time.monotonic() < deadline and not run.done()
        time.sleep(0.2)
    cluster._link.drop_connection()  # a Wi-Fi drop: the run goes on, its events come after
    seen = sum(e.get("type") == "result" for e in run.events)
    while sum(e.get("type") == "result" for e in run.events) < seen + 5:
        assert time.monotonic() < deadline and not run.done()
        time.sleep(0.2)
    assert run.cancel()
    with pytest.raises(CellInterrupted):
        run.result(timeout=60)
    assert_clean(cluster)


def test_interrupting_a_blocking_sweep_cancels_it(cluster: jc.Cluster) -> None:
    """Ctrl-C (the kernel's interrupt: KeyboardInterrupt in the main thread) during a blocking ``jc.tune``."""
    import _thread

    def slow(config: dict[str, Any]) -> None:
        import time

        from ray import tune

        for i in range(1, 10_000):
            time.sleep(0.1)
            tune.report({"score": i})

    timer = threading.Timer(12, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(CellInterrupted) as caught:
            jc.tune(slow, {"lr": jc.grid_search([1.0, 2.0])}, metric="score", mode="max")
    finally:
        timer.cancel()
    assert "cancelled jc.tune(slow)" in str(caught.value)
    assert time.monotonic() - started < 45, "the interrupted sweep took too long to stop"
    assert_clean(cluster)
    assert cluster.run_cell("z = 3").result().outputs == {"z": 3}
