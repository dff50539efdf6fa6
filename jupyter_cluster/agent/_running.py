"""A cell while the agent runs it, and what every mode's runner shares (see :mod:`._cells`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._execute import CellSpec, RemoteFailure
from ._output import CellStreams

Emit = Callable[..., None]

#: Seconds a cancelled cell gets to stop by itself: then a task's worker is killed, and
#: an actor or driver cell that did not stop is reported at once (it cannot be killed alone).
CANCEL_GRACE = 2.0


@dataclass
class RunningCell:
    cell_id: str
    mode: str
    emit: Emit
    spec: CellSpec
    options: dict[str, Any]
    refs: list[Any] = field(default_factory=list)
    actor: str = ""
    where: Any = None  # the actor's where() ref: its pid, node and flag file
    job: concurrent.futures.Future[Any] | None = None  # a driver cell on the main thread
    interrupting: asyncio.Future[None] | None = None  # an actor cell's interrupt on its way
    cancelled: str = ""
    abandoned: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    streams: CellStreams | None = None
    started: float = field(default_factory=time.time)
    done_items: int = 0
    total_items: int = 1


class CancelledBeforeStart(Exception):
    """A cell cancelled while its inputs were being made ready: it is never submitted."""


def interrupted(reason: str, message: str = "") -> RemoteFailure:
    """The failure of a cell that was cancelled (an interrupt, a ``--timeout``)."""
    return RemoteFailure(
        type_name="KeyboardInterrupt",
        module="builtins",
        message=message or f"the remote work was cancelled ({reason})",
        frames=[],
        exception=None,
        interrupted=True,
    )


__all__ = ["CANCEL_GRACE", "CancelledBeforeStart", "Emit", "RunningCell", "interrupted"]
