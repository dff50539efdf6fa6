"""Ray's ``runtime_env`` for each session's cells, and what a cell shows while Ray prepares one.

A session's environment (``%cluster local/connect/up --runtime-env``, then ``%cluster sync``,
which adds a ``working_dir``) is merged into every task, actor, map and ``jc.submit`` of that
session; a cell's own (``--pip``, ``--env``, ``--runtime-env``) is merged over it. Ray does the
rest: it installs the packages into a virtualenv of its own on each node that runs the work,
caches it for the next cell, and fails the task with the installer's output when that fails.

Merging follows Ray's own rule for a child's environment (field by field, ``env_vars`` key by
key) with two exceptions a notebook needs: the session's and the cell's ``pip`` packages add up
(``--pip`` on one cell should not drop what the session installs everywhere), and the agent's
``py_modules`` (its own code, when it was shipped to the head) are never dropped.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Mapping
from typing import Any

import ray

from ._execute import RemoteFailure
from ._objects import CellRequestError
from ._running import RunningCell

#: Fields a user may give: Ray's own (``RuntimeEnv.known_fields``), less those the agent sets.
RESERVED = ("worker_process_setup_hook",)
#: Fields whose setup takes time on a node (a download, an install): a cell asking for one
#: shows what Ray is doing until it runs.
PREPARED = ("pip", "uv", "conda", "working_dir", "py_modules", "container", "image_uri", "py_executable")
#: How often a preparing cell's status line is refreshed.
PREPARING_EVERY = 1.0


def validate(env: Any, what: str = "runtime_env") -> dict[str, Any]:
    """``env`` as Ray would take it, or a :class:`CellRequestError` saying what is wrong."""
    from ray.runtime_env import RuntimeEnv

    if not isinstance(env, Mapping):
        raise CellRequestError(f"{what} must be a dict (Ray's runtime_env), not {type(env).__name__}")
    env = dict(env)
    for key in env:
        if key in RESERVED:
            raise CellRequestError(f"{what}: {key} is the agent's own (it routes what the workers print to the cells)")
        if key not in RuntimeEnv.known_fields and not key.startswith("_"):
            known = ", ".join(sorted(k for k in RuntimeEnv.known_fields if not k.startswith("_") and k not in RESERVED))
            raise CellRequestError(f"{what}: Ray's runtime_env has no field {key!r}; its fields are {known}")
    try:
        RuntimeEnv(**env)
    except Exception as exc:
        raise CellRequestError(f"{what}: Ray refused it: {exc}") from None
    return env


def _packages(pip: Any) -> list[Any] | None:
    if isinstance(pip, (list, tuple)):
        return list(pip)
    if isinstance(pip, Mapping) and isinstance(pip.get("packages"), (list, tuple)):
        return list(pip["packages"])
    return None


def merge(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """``child`` over ``base``: field by field, ``env_vars`` by key, ``pip`` and ``py_modules`` added up.

    >>> merge({"pip": ["a"], "env_vars": {"X": "1"}}, {"pip": ["b", "a"], "env_vars": {"Y": "2"}})
    {'pip': ['a', 'b'], 'env_vars': {'X': '1', 'Y': '2'}}
    """
    merged = dict(base)
    for key, value in child.items():
        if key == "env_vars":
            merged[key] = {**(merged.get(key) or {}), **value}
        elif key == "pip" and _packages(merged.get("pip")) is not None and _packages(value) is not None:
            had = _packages(merged["pip"]) or []
            packages = [*had, *(p for p in _packages(value) or [] if p not in had)]
            settings = {
                **(merged["pip"] if isinstance(merged["pip"], Mapping) else {}),
                **(value if isinstance(value, Mapping) else {}),
            }
            merged[key] = {**settings, "packages": packages} if settings else packages
        elif key == "py_modules" and merged.get(key):
            merged[key] = [*merged[key], *(m for m in value if m not in merged[key])]
        else:
            merged[key] = value
    return merged


class Environments:
    """Each session's runtime_env, and the environment each of its cells runs in."""

    def __init__(self, job_modules: list[str] | None = None) -> None:
        #: ``py_modules`` every worker of the agent's job needs (its own code, shipped to the head).
        self.job_modules = list(job_modules or [])
        self.sessions: dict[str, dict[str, Any]] = {}

    def set(self, session: str, env: Mapping[str, Any] | None) -> dict[str, Any]:
        """The session's environment from now on (what a sync added is kept unless ``env`` names its own)."""
        env = validate(env or {}, "the session's runtime_env")
        synced = self.sessions.get(session, {}).get("working_dir")
        if synced and "working_dir" not in env:
            env["working_dir"] = synced
        self.sessions[session] = env
        return env

    def update(self, session: str, **fields: Any) -> None:
        self.sessions[session] = {**self.sessions.get(session, {}), **fields}

    def of(self, session: str) -> dict[str, Any]:
        return dict(self.sessions.get(session, {}))

    def for_cell(
        self, session: str, env: Mapping[str, Any] | None, what: str = "the cell's runtime_env"
    ) -> dict[str, Any] | None:
        """The runtime_env of one cell of ``session`` (None: the job's own)."""
        cell = validate(env, what) if env else {}
        merged = merge(self.sessions.get(session, {}), cell)
        if not merged:
            return None
        if merged.get("py_modules") and self.job_modules:
            merged["py_modules"] = [*self.job_modules, *(m for m in merged["py_modules"] if m not in self.job_modules)]
        return merged

    def apply(self, session: str, options: dict[str, Any], mode: str) -> None:
        """Put the cell's runtime_env into its ``options`` (in place), or refuse it for a driver cell."""
        given = options.get("runtime_env")
        if mode == "driver":
            if given:
                raise CellRequestError(
                    "--pip, --env and --runtime-env are for cells that run as Ray tasks or actors; a --driver cell "
                    "runs in the agent's own process on the head. Give the tasks it starts their own "
                    "(`@ray.remote(runtime_env={...})`), or run this cell without --driver"
                )
            return
        env = self.for_cell(session, given)
        options["own_env"] = bool(given)  # the cell asked for one itself (see ActorCells.actor)
        if env is None:
            options.pop("runtime_env", None)
        else:
            options["runtime_env"] = env


#: pip's own error lines, and Ray's line saying what failed.
_ERROR_LINE = re.compile(
    r"^\s*(ERROR:|error:|ModuleNotFoundError|.*Could not find a version|.*No matching distribution)"
)
#: How many lines of the installer's output a failure shows at most.
FAILURE_LINES = 12


def is_setup_error(exc: BaseException) -> bool:
    """Whether ``exc`` says Ray could not set up a runtime environment (a task's or an actor's)."""
    if isinstance(exc, ray.exceptions.RuntimeEnvSetupError):
        return True
    return isinstance(exc, ray.exceptions.RayActorError) and "RuntimeEnvSetupError" in str(exc)


def setup_failure(exc: BaseException, env: Mapping[str, Any] | None) -> RemoteFailure:
    """A cell whose environment Ray could not prepare: what it was preparing, and the installer's own
    error, trimmed to the lines that say what went wrong."""
    text = _ANSI.sub("", str(exc))
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    errors = [line.strip() for line in lines if _ERROR_LINE.match(line)]
    kept = list(dict.fromkeys(errors))[:FAILURE_LINES] or lines[-FAILURE_LINES:]
    what = describe(env or {})
    message = (
        f"Ray could not prepare the cell's environment ({what}); the cell did not run. The installer said:\n"
        + "\n".join(f"    {line}" for line in kept)
        + "\nCheck the package names and versions (the whole log: runtime_env_setup-*.log in Ray's log folder "
        "of the node)."
    )
    return RemoteFailure("RuntimeEnvSetupError", "jupyter_cluster._errors", message, [], None)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def needs_setup(env: Mapping[str, Any] | None) -> bool:
    return bool(env) and any(env.get(k) for k in PREPARED)  # type: ignore[union-attr]


def describe(env: Mapping[str, Any]) -> str:
    """What Ray prepares for ``env``, in a few words."""
    parts = []
    packages = _packages(env.get("pip")) or _packages(env.get("uv"))
    if packages:
        parts.append("pip install " + " ".join(str(p) for p in packages))
    elif isinstance(env.get("pip"), str):
        parts.append(f"pip install -r {env['pip']}")
    if env.get("conda"):
        parts.append("a conda environment")
    if env.get("working_dir"):
        parts.append("the synced folder")
    if env.get("py_modules"):
        parts.append("py_modules")
    return ", ".join(parts) or "the runtime environment"


def setup_log() -> str | None:
    """Ray's log of the runtime environments it sets up for the agent's job on this node."""
    try:
        from ray._private import worker

        node: Any = worker._global_node
        logs = node.get_logs_dir_path()
        job = ray.get_runtime_context().get_job_id()
    except Exception:
        return None
    return os.path.join(logs, f"runtime_env_setup-{job}.log")


def last_line(path: str | None, since: int = 0, limit: int = 64 * 1024) -> str:
    """The last non-empty line written to ``path`` after byte ``since`` (at most ``limit`` bytes read)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(since, end - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line:
            # Ray's log lines open with a timestamp and the logger: keep what pip or Ray said.
            parts = line.split(" -- ", 1)
            return (parts[1] if len(parts) == 2 else line)[:200]
    return ""


async def show_preparing(cell: RunningCell, env: Mapping[str, Any]) -> None:
    """Tell the notebook, every second until the cell runs, that Ray is preparing its environment,
    with the last line Ray logged of it on this node (its pip output, say)."""
    what = describe(env)
    path = setup_log()
    loop = asyncio.get_running_loop()
    since = await loop.run_in_executor(None, _size, path)
    started = time.monotonic()
    while cell.streams is not None and not cell.streams.running and not cell.cancelled:
        line = await loop.run_in_executor(None, last_line, path, since)
        cell.emit("preparing", {"what": what, "elapsed": time.monotonic() - started, "line": line})
        await asyncio.sleep(PREPARING_EVERY)


def _size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


__all__ = [
    "Environments",
    "describe",
    "is_setup_error",
    "last_line",
    "merge",
    "needs_setup",
    "setup_failure",
    "setup_log",
    "show_preparing",
    "validate",
]
