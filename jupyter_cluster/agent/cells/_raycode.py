"""Ray code pasted into ``--driver`` cells runs as it does under ``python script.py``.

The agent is the Ray driver of the session, attached to the cluster before any cell runs. A pasted script
begins with ``ray.init(...)`` and may end with ``ray.shutdown()``; Ray's own functions would refuse the first
("Maybe you called ray.init twice by accident?") and, with the second, disconnect the session's driver. So in the
agent's process the ``ray`` package's two names are replaced (Ray's own calls of them, inside Ray, are not):

- ``ray.init(...)``, in any form, joins the attached cluster, which is what the user means, and returns Ray's
  context as a repeated ``ray.init`` would. Its ``runtime_env`` is the script's job's: as Ray merges a job's
  ``runtime_env`` under each task's, it is merged under the ``runtime_env`` of every task and actor the driver
  cells submit, until the next ``ray.init`` or ``ray.shutdown()`` (:class:`ScriptEnv`). Arguments that ask for
  what the cluster does not have (more CPUs or GPUs than it has, a custom resource it lacks, another namespace or
  address, the settings of a new cluster) are said in one line on the cell's stderr: what was asked, what the
  cluster has, and how to get it. Harmless ones (logging, ``log_to_driver``, ``include_dashboard``,
  ``ignore_reinit_error``) pass without a word; wrong ones fail as Ray's do.
- ``ray.shutdown()`` ends what a script's driver takes with it when it disconnects: the actors (not detached)
  and placement groups that the notebook's driver cells started are stopped, and its ``runtime_env`` ends. The
  session stays attached; the objects other cells hold, detached actors and Serve applications stay, as they
  outlive a script's driver.
- ``os._exit(status)`` in a driver cell ends the cell, not the agent: the cell fails with that exit status
  (succeeds with 0), and the session, its objects and its actors go on.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import ray

log = logging.getLogger("jupyter_cluster.agent")

#: Arguments of ``ray.init`` that change nothing a script could notice on a cluster that runs already.
HARMLESS = frozenset(
    {
        "address",
        "ignore_reinit_error",
        "include_dashboard",
        "dashboard_host",
        "dashboard_port",
        "configure_logging",
        "logging_level",
        "logging_format",
        "logging_config",
        "log_to_driver",
        "job_config",
        "_skip_env_hook",
    }
)
#: Addresses that mean "the cluster at hand" (a new local one under ``python``; here, the attached one).
THIS_CLUSTER = (None, "", "auto", "local")


class DriverExit(SystemExit):
    """``os._exit(status)`` called by a driver cell: the cell ends with that status; the agent does not."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        return (
            f"os._exit({self.status}) in a --driver cell: the cell ended with exit status {self.status}. A driver "
            "cell runs in the agent, the session's Ray driver, which went on running: the session keeps its "
            "objects and actors"
        )


class ScriptDriver:
    """The replacements of ``ray.init``, ``ray.shutdown`` and ``os._exit`` in the agent's process."""

    def __init__(self, is_driver_cell: Callable[[], bool], hint: str = "") -> None:
        #: Whether the calling thread runs a driver cell now.
        self.is_driver_cell = is_driver_cell
        #: How a bigger cluster is had, for the notes (``%cluster local --cpus N`` on the embedded cluster).
        self.hint = hint
        self.original_init = ray.init
        self.original_shutdown = ray.shutdown
        self.original_exit = os._exit
        self.pid = os.getpid()
        self._signature = inspect.signature(self.original_init)
        self._shutdown_signature = inspect.signature(self.original_shutdown)
        self._lock = threading.Lock()
        #: What driver cells started that a script's driver takes with it: its actors, by id (an actor busy in a
        #: method outlives its last handle, which a script's end does not), and its placement groups.
        self._actors: list[Any] = []
        self._groups: list[Any] = []
        #: The ``runtime_env`` of the script's last ``ray.init``, merged under the driver cells' tasks and actors.
        self.script_env: ScriptEnv | None = None

    # ------------------------------------------------------------------ installing
    def install(self) -> None:
        # What a script reaches as `ray._private.internal_api` after its own ray.init (which imports Ray Data's
        # and the dashboard's modules, which import it), as Ray's documentation does.
        import ray._private.internal_api

        ray.init = self.init
        ray.shutdown = self.shutdown
        os._exit = self._exit  # type: ignore[assignment]
        self._watch_tasks()
        self._watch_actors()
        self._watch_placement_groups()
        global _installed
        _installed = self

    def _env_here(self) -> ScriptEnv | None:
        env = self.script_env
        return env if env is not None and self.is_driver_cell() else None

    def _watch_tasks(self) -> None:
        from ray import remote_function

        original = remote_function.RemoteFunction._remote
        watcher = self

        def _remote(
            fn: Any,
            args: Any = None,
            kwargs: Any = None,
            serialized_runtime_env_info: str | None = None,
            **options: Any,
        ) -> Any:
            env = watcher._env_here()
            if env is not None:
                options["runtime_env"], serialized_runtime_env_info = env.under(options.get("runtime_env"))
            return original(fn, args, kwargs, serialized_runtime_env_info, **options)

        _remote.__wrapped__ = original  # type: ignore[attr-defined]
        remote_function.RemoteFunction._remote = _remote  # type: ignore[method-assign]

    def _watch_actors(self) -> None:
        from ray import actor

        original = actor.ActorClass._remote
        watcher = self

        def _remote(cls: Any, *args: Any, **kwargs: Any) -> Any:
            env = watcher._env_here()
            if env is not None:
                kwargs["runtime_env"] = env.under(kwargs.get("runtime_env"))[0]
            handle = original(cls, *args, **kwargs)
            if watcher.is_driver_cell():
                watcher._started_actor(handle, kwargs)
            return handle

        _remote.__wrapped__ = original  # type: ignore[attr-defined]
        actor.ActorClass._remote = _remote  # type: ignore[method-assign]

    def _watch_placement_groups(self) -> None:
        import ray.util

        module = sys.modules["ray.util.placement_group"]
        original = module.placement_group
        watcher = self

        def placement_group(*args: Any, **kwargs: Any) -> Any:
            group = original(*args, **kwargs)
            if watcher.is_driver_cell() and kwargs.get("lifetime") != "detached":
                with watcher._lock:
                    watcher._groups.append(group)
            return group

        placement_group.__wrapped__ = original  # type: ignore[attr-defined]
        placement_group.__doc__ = original.__doc__
        module.placement_group = placement_group  # type: ignore[attr-defined]
        ray.util.placement_group = placement_group

    def _started_actor(self, handle: Any, options: dict[str, Any]) -> None:
        if options.get("lifetime") == "detached" or options.get("get_if_exists"):
            return  # it outlives a script's driver; one found, not made, is not this script's
        actor_id = getattr(handle, "_ray_actor_id", None)
        if actor_id is not None:
            with self._lock:
                self._actors.append(actor_id)

    # ------------------------------------------------------------------ ray.init
    def init(self, *args: Any, **kwargs: Any) -> Any:
        """``ray.init`` in the agent: join the attached cluster; say what of the arguments it cannot give."""
        bound = self._signature.bind(*args, **kwargs)  # a wrong call fails as Ray's would
        given = dict(bound.arguments)
        extra = given.pop("kwargs", {})
        if given.get("local_mode"):  # Ray 2.60 refuses it, attached or not
            raise RuntimeError(
                "`local_mode` is no longer supported. For interactive debugging consider using the Ray "
                "distributed debugger."
            )
        unknown = [k for k in extra if not k.startswith("_") and k != "allow_multiple"]
        if unknown:
            raise RuntimeError(f"Unknown keyword argument(s): {', '.join(unknown)}")
        notes = self.notes({**given, **extra})
        # A script's ray.init starts its job: its runtime_env, or none (the last script's ends).
        self.script_env = ScriptEnv.prepare(given["runtime_env"]) if given.get("runtime_env") else None
        if notes:
            sys.stderr.write(f"ray.init: {'; '.join(notes)}\n")
        return self.context()

    @staticmethod
    def context() -> Any:
        """What a repeated ``ray.init(ignore_reinit_error=True)`` returns: Ray's context of this driver."""
        from ray._private import worker

        node = worker._global_node
        if node is None:  # cannot be, attached; the runtime context is what a script reads of it anyway
            return ray.get_runtime_context()
        node_id = worker.global_worker.core_worker.get_current_node_id()
        return worker.RayContext(dict(node.address_info, node_id=node_id.hex()))

    def notes(self, given: dict[str, Any]) -> list[str]:
        """What of ``ray.init``'s arguments the attached cluster does not give, one phrase each (the last says
        how to get more, when more was asked)."""
        notes: list[str] = []
        have = _cluster_resources()
        for key, unit in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            asked = given.get(key)
            if asked is not None and float(asked) > have.get(unit, 0.0):
                notes.append(f"{key}={asked:g}, but the attached cluster has {have.get(unit, 0.0):g} {unit}")
        for name, amount in (given.get("resources") or {}).items():
            if float(amount) > have.get(name, 0.0):
                notes.append(f"resources {name!r}: {amount:g}, but the attached cluster has {have.get(name, 0.0):g}")
        store = given.get("object_store_memory")
        if store is not None and int(store) > have.get("object_store_memory", 0.0):
            notes.append(
                f"object_store_memory={_size(int(store))}, but the attached cluster's object store holds "
                f"{_size(int(have.get('object_store_memory', 0)))}"
            )
        if notes and self.hint:
            notes[-1] += f" ({self.hint})"
        namespace = given.get("namespace")
        ours = ray.get_runtime_context().namespace
        if namespace is not None and namespace != ours:
            notes.append(
                f"namespace={namespace!r}: this notebook's driver runs in namespace {ours!r}, where the named actors "
                "it makes are"
            )
        address = given.get("address")
        if address not in THIS_CLUSTER and address != _gcs_address():
            notes.append(
                f"address={address!r}: this notebook stays attached to {_gcs_address()} (`%cluster connect`"
                " attaches it elsewhere)"
            )
        new_cluster = sorted(
            k for k in given if k not in HARMLESS and k not in _ASKED and given[k] not in (None, False, {})
        )
        if new_cluster:
            notes.append(f"{', '.join(new_cluster)}: settings of a new cluster; the attached one runs as it is")
        return notes

    # ------------------------------------------------------------------ ray.shutdown
    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        """``ray.shutdown`` in the agent: stop what driver cells started that a script's driver takes with it."""
        self._shutdown_signature.bind(*args, **kwargs)  # a wrong call fails as Ray's would
        self.script_env = None
        with self._lock:
            actors, self._actors = self._actors, []
            groups, self._groups = self._groups, []
        kill_actors(actors)
        for group in groups:
            try:
                ray.util.remove_placement_group(group)
            except Exception:
                log.debug("ray.shutdown() in a driver cell: a placement group was gone already", exc_info=True)

    # ------------------------------------------------------------------ os._exit
    def _exit(self, status: int) -> None:
        # A forked child (multiprocessing) ends as it must; only the agent's own driver-cell thread is kept.
        if os.getpid() == self.pid and self.is_driver_cell():
            raise DriverExit(status)
        self.original_exit(status)


#: Arguments :meth:`ScriptDriver.notes` compares with what the cluster has (not "a new cluster's settings").
_ASKED = frozenset(
    {"num_cpus", "num_gpus", "resources", "object_store_memory", "runtime_env", "namespace", "local_mode"}
)


class ScriptEnv:
    """A script's job ``runtime_env`` (its ``ray.init(runtime_env=...)``), ready to go under a task's own.

    Prepared once, as Ray's ``ray.init`` prepares a job's: local ``working_dir`` and ``py_modules`` uploaded to the
    cluster, a ``worker_process_setup_hook`` exported (run after the session's own hook, which routes the workers'
    output to the cells). :meth:`under` merges it under a task's or actor's own ``runtime_env`` by Ray's rule for a
    job's: the task's fields win, and ``env_vars`` merge name by name.
    """

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self._plain = self._ready(env)  # a task without a runtime_env of its own: the common case, made once

    @classmethod
    def prepare(cls, runtime_env: Any) -> ScriptEnv:
        from ray._private import worker
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
        from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

        env = dict(runtime_env)
        if not isinstance(env.get("env_vars", {}), dict):
            raise TypeError(f"runtime_env['env_vars'] must be a dict, not {type(env['env_vars']).__name__}")
        scratch = worker.global_worker.node.get_runtime_env_dir_path()
        env = upload_py_modules_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
        env = upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
        hook = env.pop("worker_process_setup_hook", None)
        if hook is not None:
            env = _export_hook(env, hook)
        env.pop("excludes", None)
        return cls(env)

    def under(self, own: Any) -> tuple[Any, str]:
        """The ``runtime_env`` of a task whose own is ``own`` (``None``: none), and Ray's serialised form of it."""
        if not own:
            return self._plain
        merged = dict(self.env)
        for key, value in dict(own).items():
            merged[key] = {**self.env.get("env_vars", {}), **value} if key == "env_vars" else value
        return self._ready(merged)

    @staticmethod
    def _ready(env: dict[str, Any]) -> tuple[Any, str]:
        from ray._private.utils import get_runtime_env_info, parse_runtime_env_for_task_or_actor

        parsed = parse_runtime_env_for_task_or_actor(env)
        return parsed, get_runtime_env_info(parsed, is_job_runtime_env=False, serialize=True)


def _export_hook(env: dict[str, Any], hook: Any) -> dict[str, Any]:
    """``env`` with a setup hook that runs the session's own (the job's) and then the script's ``hook``."""
    from ray._private import ray_constants, worker
    from ray._private.runtime_env.setup_hook import export_setup_func_callable

    if not (callable(hook) or isinstance(hook, str)):
        raise TypeError(f"worker_process_setup_hook must be a function, got {type(hook)}.")
    variable = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    job_env = ray.get_runtime_context().runtime_env or {}
    # The job's runtime_env names it on a head; on the embedded cluster, the environment its workers inherit.
    session_hook = (job_env.get("env_vars") or {}).get(variable) or os.environ.get(variable)
    return export_setup_func_callable(env, _chained(session_hook, hook), worker.global_worker)


def _chained(first: str | None, then: Any) -> Callable[[], None]:
    """A setup hook (pickled by value into the cluster) that runs the hook ``first`` names, then ``then``."""

    def setup_hooks() -> None:
        from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook

        for hook in (first, then):
            if hook is None:
                continue
            error = load_and_execute_setup_hook(hook) if isinstance(hook, str) else hook()
            if isinstance(hook, str) and error:
                raise RuntimeError(error)

    setup_hooks.__name__ = getattr(then, "__name__", str(then))
    return setup_hooks


def end_script() -> None:
    """The end of the scripts' driver work (``jc.current().reset_driver()``): their ``runtime_env`` ends too."""
    if _installed is not None:
        _installed.script_env = None


_installed: ScriptDriver | None = None


def kill_actors(actor_ids: list[Any]) -> None:
    """``ray.kill`` of each actor, by id: whether or not a handle to it is left (an actor whose last handle went
    while a method of it runs would run on)."""
    from ray._private import worker

    for actor_id in actor_ids:
        try:
            worker.global_worker.core_worker.kill_actor(actor_id, True)  # type: ignore[attr-defined]
        except Exception:  # gone already
            log.debug("an actor to stop was gone already", exc_info=True)


def _cluster_resources() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in ray.cluster_resources().items()}
    except Exception:
        return {}


def _gcs_address() -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return "the attached cluster"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def original_shutdown() -> Callable[..., None]:
    """Ray's own ``ray.shutdown``, for the agent's own end (whether or not :class:`ScriptDriver` is installed)."""
    from ray._private import worker

    return worker.shutdown


__all__ = ["HARMLESS", "DriverExit", "ScriptDriver", "ScriptEnv", "end_script", "kill_actors", "original_shutdown"]
