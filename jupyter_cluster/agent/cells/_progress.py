"""Ray's own progress bars (``ray.experimental.tqdm_ray``), routed to the cell that made them.

In a worker, ``tqdm_ray`` prints its state as JSON lines with a magic token; a Ray
driver reads them back from the workers' logs and draws the bars. The agent is that
driver for ``--driver`` cells, so it takes both roles over: the bar manager of its own
process (a driver cell's bars) and the handler of its workers' log lines (the bars of
the tasks a driver cell starts) both send the JSON line to the driver cell running now,
as its output; the notebook draws it (see :class:`jupyter_cluster.widgets._progress.RemoteBars`).
The other lines of the workers go to the cell that started the work (see :mod:`._logs`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jupyter_cluster.agent")

RAY_TQDM_MAGIC = "__ray_tqdm_magic_token__"


class DriverBars:
    """Stands in for Ray's bar manager in the agent; ``current()`` is the driver cell's emit, if one runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, current: Callable[[], Callable[..., None] | None]) -> None:
        self.loop = loop
        self.current = current
        self.sent = 0

    # Ray's _BarManager interface (tqdm_ray calls these in a driver process)
    def process_state_update(self, state: dict[str, Any]) -> None:
        self._send(json.dumps(state))

    def hide_bars(self) -> None:
        pass

    def unhide_bars(self) -> None:
        pass

    # A handler of Ray's worker log stream
    def on_logs(self, data: dict[str, Any]) -> None:
        for line in data.get("lines", ()):
            if RAY_TQDM_MAGIC in line:
                self._send(line)

    def _send(self, line: str) -> None:
        emit = self.current()
        if emit is None:
            return
        self.sent += 1
        self.loop.call_soon_threadsafe(emit, "stream", [("stdout", line.rstrip("\n") + "\n")])


def install(loop: asyncio.AbstractEventLoop, current: Callable[[], Callable[..., None] | None]) -> DriverBars | None:
    """Take over ``tqdm_ray``'s bar manager, and route its bars in the workers' lines, in this (driver) process."""
    try:
        from ray._private import worker
        from ray.experimental import tqdm_ray
    except ImportError:  # a Ray without them: bars stay text
        return None
    bars = DriverBars(loop, current)
    with tqdm_ray._mgr_lock:
        tqdm_ray._manager = bars  # type: ignore[assignment]
    # Ray's own printer of worker lines is already gone (see ._main.init_ray); the other lines go by ._logs.
    worker.global_worker_stdstream_dispatcher.add_handler("jupyter_cluster_bars", bars.on_logs)
    return bars


__all__ = ["DriverBars", "install"]
