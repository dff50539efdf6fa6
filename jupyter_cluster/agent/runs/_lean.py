"""Ray Train without the helpers that a fixed cluster does not need: ``jc.train_torch``'s lean runs.

Beside its workers, Ray Train (v2) starts helper actors of its own, each a Python process of
130-150 MiB, whether the run needs them or not. Three of them serve clusters that can change
under the run:

- the **preemption watcher** (``PreemptionWatcher``) watches for nodes being drained: a cluster
  without an autoscaler drains none;
- the **autoscaling coordinator** (``_AutoscalingCoordinatorActor``, detached: it outlives the
  run), which the fixed scaling policy asks for the run's resources, that an autoscaler may add
  nodes: a cluster without an autoscaler adds none;
- the **dataset manager** (``DatasetManager``), made for every run, splits the run's Ray
  datasets among the workers: a run without datasets has nothing to split.

A lean run leaves each out where it is safe (:func:`lean`): the first two on a cluster known to
have no autoscaler (the head runs Ray's monitor without an autoscaling config: the embedded
cluster, ``ray start`` and ``%cluster up`` heads), the third when the run has no datasets. A
cluster with an autoscaler, or one whose autoscaler cannot be seen from the head (KubeRay runs
it in a container of its own), keeps them all.

Everything here leans on Ray Train's internals, named in :data:`INTERNALS` with the Ray versions
they were checked on. :func:`problems` says what differs in the Ray at hand; where anything does,
the run uses Ray Train's defaults and says so, and tests/test_lean.py fails, so that the next Ray
is checked before a lean run relies on it.

This module runs in the run's actor, on the head: it imports only the standard library (Ray,
lazily; psutil, which Ray depends on).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

#: The Ray versions the internals below were read in and checked on.
CHECKED_ON = ("2.60.0",)

#: What a lean run leans on, in Ray's own modules (under ``ray.train.v2._internal`` unless said).
INTERNALS = {
    "preemption": "constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR == 'RAY_TRAIN_ENABLE_PREEMPTION_WATCHER', "
    "in ENV_VARS_TO_PROPAGATE (read by execution/controller/controller.py in the controller's process)",
    "coordinator": "execution/scaling_policy/fixed.FixedScalingPolicy (what create_scaling_policy makes for a fixed "
    "size), asking the coordinator through _maybe_send_resource_request and after_controller_start",
    "controller": "ray.train.v2.api.data_parallel_trainer.DataParallelTrainer._initialize_and_run_controller("
    "scaling_policy=...), which hands the policy to the controller",
    "datasets": "callbacks/datasets.DatasetsCallback, added by DataParallelTrainer._create_default_callbacks",
}

PREEMPTION_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def problems() -> list[str]:
    """What differs, in the Ray at hand, from what a lean run leans on (empty: all as expected)."""
    found: list[str] = []

    def check(name: str, test: Callable[[], bool]) -> None:
        try:
            ok = test()
        except Exception as exc:
            found.append(f"{name}: {type(exc).__name__}: {exc}")
            return
        if not ok:
            found.append(f"{name}: not as expected ({INTERNALS[name]})")

    def preemption() -> bool:
        from ray.train.v2._internal import constants

        return bool(
            constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR == PREEMPTION_ENV
            and PREEMPTION_ENV in constants.ENV_VARS_TO_PROPAGATE
        )

    def coordinator() -> bool:
        from ray.train.v2._internal.execution.scaling_policy import create_scaling_policy
        from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy
        from ray.train.v2.api.config import ScalingConfig

        made = create_scaling_policy(ScalingConfig(num_workers=2))
        return type(made) is FixedScalingPolicy and all(
            callable(getattr(FixedScalingPolicy, m, None))
            for m in ("_maybe_send_resource_request", "_send_resource_request", "after_controller_start")
        )

    def controller() -> bool:
        from ray.train.v2._internal.execution.controller.controller import TrainController
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        run = inspect.signature(DataParallelTrainer._initialize_and_run_controller)
        takes = inspect.signature(TrainController.__init__).parameters
        return any(p.kind is p.VAR_KEYWORD for p in run.parameters.values()) and "scaling_policy" in takes

    def datasets() -> bool:
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        return isinstance(DatasetsCallback, type) and callable(DataParallelTrainer._create_default_callbacks)

    for name, test in (
        ("preemption", preemption),
        ("coordinator", coordinator),
        ("controller", controller),
        ("datasets", datasets),
    ):
        check(name, test)
    return found


def autoscaled(gcs_address: str | None = None) -> bool | None:
    """Whether this head's cluster has an autoscaler: Ray's monitor of the cluster runs here with an autoscaling
    config (True), without one, Ray's read-only stand-in (False); None when no monitor of it runs here (its
    autoscaler, if any, is elsewhere: KubeRay's container, say).

    The cluster is the one at ``gcs_address`` (by default, the one this process is a driver or worker of): a machine
    may run other Ray clusters, and another's autoscaler says nothing of this one (one with an autoscaler beside it
    made a run on the embedded cluster keep every helper)."""
    import psutil

    if gcs_address is None:
        gcs_address = _own_gcs_address()
    seen = False
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info.get("cmdline") or []
        except (psutil.Error, OSError):
            continue
        if not any(arg.endswith(("autoscaler/_private/monitor.py", "autoscaler/v2/monitor.py")) for arg in cmdline):
            continue
        if gcs_address is not None and f"--gcs-address={gcs_address}" not in cmdline:
            continue  # another cluster's
        seen = True
        if any(arg.startswith("--autoscaling-config=") and arg.split("=", 1)[1] for arg in cmdline):
            return True
    return False if seen else None


def _own_gcs_address() -> str | None:
    """The GCS address of the cluster this process is connected to, if it is (Ray is not imported for it)."""
    import sys

    ray: Any = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return None


_made: dict[str, Any] = {}


def _policy_class() -> Any:
    """Ray Train's fixed scaling policy, without the autoscaling coordinator: made once, and found as this module's
    ``FixedWithoutCoordinator`` (see :func:`__getattr__`), so that it pickles by name and the controller's process
    makes it again from here."""
    if "policy" not in _made:
        from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

        class _FixedWithoutCoordinator(FixedScalingPolicy):
            """A fixed-size run on a cluster with no autoscaler: nobody to ask for resources."""

            def after_controller_start(self, train_run_context: Any) -> None:
                self._requester_id = f"train-{train_run_context.run_id}"

            def _maybe_send_resource_request(self) -> None:
                pass

            def _send_resource_request(self) -> None:
                pass

            def _cancel_resource_request(self) -> None:
                pass

        _FixedWithoutCoordinator.__name__ = _FixedWithoutCoordinator.__qualname__ = "FixedWithoutCoordinator"
        _FixedWithoutCoordinator.__module__ = __name__
        _made["policy"] = _FixedWithoutCoordinator
    return _made["policy"]


def __getattr__(name: str) -> Any:  # made on first use: Ray Train is imported only by the runs that need it
    if name == "FixedWithoutCoordinator":
        return _policy_class()
    raise AttributeError(name)


def lean(trainer: Any, has_datasets: bool) -> tuple[list[str], str]:
    """Leave out of ``trainer``'s run what the cluster cannot use; returns what was left out, in words, and a note
    for the notebook when Ray is other than expected (the run then keeps Ray Train's defaults)."""
    wrong = problems()
    if wrong:
        from ray import __version__

        return [], (
            f"Ray {__version__} differs from what jc.train_torch's lean runs were checked on "
            f"(Ray {', '.join(CHECKED_ON)}): {'; '.join(wrong)}. This run uses Ray Train's defaults."
        )
    left_out: list[str] = []
    if autoscaled() is False:
        os.environ[PREEMPTION_ENV] = "0"  # Ray Train hands it on to the controller (ENV_VARS_TO_PROPAGATE)
        left_out.append("the preemption watcher")
        run = trainer._initialize_and_run_controller
        policy_class = _policy_class()

        def without_coordinator(**kwargs: Any) -> Any:
            policy = kwargs.get("scaling_policy")
            if policy is not None and type(policy).__name__ == "FixedScalingPolicy":
                kwargs["scaling_policy"] = policy_class(policy.scaling_config)
            return run(**kwargs)

        trainer._initialize_and_run_controller = without_coordinator
        left_out.append("the autoscaling coordinator")
    if not has_datasets:
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

        make = trainer._create_default_callbacks
        trainer._create_default_callbacks = lambda: [c for c in make() if not isinstance(c, DatasetsCallback)]
        left_out.append("the dataset manager")
    return left_out, ""


__all__ = ["CHECKED_ON", "INTERNALS", "autoscaled", "lean", "problems"]
