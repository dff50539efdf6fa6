"""What the notebook draws: the cluster dashboard, cell progress, trials and training runs.

Kernel side only; widgets never reach Ray. They draw what the agent sends through the
session (metrics deltas, cell events) and what the kernel already knows. Bokeh and
ipywidgets are imported when a dashboard is first made, not before.
"""

from __future__ import annotations

from typing import Any


class NotebookViews:
    """The widgets as the API's views (:mod:`jupyter_cluster._views`); each module is imported when first drawn."""

    def progress(self, total: int, label: str, unit: str) -> Any:
        from ._progress import ProgressBar

        return ProgressBar(total, label, unit=unit)

    def training(self, label: str, num_workers: int) -> Any:
        from ._training import TrainingView

        return TrainingView(label, num_workers)

    def trials(self, label: str, metric: str, mode: str) -> Any:
        from ._trials import TrialsView

        return TrialsView(label, metric, mode)

    def output(self) -> Any:
        from ._progress import RemoteBars, write_output

        bars = RemoteBars()
        return lambda batch: write_output(batch, bars)


def __getattr__(name: str) -> Any:
    if name == "Dashboard":
        from ._dashboard import Dashboard

        return Dashboard
    if name == "Timeline":
        from ._timeline import Timeline

        return Timeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Dashboard", "NotebookViews", "Timeline"]
