"""Ray Train and Ray Tune from the notebook: ``jc.train_torch`` and ``jc.tune``.

A run is one cell, in an actor of its own on the head (the Ray Train or Ray Tune
driver), which the agent stops when the cell ends, and with it every worker, trial and
placement group of the run. So a run is interrupted, cancelled and survives a dropped
link exactly as a cell does. Its events (each report of each worker, each trial's
start, results and end) come with the cell and feed a live widget and the result:

- :class:`TrainResult`: ``.metrics`` (every report: rank, time, metrics), ``.checkpoint``
  (a :class:`Checkpoint` handle; ``jc.get`` copies its files here), ``.error``;
- :class:`TuneResult`: ``.best_config``, ``.best_result``, ``.trials``, ``.best_checkpoint``.

``block=False`` returns a :class:`Run` at once (``result()``, ``done()``, ``cancel()``).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from . import _views
from ._errors import CellInterrupted, ClusterError, InputError, RemoteError, remote_error
from ._handles import format_duration, format_metric
from .agent.runs._runs import flat
from .agent.runs._space import SpaceError, check

if TYPE_CHECKING:
    from ._cell import RemoteCell
    from ._cluster import Cluster


class RunError(ClusterError):
    """A training run or sweep that could not start, or failed as a whole."""


# ----------------------------------------------------------------- checkpoints


@dataclass
class Checkpoint:
    """A checkpoint on the cluster (the files stay there until asked for).

    ``jc.get(checkpoint)`` (or :meth:`to_directory`) copies its files to a local folder
    and returns the folder; :meth:`state_dict` loads the PyTorch state saved in it.
    """

    path: str
    node: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    cluster: Cluster | None = field(default=None, repr=False)
    _local: pathlib.Path | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"<Checkpoint {self.path} on {self.node or 'the head'}>"

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> pathlib.Path:
        """Copy the checkpoint's files into ``path`` (a new temporary folder by default)."""
        if path is None and self._local is not None and self._local.exists():
            return self._local
        if self.cluster is None:
            raise ClusterError("this checkpoint's cluster is not known: fetch it from the cluster that made it")
        files: dict[str, bytes] = self.cluster._call("checkpoint_files", {"path": self.path}, timeout=600)
        folder = pathlib.Path(path) if path is not None else pathlib.Path(tempfile.mkdtemp(prefix="jc-checkpoint-"))
        for name, data in files.items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if path is None:
            self._local = folder
        return folder

    def files(self) -> list[str]:
        """The checkpoint's file names (copied here first)."""
        root = self.to_directory()
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def state_dict(self, name: str | None = None, map_location: str = "cpu") -> Any:
        """``torch.load`` of the checkpoint's file ``name``, by default its only ``.pt``/``.pth``
        file (or ``model.pt``), onto the CPU."""
        import torch

        root = self.to_directory()
        if name is None:
            found = sorted(p for p in root.rglob("*") if p.suffix in (".pt", ".pth", ".bin"))
            preferred = [p for p in found if p.stem in ("model", "state_dict", "checkpoint")]
            if len(found) == 1 or preferred:
                path = (preferred or found)[0]
            else:
                names = ", ".join(str(p.relative_to(root)) for p in found) or "none"
                raise ClusterError(f"which file holds the state? name one: state_dict(name=...); .pt files: {names}")
        else:
            path = root / name
        return torch.load(path, map_location=map_location, weights_only=False)


def _checkpoint(info: dict[str, Any] | None, cluster: Cluster) -> Checkpoint | None:
    if not info:
        return None
    return Checkpoint(info["path"], info.get("node", ""), dict(info.get("metrics") or {}), cluster)


# ---------------------------------------------------------------------- results


def _frame(rows: list[dict[str, Any]]) -> Any:
    try:
        import pandas
    except ImportError as exc:
        raise ImportError("this table is a pandas DataFrame: pip install pandas (or read .reports)") from exc
    return pandas.DataFrame(rows)


@dataclass
class TrainResult:
    """What ``jc.train_torch`` gives back.

    ``reports`` is every ``ray.train.report`` of every worker, in order: ``rank``,
    ``report`` (1, 2, ...), ``time`` and the metrics; ``metrics`` is the same as a pandas
    DataFrame. ``final`` holds the metrics of the last report (rank 0's), ``checkpoint``
    the last checkpoint (or None), and ``error`` the exception that ended the run (None
    when it finished): raise it to see its traceback, which points into the notebook's
    own lines. ``elapsed`` is the run time in seconds, from the call to the run's end: what
    its live view says.
    """

    reports: list[dict[str, Any]]
    final: dict[str, Any]
    checkpoint: Checkpoint | None
    error: BaseException | None
    elapsed: float
    name: str = ""
    path: str = ""

    @property
    def metrics(self) -> Any:
        return _frame(self.reports)

    def __repr__(self) -> str:
        state = f"failed: {type(self.error).__name__}: {self.error}" if self.error else "done"
        shown = ", ".join(f"{k}={format_metric(v)}" for k, v in list(self.final.items())[:6])
        # As its view counts them: reports made (each worker makes each one), and the workers that made them.
        made = max((r.get("report", 0) for r in self.reports), default=0)
        workers = len({r.get("rank") for r in self.reports})
        per = f" by {workers} workers" if workers > 1 else ""
        return f"<TrainResult {state} in {format_duration(self.elapsed)}; {made} reports{per}; {shown}>"


@dataclass
class TuneResult:
    """What ``jc.tune`` gives back.

    ``best_config`` and ``best_result`` (its metrics) are those of the best trial by
    ``metric`` and ``mode``, judged by each trial's last result among the trials that did not
    fail (Ray Tune's own choice, and the live view's ``best``); ``trials`` is a pandas DataFrame of every trial (config
    columns as ``config/NAME``, state, iterations, last metrics, error); ``best_checkpoint``
    the best trial's best checkpoint (or None); ``history`` each result of each trial;
    ``failures`` the exception of each trial that raised, by trial id (raise one to see its
    traceback, which points into the notebook's own lines). ``elapsed`` is the run time in
    seconds, from the call to the sweep's end: what its live view says.
    """

    best_config: dict[str, Any] | None
    best_result: dict[str, Any] | None
    best_checkpoint: Checkpoint | None
    trial_rows: list[dict[str, Any]]
    history: list[dict[str, Any]]
    metric: str
    mode: str
    elapsed: float
    name: str = ""
    path: str = ""
    failures: dict[str, BaseException] = field(default_factory=dict)

    @property
    def trials(self) -> Any:
        return _frame(self.trial_rows)

    @property
    def errors(self) -> dict[str, str]:
        return {row["trial"]: row["error"] for row in self.trial_rows if row.get("error")}

    def __repr__(self) -> str:
        best = format_metric(self.best_result.get(self.metric)) if self.best_result else "none"
        return (
            f"<TuneResult {len(self.trial_rows)} trials in {format_duration(self.elapsed)}; best {self.metric}={best} "
            f"with {self.best_config}>"
        )


# -------------------------------------------------------------------------- runs


class Run:
    """A training run or sweep going on on the cluster (what ``block=False`` returns).

    ``result()`` waits for its result (or raises what stopped it), ``done()`` says
    whether it ended, ``cancel()`` stops it: Ray stops its workers and trials. ``widget``
    is its live view, which keeps updating while the notebook does other things.
    """

    def __init__(self, kind: str, cell: RemoteCell, view: Any, build: Callable[[Run, dict[str, Any]], Any]) -> None:
        self.kind = kind
        self.cell = cell
        self.widget = view
        self.events: list[dict[str, Any]] = []
        self.failures: dict[Any, BaseException] = {}
        #: Which failure is the run's own: the user's errors before Ray's, the first before the later (see _cause).
        self.failed_at: dict[Any, tuple[bool, float]] = {}
        #: The metric a sweep optimises and its mode ("min", "max"); None for a training run.
        self.metric: str | None = None
        self.mode: str | None = None
        #: The run's time, as its view and its result both say it: from the call to the end, on this machine's clock.
        self.started = time.time()
        self.ended: float | None = None
        self._build = build
        self._result: Any = None
        self._lock = threading.Lock()
        cell.subscribe(self._on_event)

    @property
    def label(self) -> str:
        return self.cell.label

    @property
    def elapsed(self) -> float:
        """Seconds from the call to the run's end (to now, while it runs)."""
        return (self.ended or time.time()) - self.started

    def _on_event(self, event: str, data: Any) -> None:
        if event in ("done", "error", "lost") and self.ended is None:
            self.ended = time.time()
        if event == self.kind:
            with self._lock:
                self.events.append(data)
            if data.get("type") == "error" and data.get("failure") is not None:
                key = data.get("rank", data.get("trial"))
                self.failures[key] = remote_error(data["failure"], "", self.cell.cell_id, self.label, "")
                self.failed_at[key] = (not data["failure"].module.startswith("ray"), -float(data.get("time", 0.0)))
        if self.widget is not None:
            try:
                self.widget.on_event(event, data, self)
            except Exception:  # a drawing problem must not stop the run's bookkeeping
                import logging

                logging.getLogger("jupyter_cluster").exception("the %s widget failed to draw an event", self.kind)

    def done(self) -> bool:
        return self.cell.done()

    def cancel(self) -> bool:
        """Stop the run: its workers or trials stop, and what they reported stays."""
        return self.cell.cancel()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the run to end; its :class:`TrainResult` or :class:`TuneResult`."""
        if self._result is None:
            try:
                outcome = self.cell.result(timeout)
            except RemoteError as exc:
                raise self._failed(exc) from None
            self._result = self._build(self, outcome.outputs["_jc_summary"])
        return self._result

    def _failed(self, exc: RemoteError) -> BaseException:
        """The run's own error (raised before any training): plain, without the runner's frames."""
        if exc.failure.type_name == "RunError":
            return RunError(exc.failure.message)
        if exc.failure.type_name == "SpaceError":
            return SpaceError(exc.failure.message)
        return exc

    def wait(self) -> Any:
        """Wait in the foreground: the workers' output is printed, an interrupt cancels the run."""
        write = _views.views.output()
        try:
            for event, data in self.cell.events():
                if event == "stream":
                    write(data)
        except KeyboardInterrupt:
            self.cancel()
            try:
                for _ in self.cell.events():
                    pass
            except KeyboardInterrupt:
                pass
            if self.widget is not None:
                self.widget.finish("cancelled", self)
            raise CellInterrupted(f"cancelled {self.label}: its workers and trials were stopped") from None
        return self.result()

    def __repr__(self) -> str:
        state = "done" if self.done() else self.cell.status
        return f"<Run {self.label} {state}>"


#: The cell a run is: the runner on the head, with the run's inputs as its namespace.
TRAIN_SOURCE = (
    "from jupyter_cluster.agent.runs._train import run_train\n_jc_summary = run_train(_jc_train_func, _jc_spec)\n"
)
TUNE_SOURCE = "from jupyter_cluster.agent.runs._tune import run_tune\n_jc_summary = run_tune(_jc_trainable, _jc_spec)\n"


def _culprit(value: Any, depth: int = 0, seen: set[int] | None = None) -> str | None:
    """What inside a function cannot be pickled: the global, closure variable or default
    it refers to (looked into when it is itself a function), as ```name` (a type)``."""
    import cloudpickle

    seen = seen if seen is not None else set()
    code = getattr(value, "__code__", None)
    if code is None or id(value) in seen or depth > 3:
        return None
    seen.add(id(value))
    refs: list[tuple[str, Any]] = []
    globals_ = getattr(value, "__globals__", {})
    refs += [(n, globals_[n]) for n in code.co_names if n in globals_]
    for name, cell in zip(code.co_freevars, value.__closure__ or (), strict=False):
        try:
            refs.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    refs += [(f"{code.co_name}'s default", d) for d in (value.__defaults__ or ())]
    for name, ref in refs:
        try:
            cloudpickle.dumps(ref)
        except Exception as exc:
            inner = _culprit(ref, depth + 1, seen)
            if inner:
                return inner
            return f"`{name}` (a {type(ref).__qualname__}: {type(exc).__name__}: {exc})"
    return None


def _check_sendable(what: str, value: Any) -> None:
    """Refuse, naming the culprit, a function that cannot travel to the cluster."""
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        name = getattr(value, "__name__", what)
        found = _culprit(value)
        where = f"it refers to {found}, which" if found else f"it ({type(exc).__name__}: {exc})"
        raise InputError(
            f"cannot send {what} `{name}` to the cluster: {where} cannot be pickled. Create that object "
            f"inside {name} instead (or pass what it is made from in config). Nothing was sent."
        ) from None


def _start(
    cluster: Cluster,
    kind: str,
    source: str,
    namespace: dict[str, Any],
    label: str,
    view: Any,
    build: Any,
    metric: str | None = None,
    mode: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    cpus: float = 0.0,
) -> Run:
    cell = cluster.run_cell(
        source,
        namespace=namespace,
        mode="actor",
        actor=f"{kind}-{uuid.uuid4().hex[:8]}",
        cpus=cpus,
        out=["_jc_summary"],
        label=label,
        ephemeral=True,
        runtime_env=runtime_env,
    )
    run = Run(kind, cell, view, build)
    run.metric, run.mode = metric, mode
    if view is not None:
        view.started(run)
    from ._cluster import tell

    tell("run", run)
    return run


def _view(progress: bool | None, make: Callable[[], Any]) -> Any:
    """The run's live widget, shown below the cell: in a notebook, unless ``progress=False``."""
    from ._cluster import _in_kernel

    if progress is False or not _in_kernel():
        return None
    view = make()
    view.show()
    return view


# ------------------------------------------------------------------- train_torch

CREATORS = ("model_creator", "data_creator", "optimizer_creator", "loss_creator")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive whole number, not {value!r}")
    return value


def _resources(name: str, value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        for k, v in value.items()
    ):
        raise InputError(f'{name} must map resource names to amounts, e.g. {{"CPU": 1}}, not {value!r}')
    return {k: float(v) for k, v in value.items()}


def train_torch(
    train_func: Callable[..., Any] | None = None,
    *,
    num_workers: int,
    use_gpu: bool = False,
    config: dict[str, Any] | None = None,
    datasets: dict[str, Any] | None = None,
    resources_per_worker: dict[str, float] | None = None,
    name: str | None = None,
    storage_path: str | None = None,
    max_failures: int = 0,
    keep_checkpoints: int | None = None,
    block: bool = True,
    progress: bool | None = None,
    model_creator: Callable[..., Any] | None = None,
    data_creator: Callable[..., Any] | None = None,
    optimizer_creator: Callable[..., Any] | None = None,
    loss_creator: Any = None,
    scheduler_creator: Callable[..., Any] | None = None,
    epochs: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    lean: bool = True,
    cluster: Cluster | None = None,
) -> Any:
    """Run ``train_func`` with Ray Train's ``TorchTrainer`` on ``num_workers`` workers.

    ``num_workers=0`` is Ray Train's local mode: ``train_func`` runs in the run's own process on
    the head, with a world size of 1, and no controller or worker actors start (the smallest
    footprint: a small machine, or a quick try; its checkpoints are kept in ``storage_path`` all
    the same). On a cluster without an autoscaler, a run leaves out Ray Train's helpers that
    serve clusters that change (the preemption watcher, the autoscaling coordinator), and a run
    without datasets its dataset manager (see the guide, "Training and tuning"); ``lean=False``
    keeps every helper Ray Train starts.

    ``train_func`` is ordinary Ray Train code (``prepare_model``, ``prepare_data_loader``,
    ``ray.train.report``, checkpoints), defined in the notebook. Each report of each
    worker appears in a live widget below the cell. Returns a :class:`TrainResult`, or
    with ``block=False`` a :class:`Run` at once. Interrupting the kernel stops the run.

    The creator-style API of the older ``TorchTrainer`` works too: pass
    ``model_creator``, ``data_creator``, ``optimizer_creator``, ``loss_creator`` (and
    ``scheduler_creator``), ``config`` and ``epochs`` instead of ``train_func``.

    ``runtime_env`` is Ray's, for the run and every worker it starts (``{"pip": [...]}``), over
    the session's.

    >>> result = jc.train_torch(train_func, num_workers=2, config={"lr": 0.01})  # doctest: +SKIP
    >>> result.metrics.tail()                                                    # doctest: +SKIP
    >>> model.load_state_dict(result.checkpoint.state_dict())                    # doctest: +SKIP
    """
    from ._cluster import attached

    cluster = cluster or attached()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise InputError(
            f"num_workers must be a whole number (0: Ray Train's local mode, in the run's own process), "
            f"not {num_workers!r}"
        )
    if num_workers == 0 and use_gpu is True:
        raise InputError("use_gpu=True needs num_workers=1 or more: local mode (num_workers=0) runs on no GPU")
    given = {
        n: v for n, v in zip(CREATORS, (model_creator, data_creator, optimizer_creator, loss_creator)) if v is not None
    }
    if train_func is not None and (given or scheduler_creator is not None):
        raise InputError("pass either train_func or the creators (model_creator, ...), not both")
    if train_func is None:
        if not given:
            raise InputError(
                "jc.train_torch needs a train_func (or the creator-style model_creator, data_creator, ...)"
            )
        missing = [n for n in CREATORS if n not in given]
        if missing:
            raise InputError(f"the creator-style API needs {', '.join(CREATORS)}; missing: {', '.join(missing)}")
        if epochs is None:
            raise InputError("the creator-style API needs epochs=N (how many passes over the data)")
        _positive_int("epochs", epochs)
        for creator, value in given.items():
            if not callable(value):
                raise InputError(f"{creator} must be a function (or, for loss_creator, a loss class), not {value!r}")
            _check_sendable(creator, value)
    elif not callable(train_func):
        raise InputError(f"train_func must be a function, not {type(train_func).__name__}")
    elif epochs is not None:
        raise InputError("epochs= is for the creator-style API; a train_func loops over its own epochs")
    else:
        _check_sendable("train_func", train_func)
    if not isinstance(use_gpu, bool):
        raise InputError(f"use_gpu must be True or False, not {use_gpu!r}")
    if not isinstance(lean, bool):
        raise InputError(f"lean must be True or False, not {lean!r}")
    if config is not None and not isinstance(config, Mapping):
        raise InputError(f"config must be a dict (it is passed to train_func), not {type(config).__name__}")
    if datasets is not None and not isinstance(datasets, Mapping):
        raise InputError('datasets must map names to Ray datasets, e.g. {"train": ds}')
    config = dict(config or {})
    if train_func is None:
        creators = {
            "model": model_creator,
            "data": data_creator,
            "optimizer": optimizer_creator,
            "loss": loss_creator,
            "scheduler": scheduler_creator,
        }
        config.update(_creators=creators, _epochs=epochs)
    spec = {
        "num_workers": num_workers,
        "use_gpu": use_gpu,
        "config": config,
        "resources_per_worker": _resources("resources_per_worker", resources_per_worker),
        "name": name,
        "storage_path": storage_path,
        "max_failures": max_failures,
        "keep_checkpoints": keep_checkpoints,
        "lean": lean,
    }
    namespace: dict[str, Any] = {"_jc_train_func": train_func, "_jc_spec": spec}
    if datasets:
        # Each dataset travels as a variable of its own: a handle (a dataset made by a
        # driver cell stays on the cluster) cannot travel inside a dict.
        entries = []
        for i, (key, dataset) in enumerate(datasets.items()):
            if not isinstance(key, str):
                raise InputError(f'datasets must map names (str) to Ray datasets, e.g. {{"train": ds}}; got {key!r}')
            namespace[f"_jc_dataset_{i}"] = dataset
            entries.append(f"{key!r}: _jc_dataset_{i}")
        source = (
            TRAIN_SOURCE.replace("run_train(", "run_train_with(")
            .replace("import run_train", "import run_train_with")
            .replace("_jc_spec)", f"_jc_spec, {{{', '.join(entries)}}})")
        )
    else:
        source = TRAIN_SOURCE
    fn_name = getattr(train_func, "__name__", "creators") if train_func is not None else "creators"
    label = f"jc.train_torch({fn_name})"
    view = _view(progress, lambda: _views.views.training(label, num_workers))
    # Local mode trains in the run's own process: it holds the CPUs a worker would.
    cpus = float((resources_per_worker or {}).get("CPU", 1.0)) if num_workers == 0 else 0.0
    run = _start(cluster, "train", source, namespace, label, view, _train_result, runtime_env=runtime_env, cpus=cpus)
    return run.wait() if block else run


def _cause(run: Run) -> BaseException | None:
    """What failed a training run: the first error a worker's own code raised. When one worker raises, Ray Train
    stops the others, and a worker stopped at a collective call then raises one of Ray's errors of its own
    (``ActorDiedError`` of its synchronisation actor, killed by the clean-up): under load that one can come in
    first, and from a lower rank, but it is the clean-up's, not the run's."""
    if not run.failures:
        return None
    first = max(run.failures, key=lambda key: run.failed_at.get(key, (False, float("-inf"))))
    return run.failures[first]


def _train_result(run: Run, summary: dict[str, Any]) -> TrainResult:
    reports = [
        {"rank": e["rank"], "report": e["report"], "time": e["time"], **e["metrics"]}
        for e in run.events
        if e.get("type") == "report"
    ]
    reports.sort(key=lambda r: (r["report"], r["rank"]))
    error: BaseException | None = None
    if summary.get("error"):
        error = _cause(run) or RunError(summary["error"])
    final = dict(summary.get("metrics") or {})
    if not final and reports:  # Ray keeps metrics with checkpoints only: rank 0's last report
        last = [r for r in reports if r["rank"] == 0] or reports
        final = {k: v for k, v in last[-1].items() if k not in ("rank", "report", "time")}
    result = TrainResult(
        reports=reports,
        final=final,
        checkpoint=_checkpoint(summary.get("checkpoint"), cast("Cluster", run.cell.cluster)),
        error=error,
        elapsed=run.elapsed,
        name=summary.get("name", ""),
        path=summary.get("path") or "",
    )
    if run.widget is not None:
        run.widget.finish("failed" if error else "done", run, result)
    return result


# -------------------------------------------------------------------------- tune

SCHEDULERS = ("asha", "hyperband", "pbt", "fifo")
SEARCHERS = ("optuna", "bayesopt", "hyperopt", "random")


def tune(
    trainable: Any,
    param_space: dict[str, Any],
    *,
    metric: str,
    mode: str,
    num_samples: int = 1,
    scheduler: Any = None,
    scheduler_options: dict[str, Any] | None = None,
    search_alg: Any = None,
    search_options: dict[str, Any] | None = None,
    resources_per_trial: dict[str, float] | None = None,
    max_concurrent_trials: int | None = None,
    reuse_actors: bool | None = None,
    stop: dict[str, Any] | None = None,
    name: str | None = None,
    storage_path: str | None = None,
    block: bool = True,
    progress: bool | None = None,
    runtime_env: dict[str, Any] | None = None,
    cluster: Cluster | None = None,
) -> Any:
    """A Ray Tune sweep of ``trainable`` over ``param_space``, live in the notebook.

    ``trainable`` is a function of ``config`` that calls ``ray.tune.report({...})`` (or
    a ``tune.Trainable`` class). ``param_space`` mixes constants with ``jc.choice``,
    ``jc.uniform``, ``jc.loguniform``, ``jc.randint``, ``jc.grid_search`` (or Ray Tune's
    own domains). ``scheduler`` is ``"asha"``, ``"hyperband"``, ``"pbt"`` or ``"fifo"``
    (options, such as PBT's ``hyperparam_mutations``, in ``scheduler_options``) or a
    Ray Tune scheduler; ``search_alg`` is ``"optuna"``, ``"bayesopt"``, ``"hyperopt"``
    (options in ``search_options``) or a Ray Tune searcher. ``reuse_actors`` is Ray Tune's
    (a trial's process goes on to the next trial); unset, it is on for a population-based
    scheduler, whose trials pause and resume in turns when there are more than CPUs for them,
    and off otherwise, as in Ray. ``runtime_env`` is Ray's, for the sweep and its trials. A table of trials and their
    curves update below the cell. Returns a :class:`TuneResult`, or with
    ``block=False`` a :class:`Run` at once.

    >>> result = jc.tune(train, {"lr": jc.loguniform(1e-4, 1e-1)}, metric="acc",
    ...                  mode="max", num_samples=8, scheduler="asha")            # doctest: +SKIP
    >>> result.best_config                                                      # doctest: +SKIP
    """
    from ._cluster import attached

    cluster = cluster or attached()
    if not callable(trainable):
        raise InputError(f"trainable must be a function of config (or a tune.Trainable class), not {trainable!r}")
    _check_sendable("trainable", trainable)
    if not isinstance(metric, str) or not metric:
        raise InputError('metric must name a reported metric, e.g. metric="loss"')
    if mode not in ("min", "max"):
        raise InputError(f'mode must be "min" or "max", not {mode!r}')
    _positive_int("num_samples", num_samples)
    if max_concurrent_trials is not None:
        _positive_int("max_concurrent_trials", max_concurrent_trials)
    if reuse_actors is not None and not isinstance(reuse_actors, bool):
        raise InputError(f"reuse_actors must be True, False or None (Ray Tune's choice), not {reuse_actors!r}")
    check(param_space)
    if isinstance(scheduler, str) and scheduler not in SCHEDULERS:
        raise InputError(
            f"unknown scheduler {scheduler!r}: name one of {', '.join(SCHEDULERS)}, or pass a Ray Tune scheduler"
        )
    if isinstance(search_alg, str) and search_alg not in SEARCHERS:
        raise InputError(
            f"unknown search_alg {search_alg!r}: name one of {', '.join(SEARCHERS)}, "
            "or pass a Ray Tune search algorithm"
        )
    options = dict(scheduler_options or {})
    if "hyperparam_mutations" in options:
        check(options["hyperparam_mutations"], "scheduler_options['hyperparam_mutations']")
    if scheduler_options and not isinstance(scheduler, str):
        raise InputError("scheduler_options go with a scheduler named by a string; configure a scheduler object itself")
    spec = {
        "param_space": param_space,
        "metric": metric,
        "mode": mode,
        "num_samples": num_samples,
        "scheduler": scheduler,
        "scheduler_options": options,
        "search_alg": search_alg,
        "search_options": dict(search_options or {}),
        "resources_per_trial": _resources("resources_per_trial", resources_per_trial),
        "max_concurrent_trials": max_concurrent_trials,
        "reuse_actors": reuse_actors,
        "stop": stop,
        "name": name,
        "storage_path": storage_path,
    }
    label = f"jc.tune({getattr(trainable, '__name__', 'trainable')})"
    view = _view(progress, lambda: _views.views.trials(label, metric, mode))
    run = _start(
        cluster,
        "tune",
        TUNE_SOURCE,
        {"_jc_trainable": trainable, "_jc_spec": spec},
        label,
        view,
        _tune_result,
        metric,
        mode,
        runtime_env=runtime_env,
    )
    return run.wait() if block else run


def _tune_result(run: Run, summary: dict[str, Any]) -> TuneResult:
    cluster = cast("Cluster", run.cell.cluster)
    states: dict[str, str] = {}
    for event in run.events:
        if event.get("type") == "trial":
            states[event["trial"]] = event["state"]
    rows = []
    for trial in summary.get("trials", []):
        row: dict[str, Any] = {"trial": trial["trial"]}
        row.update({f"config/{k}": v for k, v in flat(trial.get("config") or {}).items()})
        row["state"] = states.get(trial["trial"], "ERROR" if trial.get("error") else "TERMINATED")
        row["iterations"] = trial.get("iterations", 0)
        row.update(trial.get("metrics") or {})
        row["error"] = trial.get("error")
        rows.append(row)
    for key, failure in run.failures.items():  # the trial's own error, with its frames
        for row in rows:
            if row["trial"] == key:
                row["error"] = f"{type(failure).__name__}: {failure}"
    best = summary.get("best") or {}
    spec_metric = str(next((e.get("metric") for e in run.events if e.get("type") == "start"), ""))
    spec_mode = str(next((e.get("mode") for e in run.events if e.get("type") == "start"), ""))
    result = TuneResult(
        best_config=best.get("config"),
        best_result=best.get("metrics"),
        best_checkpoint=_checkpoint(best.get("checkpoint"), cluster),
        trial_rows=rows,
        history=[
            {"trial": e["trial"], "iteration": e["iteration"], "time": e["time"], **e["metrics"]}
            for e in run.events
            if e.get("type") == "result"
        ],
        metric=spec_metric,
        mode=spec_mode,
        elapsed=run.elapsed,
        name=summary.get("name", ""),
        path=summary.get("path") or "",
        failures={str(k): v for k, v in run.failures.items()},
    )
    if run.widget is not None:
        run.widget.finish("done", run, result)
    return result


__all__ = ["Checkpoint", "Run", "RunError", "TrainResult", "TuneResult", "train_torch", "tune"]
