"""What the notebook's cells started on the cluster, beyond their own results.

A ``--driver`` cell has the whole Ray API: it can start actors (detached ones too,
which outlive the agent), Serve applications and placement groups. Everything the
agent's job creates carries its job id in Ray's tables, so the agent can list what
its cells started, and stop it, without having kept the handles:

- actors: Ray's actor table (the GCS; no dashboard needed), alive ones of this job,
  less the agent's own (the ``--actor`` namespaces and the output relay);
- Serve applications: those the cells deployed (``serve.run``, ``serve.run_many``:
  :func:`watch_serve` notes their names, since Serve keeps no owner of an application),
  of those ``serve.status()`` lists, when a Serve controller runs. Serve is one per
  cluster: other notebooks' applications are theirs, neither listed nor stopped;
- placement groups: Ray's placement group table; a placement group id ends with its
  job's id.

:func:`stop_started` stops them: the cells' Serve applications (``serve.delete``, or
``serve.shutdown()`` where Serve runs nothing else), then the named actors of the job
(``ray.kill``), then its placement groups. Unnamed actors live only as long as
a handle to them: clearing the driver's namespace lets them go.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import importlib.util
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

import ray

log = logging.getLogger("jupyter_cluster.agent")

#: The agent's own actor classes (``--actor`` namespaces, Train/Tune runs, the output
#: relay): not "started by the notebook's cells".
OWN_CLASSES = frozenset({"CellNamespace", "OutputRelay"})
#: Ray Serve's controller, by which a running Serve instance is known.
SERVE_CONTROLLER = ("SERVE_CONTROLLER_ACTOR", "serve")


def _job_hex() -> str:
    return ray.get_runtime_context().get_job_id()


def _named() -> dict[str, list[str]]:
    """The named actors' namespaces, by name (any namespace: one name may be in several)."""
    named: dict[str, list[str]] = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        named.setdefault(str(actor["name"]), []).append(str(actor["namespace"]))
    return named


def _namespace_of(name: str, named: dict[str, list[str]], own: str) -> str:
    """The namespace of this job's actor named ``name``: the driver's own where one of that name is there (another
    notebook's may have the same name in its namespace), else the one it was given (``.options(namespace=...)``)."""
    spaces = named.get(name, [])
    return own if own in spaces else min(spaces, default="")


def _serve_running(named: dict[str, list[str]]) -> bool:
    name, namespace = SERVE_CONTROLLER
    return namespace in named.get(name, [])


#: The Serve applications this agent's cells deployed, by name (see :func:`watch_serve`).
SERVE_APPS: set[str] = set()
_serve_lock = threading.Lock()


def _note_serve(api: Any) -> None:
    """Wrap ``ray.serve.api``'s funnel of ``serve.run`` and ``serve.run_many`` (``_run_many``), its ``delete`` and
    its ``shutdown``, to keep :data:`SERVE_APPS`."""
    if getattr(api, "_jupyter_cluster_noted", False):
        return
    run_many, delete, shutdown = api._run_many, api.delete, api.shutdown

    def _run_many(targets: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        handles = run_many(targets, *args, **kwargs)
        with _serve_lock:
            SERVE_APPS.update(str(t.name) for t in targets)
        return handles

    @functools.wraps(delete)
    def _delete(name: str, *args: Any, **kwargs: Any) -> Any:
        result = delete(name, *args, **kwargs)
        with _serve_lock:
            SERVE_APPS.discard(name)
        return result

    @functools.wraps(shutdown)
    def _shutdown(*args: Any, **kwargs: Any) -> Any:
        result = shutdown(*args, **kwargs)
        with _serve_lock:
            SERVE_APPS.clear()
        return result

    api.delete, api.shutdown, api._run_many = _delete, _shutdown, _run_many
    api._jupyter_cluster_noted = True


class _ServeImport(importlib.abc.MetaPathFinder):
    """Notes Serve's applications from the moment ``ray.serve.api`` is imported (by ``from ray import serve`` in a
    cell), without importing Serve (seconds, and memory) in an agent that never uses it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "ray.serve.api":
            return None
        sys.meta_path.remove(self)  # Python's own finders find it; this one only wraps its loading
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_note(module: Any) -> None:
            exec_module(module)
            _note_serve(module)

        spec.loader.exec_module = exec_and_note  # type: ignore[method-assign]
        return spec


def watch_serve() -> None:
    """Note, from now on, the Serve applications this process deploys (see :data:`SERVE_APPS`)."""
    api = sys.modules.get("ray.serve.api")
    if api is not None:
        _note_serve(api)
    elif not any(isinstance(finder, _ServeImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ServeImport())


def _serve_apps() -> dict[str, dict[str, str]]:
    """The Serve applications this agent's cells deployed, of those Serve runs now."""
    from ray import serve

    with _serve_lock:
        ours = set(SERVE_APPS)
    apps = {}
    for name, app in serve.status().applications.items():
        if name in ours:
            apps[name] = {"status": str(getattr(app.status, "value", app.status)), "message": app.message or ""}
    return apps


def _stop_serve(apps: Sequence[str], errors: list[str]) -> None:
    """Stop the cells' Serve applications ``apps``: Serve itself (``serve.shutdown()``) where it runs no other
    notebook's, each of them (``serve.delete``) where it does."""
    from ray import serve

    try:
        if set(serve.status().applications) <= set(apps):
            serve.shutdown()
            return
    except Exception as exc:
        errors.append(f"serve.status(): {exc}")
        return
    for name in apps:
        try:
            serve.delete(name)
        except Exception as exc:
            errors.append(f"serve.delete({name!r}): {exc}")


def started(own_classes: frozenset[str] = OWN_CLASSES) -> dict[str, Any]:
    """The actors, Serve applications and placement groups this agent's job started.

    ``{"actors": [{"id", "name", "namespace", "class", "detached", "state"}],
    "serve": {app: {"status", "message"}}, "placement_groups": [{"id", "name", "state"}]}``
    """
    job = _job_hex()
    named, own = _named(), ray.get_runtime_context().namespace
    actors = []
    for actor_id, info in ray._private.state.actors().items():
        if info.get("JobID") != job or info.get("State") == "DEAD":
            continue
        cls = str(info.get("ActorClassName", ""))
        if cls in own_classes:
            continue
        name = str(info.get("Name") or "")
        namespace = _namespace_of(name, named, own) if name else ""
        if namespace == SERVE_CONTROLLER[1]:
            # Serve's own (its controller, proxies and replicas: of the job that first started Serve, whoever's
            # applications they run), stopped with the applications.
            continue
        actors.append(
            {
                "id": actor_id,
                "name": name,
                "namespace": namespace,
                "class": cls,
                "detached": bool(info.get("IsDetached")),
                "state": str(info.get("State", "")),
            }
        )
    serve: dict[str, dict[str, str]] = {}
    if SERVE_APPS and _serve_running(named):
        try:
            serve = _serve_apps()
        except Exception as exc:  # the controller is starting or stopping
            serve = {"?": {"status": "UNKNOWN", "message": str(exc)}}
    groups = [
        {"id": pg_id, "name": str(info.get("name", "")), "state": str(info.get("state", ""))}
        for pg_id, info in ray.util.placement_group_table().items()
        if pg_id.endswith(job) and info.get("state") != "REMOVED"
    ]
    return {"actors": actors, "serve": serve, "placement_groups": groups}


def other_drivers() -> list[dict[str, Any]]:
    """The cluster's other live drivers, from Ray's job table (the GCS): other notebooks' agents (by their
    entrypoint, ``-m jupyter_cluster.agent``), scripts and submitted jobs. What ``down`` would stop with the
    cluster, and what the status card counts as other work."""
    from ray._private import state

    own = _job_hex()
    found = []
    for job in state.state.job_table():
        if job.get("IsDead") or job.get("JobID") == own:
            continue
        entrypoint = str(job.get("Entrypoint") or "")
        found.append(
            {
                "job": job.get("JobID"),
                "pid": job.get("DriverPid"),
                "address": job.get("DriverIPAddress"),
                "notebook": "jupyter_cluster.agent" in entrypoint,
                "entrypoint": entrypoint[:200],
            }
        )
    return found


def stop_started(driver_ns: dict[str, Any], own_classes: frozenset[str] = OWN_CLASSES) -> dict[str, Any]:
    """Stop what :func:`started` lists, make ``driver_ns`` fresh (with ``ray``); say what was stopped."""
    before = started(own_classes)
    stopped: dict[str, Any] = {"serve": sorted(before["serve"]), "actors": [], "placement_groups": 0, "errors": []}
    if before["serve"]:
        _stop_serve(sorted(before["serve"]), stopped["errors"])
    from ._raycode import end_script, kill_actors

    end_script()

    # An unnamed actor goes with its last handle, unless a method of it runs (a loop): those are stopped by id.
    kill_actors([ray.ActorID.from_hex(a["id"]) for a in before["actors"] if not a["name"] and not a["detached"]])
    from ray._private import worker

    for actor in before["actors"]:
        name = actor["name"]
        if not name:
            continue
        try:  # by its id, not its name: another notebook's actor may have the same name
            worker.global_worker.core_worker.kill_actor(ray.ActorID.from_hex(actor["id"]), True)  # type: ignore[attr-defined]
        except Exception as exc:
            stopped["errors"].append(f"actor {name}: {exc}")
            continue
        stopped["actors"].append(name)
    from ray.util.placement_group import PlacementGroup

    for group in before["placement_groups"]:
        try:
            ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group["id"]))))
        except Exception as exc:
            stopped["errors"].append(f"placement group {group['id'][:8]}: {exc}")
            continue
        stopped["placement_groups"] += 1
    from ._execute import fresh_namespace

    driver_ns.clear()
    # The namespace is the module `__main__`'s (see ._driver): what a module has, multiprocessing reads.
    driver_ns.update(fresh_namespace(), ray=ray, __spec__=None, __loader__=None, __package__=None, __doc__=None)
    gc.collect()  # unnamed actors go with the last handle to them
    unnamed = [a for a in before["actors"] if not a["name"]]
    stopped["unnamed"] = len(unnamed)
    return stopped


__all__ = ["OWN_CLASSES", "SERVE_APPS", "other_drivers", "started", "stop_started", "watch_serve"]
