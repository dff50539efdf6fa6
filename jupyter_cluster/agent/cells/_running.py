"""A cell while the agent runs it, and what the runner of each mode gets from the cell runner
(:class:`CellHost`, which :class:`._cells.CellRunner` is: the modes depend on this, not on it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ._execute import CellOutcome, CellSpec, RemoteFailure
from ._interrupt import MainThreadCells
from ._objects import ObjectTable
from ._output import CellStreams, OutputPump
from ._resources import ClusterResources

T = TypeVar("T")

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
    #: What killed its worker, when the agent stopped it for that (see ``CellRunner._watch_deaths``).
    death: str = ""


class CancelledBeforeStart(Exception):
    """A cell cancelled while its inputs were being made ready: it is never submitted."""


class CellHost(Protocol):
    """What every mode's runner uses of the cell runner: its loop and tables, a cell's inputs, its
    outputs' handles, its end (see :class:`._cells.CellRunner` for each)."""

    loop: asyncio.AbstractEventLoop
    driver: MainThreadCells
    table: ObjectTable
    cluster: ClusterResources
    node_id: str
    output: OutputPump
    running: dict[str, RunningCell]

    async def inputs_of(self, cell: RunningCell, request: dict[str, Any]) -> list[Any]: ...

    def remote(self, fn: Any, num_returns: int, options: dict[str, Any]) -> Any: ...

    def note_work(self, cell: RunningCell, submitted: Any) -> None: ...

    def started_work(self, cell: RunningCell) -> None: ...

    def spec_bytes(self, spec: CellSpec) -> bytes: ...

    def settle_outputs(self, spec: CellSpec, held: list[Any]) -> dict[str, str]: ...

    def started(self, cell: RunningCell, request: dict[str, Any], info: dict[str, Any]) -> None: ...

    async def finish(self, cell: RunningCell, envelope: Any) -> CellOutcome: ...

    def lost(self, cell: RunningCell, exc: BaseException, what: str) -> RemoteFailure: ...

    def would_not_stop(self, cell: RunningCell) -> RemoteFailure: ...

    async def unless_abandoned(self, cell: RunningCell, awaitable: Awaitable[T]) -> T | None: ...

    async def output_of(self, cell: RunningCell, batches: int, timeout: float = 10.0) -> None: ...

    def abandon(self, cell: RunningCell) -> None: ...


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


__all__ = ["CANCEL_GRACE", "CancelledBeforeStart", "CellHost", "Emit", "RunningCell", "interrupted"]
