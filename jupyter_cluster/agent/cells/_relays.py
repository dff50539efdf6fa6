"""The agent's output relay actors, found by name once a process (workers, run actors, the agent's driver cells).

A worker looks the relay up by name rather than taking its handle with each task: an actor handle as a task
argument costs more than the rest of a trivial cell's arguments together. This module imports only the standard
library (Ray, lazily), so that any module of the agent may use it without an import circle.
"""

from __future__ import annotations

from typing import Any

_found: dict[str, Any] = {}


def relay(name: str) -> Any:
    """The output relay actor called ``name``, looked up once a process."""
    actor = _found.get(name)
    if actor is None:
        import ray

        actor = _found[name] = ray.get_actor(name)
    return actor


__all__ = ["relay"]
