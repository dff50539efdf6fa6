"""``jc.tune`` on the cluster: Ray Tune's ``Tuner``, driven from a runner actor.

:func:`run_tune` runs in the run's own actor on the head (the Ray Tune driver).
Schedulers and search algorithms named by the notebook become Ray's own objects
here; a Tune :class:`~ray.tune.Callback` sends each trial's start, results and end to
the notebook as they happen; function trainables are wrapped so that a trial that
raises sends its error with the notebook's own frames.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import zlib
from typing import Any

from ._runs import (
    DEFAULT_STORAGE,
    Captured,
    RunError,
    Sender,
    check_bundles,
    cluster_totals,
    current_sender,
    finite,
    numbers,
    plain,
    relay_of_current,
)
from ._space import to_tune

SCHEDULERS = ("asha", "hyperband", "pbt", "fifo")
SEARCHERS = ("optuna", "bayesopt", "hyperopt", "random")
#: Keys of Tune's own result bookkeeping, left out of what the notebook draws.
BOOKKEEPING = {
    "trial_id",
    "date",
    "timestamp",
    "pid",
    "hostname",
    "node_ip",
    "done",
    "experiment_tag",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "should_checkpoint",
    "config",
    "time_this_iter_s",
    "time_total_s",
    "training_iteration",
}


def make_scheduler(name: Any, options: dict[str, Any]) -> Any:
    """A Ray Tune scheduler from its name (``asha``, ``hyperband``, ``pbt``, ``fifo``), or the object given."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, PopulationBasedTraining

    if name is None or name == "fifo":
        return FIFOScheduler()
    if not isinstance(name, str):
        return name
    options = dict(options)
    if name == "asha":
        return ASHAScheduler(**options)
    if name == "hyperband":
        return HyperBandScheduler(**options)
    if name == "pbt":
        if "hyperparam_mutations" in options:
            options["hyperparam_mutations"] = to_tune(options["hyperparam_mutations"])
        return PopulationBasedTraining(**options)
    raise RunError(f"unknown scheduler {name!r}: name one of {', '.join(SCHEDULERS)}, or pass a Ray Tune scheduler")


def make_searcher(name: Any, options: dict[str, Any]) -> Any:
    """A Ray Tune search algorithm from its name, or the object given (None: random/grid)."""
    if name is None or name == "random" or not isinstance(name, str):
        return name
    try:
        if name == "optuna":
            from ray.tune.search.optuna import OptunaSearch

            return OptunaSearch(**options)
        if name == "bayesopt":
            from ray.tune.search.bayesopt import BayesOptSearch

            return BayesOptSearch(**options)
        if name == "hyperopt":
            from ray.tune.search.hyperopt import HyperOptSearch

            return HyperOptSearch(**options)
    except (ImportError, AssertionError) as exc:
        package = {"optuna": "optuna", "bayesopt": "bayesian-optimization", "hyperopt": "hyperopt"}[name]
        raise RunError(
            f"search_alg={name!r} needs the {package} package on the cluster: pip install {package}"
        ) from exc
    raise RunError(
        f"unknown search algorithm {name!r}: name one of {', '.join(SEARCHERS)}, or pass a Ray Tune searcher"
    )


def wrap(trainable: Any, relay: str, cell_id: str) -> Any:
    """A function trainable whose errors and output reach the notebook (classes pass as they are)."""
    if isinstance(trainable, type) or not callable(trainable):
        return trainable

    @functools.wraps(trainable)
    def trainable_in_notebook(config: dict[str, Any]) -> Any:
        from ray import tune

        from ..cells._execute import failure_from

        trial = tune.get_context().get_trial_id()
        send = Sender(relay, cell_id)
        # "Checkpoint successfully created at ..." at each report: the widget shows the reports.
        for name in ("ray.train", "ray.tune"):
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            with Captured(send, 2000 + zlib.crc32(trial.encode()) % 1_000_000, f"({trial}) "):
                return trainable(config)
        except Exception as exc:  # not SystemExit: how Ray stops a trial or worker it is done with
            send("tune", {"type": "error", "trial": trial, "time": time.time(), "failure": failure_from(exc, "", "")})
            raise
        finally:
            send.flush()

    del trainable_in_notebook.__wrapped__  # Tune reads the signature: ``(config)``
    return trainable_in_notebook


def _callback_class() -> type:
    from ray.tune import Callback
    from ray.tune.utils import flatten_dict

    class TrialEvents(Callback):
        """Sends each trial's start, results and end to the notebook; checks the metric."""

        def __init__(self, send: Sender, metric: str, max_t: float | None = None) -> None:
            self.send = send
            self.metric = metric
            self.max_t = max_t
            self.seen: set[str] = set()
            self.reported: set[str] = set()
            self.with_metric = False
            self.results = 0
            self.stopped: set[str] = set()
            from ..watching._deaths import oom_kills

            self.kills = oom_kills()  # a trial's worker the kernel kills for memory: named so (see _trial_error)

        def _trial(self, trial: Any, state: str, **extra: Any) -> None:
            self.send(
                "tune",
                {
                    "type": "trial",
                    "trial": trial.trial_id,
                    "name": str(trial),
                    "config": plain(trial.config),
                    "state": state,
                    "time": time.time(),
                    **extra,
                },
            )

        def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._trial(trial, "RUNNING")

        def on_trial_restore(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._trial(trial, "RUNNING")

        def on_trial_result(
            self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
        ) -> None:
            metrics = {k: v for k, v in numbers(result).items() if k not in BOOKKEEPING and not k.startswith("config/")}
            self.results += 1
            self.reported.update(metrics)
            if self.metric in metrics:
                self.with_metric = True
            elif not self.with_metric and self.results >= 1:
                names = ", ".join(sorted(self.reported)) or "none (only Tune's own bookkeeping)"
                raise RunError(
                    f"metric={self.metric!r} is not among the metrics the trials report: {names}. "
                    "Name one of those as metric=, or report it with tune.report({...})."
                )
            # Tune marks the result done when it stops the trial: a scheduler's decision (early),
            # unless the trial met its stopping criteria (``stop=``), which the trial itself says.
            criteria = flatten_dict({k: v for k, v in result.items() if k != "done"})
            early = bool(result.get("done")) and not trial.should_stop(criteria)
            if early and self.max_t is not None and result.get("training_iteration", 0) >= self.max_t:
                early = False  # ASHA and HyperBand stop every trial at max_t: that is its end
            if early:
                self.stopped.add(trial.trial_id)
            self.send(
                "tune",
                {
                    "type": "result",
                    "trial": trial.trial_id,
                    "iteration": int(result.get("training_iteration", 0)),
                    "metrics": metrics,
                    "time": time.time(),
                    "stopped": early,
                },
            )

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._trial(trial, "STOPPED" if trial.trial_id in self.stopped else "TERMINATED")

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._trial(trial, "ERROR", error=_trial_error(trial, self.kills))

    return TrialEvents


def _trial_error(trial: Any, kills_before: int | None = None) -> str:
    """A failed trial's error in a line (its worker's death for memory in words: see ._deaths.memory_failure)."""
    from ..watching._deaths import memory_failure

    error = getattr(trial, "error_file", None) or ""
    try:
        if error and os.path.exists(error):
            with open(error) as f:
                whole = f.read().strip()
            return memory_failure(whole, kills_before) or (whole.splitlines()[-1] if whole else "")
    except OSError:
        pass
    return str(getattr(trial, "status", ""))


def run_tune(trainable: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Fit a ``Tuner`` as ``spec`` says; a summary the notebook turns into a result."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # the callback says it, naming what was reported
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # with verbose=0: no progress tables; the widget draws them
    # A trial's error reaches the notebook with its own frames; Tune's log of it would repeat it.
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    send = current_sender()
    relay, cell_id = relay_of_current()
    metric, mode = spec["metric"], spec["mode"]
    resources = dict(spec.get("resources_per_trial") or {"CPU": 1.0})
    _, nodes = cluster_totals()
    why = check_bundles("each trial", [resources], nodes)
    if why:
        raise RunError(why)
    scheduler = make_scheduler(spec.get("scheduler"), spec.get("scheduler_options") or {})
    searcher = make_searcher(spec.get("search_alg"), spec.get("search_options") or {})
    name = spec.get("name") or f"tune-{time.strftime('%Y%m%d-%H%M%S')}-{cell_id[-6:]}"
    storage = spec.get("storage_path") or DEFAULT_STORAGE
    max_t = getattr(scheduler, "_max_t", None) or getattr(scheduler, "_max_t_attr", None)
    callback = _callback_class()(send, metric, max_t if isinstance(max_t, (int, float)) else None)
    wrapped = tune.with_resources(wrap(trainable, relay, cell_id), resources)
    reuse = spec.get("reuse_actors")
    if reuse is None:  # PBT pauses and resumes trials in turns: a new process for each turn is most of its time
        reuse = isinstance(scheduler, PopulationBasedTraining)
    tuner = tune.Tuner(
        wrapped,
        param_space=to_tune(spec["param_space"]),
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=spec.get("num_samples", 1),
            scheduler=scheduler,
            search_alg=searcher,
            max_concurrent_trials=spec.get("max_concurrent_trials"),
            reuse_actors=reuse,
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, callbacks=[callback], verbose=0, stop=spec.get("stop")
        ),
    )
    send("tune", {"type": "start", "time": time.time(), "name": name, "metric": metric, "mode": mode})
    started = time.time()
    try:
        grid = tuner.fit()
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None or cause.__context__ is not None:
            if isinstance(cause, RunError):
                break
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        if isinstance(cause, RunError):
            raise cause from None
        raise
    trials = []
    for result in list(grid):  # type: ignore[call-overload]
        metrics = numbers(result.metrics or {})
        trials.append(
            {
                "trial": metrics.get("trial_id") or os.path.basename(str(result.path or "")),
                "config": plain(result.config),
                "iterations": metrics.get("training_iteration", 0),
                "metrics": {k: v for k, v in metrics.items() if k not in BOOKKEEPING},
                "error": _error_line(result.error, callback.kills),
                "checkpoint": result.checkpoint.path if result.checkpoint is not None else None,
            }
        )
    best: dict[str, Any] | None = None
    # The best trial by its last result, among those that did not fail (Ray's own pick
    # counts a trial that raised with what it reported before).
    scored = [r for r in list(grid) if r.metrics and finite(r.metrics.get(metric))]  # type: ignore[call-overload]
    healthy = [r for r in scored if r.error is None] or scored
    pick = min if mode == "min" else max
    chosen = pick(healthy, key=lambda r: r.metrics[metric]) if healthy else None
    if chosen is not None and chosen.metrics and finite(chosen.metrics.get(metric)):
        best = {
            "config": plain(chosen.config),
            "metrics": {
                k: v for k, v in numbers(chosen.metrics).items() if k not in BOOKKEEPING - {"training_iteration"}
            },
            "checkpoint": _best_checkpoint(chosen, metric, mode),
        }
    send("tune", {"type": "end", "time": time.time()})
    send.flush()
    return {
        "name": name,
        "storage": storage,
        "trials": trials,
        "best": best,
        "elapsed": time.time() - started,
        "path": grid.experiment_path,
    }


def _error_line(error: BaseException | None, kills_before: int | None = None) -> str | None:
    if error is None:
        return None
    from ..watching._deaths import memory_failure

    memory = memory_failure(error, kills_before)
    if memory:
        return memory
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


def _best_checkpoint(result: Any, metric: str, mode: str) -> dict[str, Any] | None:
    from ..cells._remote import node_ip

    checkpoint = None
    try:
        checkpoint = result.get_best_checkpoint(metric, mode)
    except Exception:
        checkpoint = result.checkpoint
    if checkpoint is None:
        return None
    return {"path": checkpoint.path, "node": node_ip(), "metrics": numbers(result.metrics or {})}


__all__ = ["SCHEDULERS", "SEARCHERS", "make_scheduler", "make_searcher", "run_tune", "wrap"]
