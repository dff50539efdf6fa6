"""What the API draws in a notebook while it works: progress bars, a training run's view, a sweep's.

The drawing is ``widgets/``'s, and the widgets sit above the API (they read clusters), so the
API does not import them: it asks :data:`views` for one. The package sets :data:`views` to the
widgets' maker when it is imported (``jupyter_cluster/__init__.py``, which importing any part of
the package runs first), so in practice it is always there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class ProgressView(Protocol):
    """A progress bar (``widgets._progress.ProgressBar``)."""

    def update(self, done: int | None = None, running: int | None = None, failed: int | None = None) -> None: ...

    def finish(self, outcome: str = "done", detail: str = "", done: int | None = None) -> None: ...

    def on_wait(self, wanted: int | None = None) -> Callable[[str, Any], None]:
        """What drives the bar from the events of a ``wait`` request with progress."""
        ...


class Views(Protocol):
    def progress(self, total: int, label: str, unit: str) -> ProgressView: ...

    def training(self, label: str, num_workers: int) -> Any: ...

    def trials(self, label: str, metric: str, mode: str) -> Any: ...

    def output(self) -> Callable[[list[tuple[str, Any]]], None]:
        """What writes a batch of a cell's output (``(stdout|stderr|display, data)``) into the notebook, remote
        progress bars drawn as bars."""
        ...


class _NoViews:
    """Before the package registered its widgets (only a part of it imported on its own, which Python
    does not allow): a clear error, not an AttributeError."""

    def _missing(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("jupyter_cluster's widgets are not registered: import jupyter_cluster first")

    progress = training = trials = output = _missing


views: Views = _NoViews()


def use(maker: Views) -> None:
    """Make ``maker`` the views the API draws with."""
    global views
    views = maker


__all__ = ["ProgressView", "Views", "use", "views"]
