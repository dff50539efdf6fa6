"""What the notebook's cells started on the cluster, beyond their own results.

A ``--driver`` cell has the whole Ray API: it can start actors (detached ones too,
which outlive the agent), Serve applications and placement groups. Everything the
agent's job creates carries its job id in Ray's tables, so the agent can list what
its cells started, and stop it, without having kept the handles:

- actors: Ray's actor table (the GCS; no dashboard needed), alive ones of this job,
  less the agent's own (the ``--actor`` namespaces and the output relay);
- Serve applications: ``serve.status()``, when a Serve controller runs;
- placement groups: Ray's placement group table; a placement group id ends with its
  job's id.

:func:`stop_started` stops them: ``serve.shutdown()``, then the named actors of the
job (``ray.kill``), then its placement groups. Unnamed actors live only as long as
a handle to them: clearing the driver's namespace lets them go.
"""

from __future__ import annotations

import gc
import logging
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


def _named() -> dict[str, str]:
    """Named actors' namespaces, by name (any namespace)."""
    return {str(a["name"]): str(a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)}


def _serve_running(named: dict[str, str]) -> bool:
    name, namespace = SERVE_CONTROLLER
    return named.get(name) == namespace


def _serve_apps() -> dict[str, dict[str, str]]:
    from ray import serve

    apps = {}
    for name, app in serve.status().applications.items():
        apps[name] = {"status": str(getattr(app.status, "value", app.status)), "message": app.message or ""}
    return apps


def started(own_classes: frozenset[str] = OWN_CLASSES) -> dict[str, Any]:
    """The actors, Serve applications and placement groups this agent's job started.

    ``{"actors": [{"id", "name", "namespace", "class", "detached", "state"}],
    "serve": {app: {"status", "message"}}, "placement_groups": [{"id", "name", "state"}]}``
    """
    job = _job_hex()
    named = _named()
    actors = []
    for actor_id, info in ray._private.state.actors().items():
        if info.get("JobID") != job or info.get("State") == "DEAD":
            continue
        cls = str(info.get("ActorClassName", ""))
        if cls in own_classes:
            continue
        name = str(info.get("Name") or "")
        actors.append(
            {
                "id": actor_id,
                "name": name,
                "namespace": named.get(name, "") if name else "",
                "class": cls,
                "detached": bool(info.get("IsDetached")),
                "state": str(info.get("State", "")),
            }
        )
    serve: dict[str, dict[str, str]] = {}
    if _serve_running(named):
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
        from ray import serve

        try:
            serve.shutdown()
        except Exception as exc:
            stopped["errors"].append(f"serve.shutdown(): {exc}")
    from ._raycode import end_script, kill_actors

    end_script()

    # An unnamed actor goes with its last handle, unless a method of it runs (a loop): those are stopped by id.
    kill_actors([ray.ActorID.from_hex(a["id"]) for a in before["actors"] if not a["name"] and not a["detached"]])
    for actor in before["actors"]:
        name = actor["name"]
        if not name:
            continue
        try:
            ray.kill(ray.get_actor(name, namespace=actor["namespace"]), no_restart=True)
        except ValueError:  # gone meanwhile (Serve's own actors, with serve.shutdown())
            continue
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


__all__ = ["OWN_CLASSES", "started", "stop_started"]
