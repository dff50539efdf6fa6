"""``jc.train_torch`` on the cluster: Ray Train's ``TorchTrainer``, driven from a runner actor.

:func:`run_train` runs in the run's own actor on the head (the Ray Train driver). The
notebook's ``train_func`` is wrapped so that, in every training worker, each
``ray.train.report`` is also sent to the notebook the moment it is made (rank, time,
metrics), the worker's printed output goes to the cell prefixed with its rank, and an
exception is sent with the notebook's own frames before Ray Train sees it.

:func:`creator_loop` is the training loop of the older creator-style API
(``model_creator``, ``data_creator``, ``optimizer_creator``, ``loss_creator``): a
prepared model and loaders, train and validation loss and accuracy each epoch, and a
checkpoint of the final state.
"""

from __future__ import annotations

import builtins
import inspect
import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ..cells._output import PLACEMENT_GROUP
from ._runs import (
    DEFAULT_STORAGE,
    Captured,
    RunError,
    Sender,
    check_bundles,
    cluster_totals,
    current_sender,
    numbers,
    relay_of_current,
)


def takes_config(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes the config (Ray Train calls ``train_func()`` or ``train_func(config)``)."""
    try:
        return len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        return True


class _Reporting:
    """Ray Train's report utilities with each report also sent to the notebook first."""

    def __init__(
        self, inner: Any, send: Callable[[str, Any], None], rank: int, world: int, keep: str | None = None
    ) -> None:
        self._inner = inner
        self._send = send
        self._rank = rank
        self._world = world
        self._count = 0
        self._keep = keep

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        self._count += 1
        if checkpoint is not None and self._keep is not None:
            checkpoint = _kept(checkpoint, self._keep, self._count)
        self._send(
            "train",
            {
                "type": "report",
                "rank": self._rank,
                "world": self._world,
                "report": self._count,
                "time": time.time(),
                "metrics": numbers(metrics),
                "checkpoint": checkpoint is not None,
            },
        )
        return self._inner.report(metrics, checkpoint, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _kept(checkpoint: Any, folder: str, number: int) -> Any:
    """Local mode's checkpoint, copied into the run's folder (Ray Train keeps a local-mode checkpoint where the
    training function made it: a temporary folder, gone once the function's ``with`` ends)."""
    import shutil

    from ray.train import Checkpoint

    kept = os.path.join(folder, f"checkpoint_{number:06d}")
    shutil.rmtree(kept, ignore_errors=True)
    with checkpoint.as_directory() as source:
        shutil.copytree(source, kept)
    return Checkpoint.from_directory(kept)


def wrap(
    train_func: Callable[..., Any], relay: str, cell_id: str, keep: str | None = None
) -> Callable[[dict[str, Any]], Any]:
    """``train_func`` as each worker runs it: reports, output and errors go to the notebook; ``keep``: the folder
    where local mode's checkpoints are kept."""
    with_config = takes_config(train_func)

    def train_func_in_notebook(config: dict[str, Any]) -> Any:
        import ray.train
        from ray.train.v2._internal.execution import train_fn_utils

        from ..cells._execute import failure_from

        context = ray.train.get_context()
        rank, world = context.get_world_rank(), context.get_world_size()
        send = Sender(relay, cell_id)
        utils = train_fn_utils.get_train_fn_utils()
        train_fn_utils.set_train_fn_utils(_Reporting(utils, send, rank, world, keep))
        prefix = f"(rank {rank}) " if world > 1 else ""
        # Ray Train sends print() to its logger as well (a second copy once stdout is
        # captured) and logs each report: the cell shows the prints once, the reports drawn.
        try:
            from ray.train.v2._internal.logging.patch_print import _original_print

            builtins.print = _original_print
        except ImportError:
            pass
        logging.getLogger("ray.train").setLevel(logging.WARNING)
        try:  # "Reporting training result N: ..." (a logger named by its file)
            from ray.train.v2._internal.execution import context as train_context

            logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
        except ImportError:
            pass
        try:
            with Captured(send, 1000 + rank, prefix):
                return train_func(config) if with_config else train_func()
        except Exception as exc:  # not SystemExit: how Ray stops a trial or worker it is done with
            send("train", {"type": "error", "rank": rank, "time": time.time(), "failure": failure_from(exc, "", "")})
            raise
        finally:
            train_fn_utils.set_train_fn_utils(utils)
            send.flush()

    train_func_in_notebook.__name__ = getattr(train_func, "__name__", "train_func")
    return train_func_in_notebook


def _callbacks(relay: str, cell_id: str) -> list[Any]:
    """Ray Train callbacks of the run: one that tells the agent each worker group's
    placement group (removed by the agent should the run be killed: see ``CellRunner._end_run``)."""
    try:
        from ray.train.v2._internal.execution.callback import WorkerGroupCallback
    except ImportError:
        return []

    class PlacementGroups(WorkerGroupCallback):
        def after_worker_group_start(self, worker_group: Any) -> None:
            try:
                group = worker_group.get_worker_group_state().placement_group_handle.placement_group
                send = Sender(relay, cell_id)
                send(PLACEMENT_GROUP, group.id.hex())
                send.flush()
            except Exception:  # another Ray Train: its own cleaner stays on (see _without_cleaner)
                pass

    return [PlacementGroups()]


def _without_cleaner(trainer: Any) -> None:
    """Leave out Ray Train's placement-group cleaner for this trainer.

    The cleaner is a detached actor that asks the State API (the Ray dashboard) whether
    the controller lives; with no dashboard (the embedded cluster) each question waits
    out its 10 s timeout, and stopping it adds 10-15 s to every run. The agent does its
    job here: it removes the run's placement groups when it kills the run.
    """
    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:
        return
    make = trainer._create_default_callbacks
    trainer._create_default_callbacks = lambda: [c for c in make() if not isinstance(c, PlacementGroupCleanerCallback)]


def _abort() -> None:
    """Abort the run as Ctrl-C does in a script: Ray Train's own SIGINT handler (installed
    in this, the runner's main thread, by ``fit``) aborts the controller, which stops the
    workers and removes their placement group."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and getattr(handler, "__name__", "") == "sigint_handler":
        try:
            handler(signal.SIGINT, None)
        except SystemExit:
            pass


def _checkpoint_info(checkpoint: Any, metrics: dict[str, Any] | None = None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    from ..cells._remote import node_ip

    fs = getattr(checkpoint, "filesystem", None)
    return {
        "path": checkpoint.path,
        "filesystem": type(fs).__name__ if fs is not None else "LocalFileSystem",
        "node": node_ip(),
        "metrics": numbers(metrics or {}),
    }


def run_train(train_func: Callable[..., Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
    """Fit a ``TorchTrainer`` as ``spec`` says; a summary the notebook turns into a result."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    send = current_sender()
    relay, cell_id = relay_of_current()
    num_workers = spec["num_workers"]
    per_worker = dict(spec.get("resources_per_worker") or {})
    per_worker.setdefault("CPU", 1.0)
    if spec.get("use_gpu"):
        per_worker.setdefault("GPU", 1.0)
    _, nodes = cluster_totals()
    why = check_bundles(f"training with {num_workers} worker(s)", [per_worker] * num_workers, nodes)
    if why:
        raise RunError(why)

    if train_func is None:  # the creator-style API
        train_func = creator_loop
    # A worker's report waits until the controller takes it, which it does when it polls
    # the workers (every 2 s by default): from a notebook, reports come faster than that.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    storage = spec.get("storage_path") or DEFAULT_STORAGE
    name = spec.get("name") or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{cell_id[-6:]}"
    keep = os.path.join(storage, name) if num_workers == 0 else None  # local mode's checkpoints
    for dataset in (spec.get("datasets") or {}).values():
        # Ray Data's own progress bars of each epoch's read (in the run's process, in local mode): the run's view
        # shows the training's progress. A dataset reads with the context it was made with.
        context = getattr(dataset, "context", None)
        if context is not None:
            context.enable_progress_bars = False
    trainer = TorchTrainer(
        wrap(train_func, relay, cell_id, keep),
        train_loop_config=spec.get("config") or {},
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=bool(spec.get("use_gpu")), resources_per_worker=per_worker
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=spec.get("max_failures", 0)),
            checkpoint_config=CheckpointConfig(num_to_keep=spec.get("keep_checkpoints")),
            callbacks=_callbacks(relay, cell_id),
        ),
        datasets=spec.get("datasets") or None,
    )
    _without_cleaner(trainer)
    left_out: list[str] = []
    if num_workers > 0 and spec.get("lean", True):
        from ._lean import lean

        left_out, note = lean(trainer, bool(spec.get("datasets")))
        if note:
            print(note, flush=True)
    send("train", {"type": "start", "time": time.time(), "num_workers": num_workers, "name": name})
    started = time.time()
    from ..watching._deaths import oom_kills

    kills = oom_kills()  # a worker the kernel kills for memory: named so, not as a failed health check
    summary: dict[str, Any] = {"name": name, "storage": storage, "node": ray.util.get_node_ip_address()}
    summary["left_out"] = left_out
    try:
        result = trainer.fit()
    except KeyboardInterrupt:
        _abort()
        raise
    except Exception as exc:  # the workers' own errors reached the notebook already, with their frames
        summary.update(error=_why(exc, kills), error_type=type(exc).__name__)
        summary["checkpoint"] = None
    else:
        summary.update(
            error=None,
            metrics=numbers(result.metrics or {}),
            checkpoint=_checkpoint_info(result.checkpoint, result.metrics),
            path=result.path or keep,
        )
    summary["elapsed"] = time.time() - started
    send("train", {"type": "end", "time": time.time(), "error": summary.get("error")})
    send.flush()
    return summary


def run_train_with(
    train_func: Callable[..., Any] | None, spec: dict[str, Any], datasets: dict[str, Any]
) -> dict[str, Any]:
    """:func:`run_train` with Ray datasets (made in driver cells, passed as handles)."""
    return run_train(train_func, {**spec, "datasets": datasets})


def _why(exc: BaseException, kills_before: int | None = None) -> str:
    """A training failure in a few lines: each failed worker's error, not Ray's wrapping; a worker that died for
    memory (see :func:`._deaths.memory_failure`; ``kills_before``: the kernel's OOM kills when the run started), so."""
    from ..watching._deaths import memory_failure

    failures = getattr(exc, "worker_failures", None)
    if failures:
        lines = []
        for rank, error in sorted(failures.items()):
            base = getattr(error, "_base_exc", error)
            memory = memory_failure(base, kills_before)
            lines.append(f"worker {rank}: {memory}" if memory else f"worker {rank}: {type(base).__name__}: {base}")
        return "training failed: " + "; ".join(lines)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# -------------------------------------------------------- the creator-style API


def creator_loop(config: dict[str, Any]) -> None:
    """The loop the creator-style ``TorchTrainer`` ran: ``config["_creators"]`` holds the
    creators, ``config["_epochs"]`` the number of epochs; the rest is the user's config."""
    import ray.train
    import torch
    from ray.train import Checkpoint
    from ray.train.torch import prepare_data_loader, prepare_model

    creators = config["_creators"]
    epochs = int(config["_epochs"])
    user = {k: v for k, v in config.items() if not k.startswith("_")}
    model = creators["model"](user)
    loaders = creators["data"](user)
    if isinstance(loaders, (tuple, list)):
        train_loader, val_loader = loaders[0], (loaders[1] if len(loaders) > 1 else None)
    else:
        train_loader, val_loader = loaders, None
    optimizer = creators["optimizer"](model, user)
    loss = creators["loss"]
    criterion = (
        loss(user) if callable(loss) and not isinstance(loss, torch.nn.Module) and not isinstance(loss, type) else loss
    )
    if isinstance(criterion, type):
        criterion = criterion()
    scheduler = creators["scheduler"](optimizer, user) if creators.get("scheduler") else None
    model = prepare_model(model)
    train_loader = prepare_data_loader(train_loader)
    if val_loader is not None:
        val_loader = prepare_data_loader(val_loader)
    rank = ray.train.get_context().get_world_rank()
    for epoch in range(1, epochs + 1):
        if ray.train.get_context().get_world_size() > 1 and hasattr(train_loader, "sampler"):
            sampler = train_loader.sampler
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        metrics = {"epoch": epoch, **_epoch(model, train_loader, criterion, optimizer, "train")}
        if val_loader is not None:
            with torch.no_grad():
                metrics.update(_epoch(model, val_loader, criterion, None, "val"))
        if scheduler is not None:
            scheduler.step()
        if epoch == epochs and rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()  # type: ignore[union-attr]
                torch.save(state, os.path.join(folder, "model.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)


def _epoch(model: Any, loader: Any, criterion: Any, optimizer: Any, prefix: str) -> dict[str, float]:
    """One pass over ``loader`` (training when ``optimizer`` is given): mean loss, and
    accuracy when the model's outputs are class scores and the targets class indices,
    over all the workers."""
    import torch

    model.train(optimizer is not None)
    total_loss, seen, correct, classify = 0.0, 0.0, 0.0, True
    for batch in loader:
        features, target = batch[0], batch[1]
        output = model(features)
        loss = criterion(output, target)
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        n = len(target)
        total_loss += float(loss.detach()) * n
        seen += n
        if classify and output.dim() == 2 and output.shape[1] > 1 and not torch.is_floating_point(target):
            correct += int((output.argmax(dim=1) == target).sum())
        else:
            classify = False
    # Summed over the workers (each saw its shard), as the creator-style trainer reported them.
    totals = [total_loss, float(seen), float(correct), 1.0 if classify else 0.0]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        tensor = torch.tensor(totals, dtype=torch.float64)
        torch.distributed.all_reduce(tensor)
        totals = tensor.tolist()
        totals[3] = 1.0 if totals[3] == torch.distributed.get_world_size() else 0.0
    total_loss, seen, correct, classify = totals[0], totals[1], totals[2], totals[3] == 1.0
    metrics = {f"{prefix}_loss": total_loss / max(seen, 1)}
    if classify and seen:
        metrics[f"{prefix}_accuracy"] = correct / seen
    return metrics


# ----------------------------------------------------------- checkpoint files


def read_checkpoint(path: str, limit: int = 2 << 30) -> dict[str, bytes]:
    """The files of the checkpoint at ``path`` (local to the head, or any URI Ray's
    storage takes), by relative name."""
    if not os.path.isdir(path):
        from ray.train import Checkpoint

        path = Checkpoint(path).to_directory(tempfile.mkdtemp(prefix="jc-checkpoint-"))
    files: dict[str, bytes] = {}
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            total += os.path.getsize(full)
            if total > limit:
                raise RunError(f"the checkpoint at {path} is over {limit >> 20} MiB: copy it from the head instead")
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    return files


__all__ = ["creator_loop", "read_checkpoint", "run_train", "run_train_with", "takes_config", "wrap"]
