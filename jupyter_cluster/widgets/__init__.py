"""What the notebook draws: the cluster dashboard, cell progress, trials and training runs.

Kernel side only; widgets never reach Ray. They draw what the agent sends through the
session (metrics deltas, cell events) and what the kernel already knows. Bokeh and
ipywidgets are imported when a dashboard is first made, not before.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "Dashboard":
        from ._dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Dashboard"]
