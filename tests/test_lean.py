"""Lean Ray Train runs: no helper that a fixed cluster does not need, Ray's defaults where Ray is other than expected.

On the shared embedded cluster (no autoscaler; test_runs.py checks that a two-worker run starts none of the helpers
a fixed cluster does not need): local mode (``num_workers=0``) starts no Train actor at all and keeps its checkpoint.
The Ray internals a lean run leans on are checked against the installed Ray.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

import jupyter_cluster as jc
from jupyter_cluster.agent.runs import _lean

from .test_runs import kinds_started, run_actors_ever_started

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_the_ray_internals_a_lean_run_leans_on_are_as_this_ray_has_them() -> None:
    """Fails when Ray changes under the lean runs: check :data:`_lean.INTERNALS` in the new Ray, then add its
    version to CHECKED_ON."""
    import ray

    assert _lean.problems() == [], f"Ray {ray.__version__}: {_lean.problems()}"
    assert _lean.INTERNALS and all(_lean.INTERNALS.values())


def train_local(config: dict[str, Any]) -> None:
    import os
    import tempfile

    import ray.train
    from ray.train import Checkpoint

    context = ray.train.get_context()
    print(f"rank {context.get_world_rank()} of {context.get_world_size()}")
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.txt"), "w") as f:
                f.write(f"epoch {epoch}")
            ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)}, checkpoint=Checkpoint.from_directory(folder))


def test_local_mode_starts_no_train_actor_and_keeps_its_checkpoint(cluster: jc.Cluster, capsys: Any) -> None:
    before = run_actors_ever_started(cluster)
    result = jc.train_torch(train_local, num_workers=0)
    assert result.error is None
    assert [(r["rank"], r["epoch"]) for r in result.reports] == [(0, 0), (0, 1), (0, 2)]
    assert kinds_started(before, run_actors_ever_started(cluster)) == [], "local mode runs in the run's own process"
    assert result.checkpoint is not None
    folder = jc.get(result.checkpoint)  # kept, although the function's temporary folder is gone
    assert (folder / "state.txt").read_text() == "epoch 2"
    assert "rank 0 of 1" in capsys.readouterr().out
    # It held a worker's CPU while it trained, and gives it back: no spare actor waits holding it.
    deadline = time.monotonic() + 30
    while cluster.status().data["available"].get("CPU") != 2:  # type: ignore[index]
        assert time.monotonic() < deadline, cluster.status().data
        time.sleep(0.5)


def test_local_mode_is_refused_with_a_gpu_and_a_negative_count_is_named(cluster: jc.Cluster) -> None:
    with pytest.raises(jc.InputError, match="local mode"):
        jc.train_torch(train_local, num_workers=0, use_gpu=True)
    with pytest.raises(jc.InputError, match=r"num_workers must be a whole number.*-1"):
        jc.train_torch(train_local, num_workers=-1)


def test_where_ray_differs_the_run_keeps_rays_defaults_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    class Trainer:
        def _initialize_and_run_controller(self, **kwargs: Any) -> str:
            return "ray's own"

        def _create_default_callbacks(self) -> list[Any]:
            return ["ray's callbacks"]

    trainer = Trainer()
    monkeypatch.setattr(_lean, "problems", lambda: ["coordinator: not as expected"])
    left_out, note = _lean.lean(trainer, has_datasets=False)
    assert left_out == [] and "uses Ray Train's defaults" in note and "coordinator: not as expected" in note
    assert trainer._create_default_callbacks() == ["ray's callbacks"]  # untouched
    assert trainer._initialize_and_run_controller() == "ray's own"


def test_an_autoscaler_is_seen_from_its_monitors_command_line(cluster: jc.Cluster) -> None:
    """Ray's monitor of this cluster with an autoscaling config: an autoscaler; the embedded cluster's (none): no
    autoscaler. Another cluster's monitor on the same machine, with an autoscaler, says nothing of this one."""
    gcs = cluster.run_cell("import ray\nray.get_runtime_context().gcs_address", mode="driver").result(60).value
    assert _lean.autoscaled(gcs) is False  # the shared embedded cluster's read-only monitor
    monitor = [sys.executable, "-c", "import time; time.sleep(60)", "/x/ray/autoscaler/v2/monitor.py"]
    another = subprocess.Popen([*monitor, "--autoscaling-config=/tmp/other.yaml", "--gcs-address=10.9.9.9:6379"])
    try:
        deadline = time.monotonic() + 10
        while _lean.autoscaled("10.9.9.9:6379") is not True:
            assert time.monotonic() < deadline, "a monitor with an autoscaling config was not seen"
            time.sleep(0.1)
        assert _lean.autoscaled(gcs) is False, "another cluster's autoscaler was taken for this one's"
        ours = subprocess.Popen([*monitor, "--autoscaling-config=/tmp/cluster.yaml", f"--gcs-address={gcs}"])
        try:
            while _lean.autoscaled(gcs) is not True:
                assert time.monotonic() < deadline, "this cluster's monitor with an autoscaling config was not seen"
                time.sleep(0.1)
        finally:
            ours.kill()
            ours.wait()
    finally:
        another.kill()
        another.wait()


def model_creator(config: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def data_creator(config: dict[str, Any]) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=16), DataLoader(TensorDataset(x, y), batch_size=64)


def optimizer_creator(model: Any, config: dict[str, Any]) -> Any:
    import torch

    return torch.optim.SGD(model.parameters(), lr=config["lr"])


def loss_creator(config: dict[str, Any]) -> Any:
    import torch

    return torch.nn.CrossEntropyLoss()


def test_the_creator_style_api_in_local_mode(cluster: jc.Cluster) -> None:
    """The older TorchTrainer's creators: training and validation loss and accuracy each epoch, a checkpoint."""
    result = jc.train_torch(
        model_creator=model_creator,
        data_creator=data_creator,
        optimizer_creator=optimizer_creator,
        loss_creator=loss_creator,
        config={"lr": 0.1},
        num_workers=0,
        epochs=3,
    )
    assert result.error is None and [r["epoch"] for r in result.reports] == [1, 2, 3]
    assert {"train_loss", "train_accuracy", "val_loss", "val_accuracy"} <= set(result.final), result.final
    assert 0.0 <= result.final["val_accuracy"] <= 1.0 and result.checkpoint is not None
    assert sorted(p.name for p in jc.get(result.checkpoint).iterdir()) == ["model.pt"]
