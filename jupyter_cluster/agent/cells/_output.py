"""A running cell's printed output, carried from its workers to the notebook in order.

Workers push batches of output to the :class:`OutputRelay` actor on the head as the
cell writes them (see :mod:`._remote`); the :class:`OutputPump` pulls them and hands
each to its cell's :class:`CellStreams`, which emits them in the order the cell wrote
them (an async actor may take calls out of order, and each chunk of a ``--map`` numbers
its own batches). A cell's result waits until every batch it sent has arrived, so no
output comes after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._remote import OutputRelay

log = logging.getLogger("jupyter_cluster.agent")

Batch = list[tuple[str, Any]]
#: The marker :meth:`OutputPump.drain` sends itself through the relay.
DRAINED = "__drained__"
#: The marker a run sends with the id of a placement group it made (see ``CellRunner._end_run``).
PLACEMENT_GROUP = "__placement_group__"


@dataclass
class CellStreams:
    """One cell's output: batches that came early wait for those before them."""

    cell_id: str
    emit: Callable[..., None]
    sent: int = 0
    early: dict[tuple[int, int], Batch] = field(default_factory=dict)
    following: dict[int, int] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    #: Placement groups a run's processes made (by id), to remove should the run be killed.
    placement_groups: list[str] = field(default_factory=list)
    #: Whether the cell (or a chunk of it) has started running on a worker.
    running: bool = False

    def deliver(self, stream: int, index: int, batch: Batch) -> None:
        if index < 0:  # not output: a marker (the cell, or a chunk of it, started running; an event)
            for kind, data in batch:
                if kind == DRAINED:
                    self.drained.set()
                elif kind == PLACEMENT_GROUP:
                    self.placement_groups.append(data)
                else:
                    self.running = self.running or kind == "running"
                    self.emit(kind, data)
            return
        self.early[stream, index] = batch
        following = self.following.get(stream, 0)
        while (stream, following) in self.early:  # in the order the cell wrote them
            self.emit("stream", self.early.pop((stream, following)))
            following += 1
            self.sent += 1
        self.following[stream] = following
        self.arrived.set()

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` batches are out (the cell's workers sent that many), or ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.sent < count:
            self.arrived.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("cell %s: %d output batches never arrived", self.cell_id, count - self.sent)
                return
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass


def relay_name() -> str:
    return f"jupyter-cluster-relay-{os.getpid()}"


def start_relay(node_id: str | None = None) -> Any:
    """The agent's output relay, on its own node: made, or the one made already (see ``init_ray``)."""
    node_id = node_id or ray.get_runtime_context().get_node_id()
    relay = OutputRelay.options(  # type: ignore[attr-defined]
        name=relay_name(),
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()
    # The relay is not detached: Ray ends it once the handle that created it is gone (a handle found by its name
    # does not keep it), so every handle this returned is kept while the agent runs (one more per restart).
    _handles.append(relay)
    return relay


_handles: list[Any] = []


class OutputPump:
    """Pulls output from the relay actor (restarted if it dies) and routes it by cell."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node_id: str) -> None:
        #: The relay's actor name: workers look it up by name (cheaper than passing the handle).
        self.name = relay_name()
        self._node_id = node_id
        self.relay = self._start()
        self.cells: dict[str, CellStreams] = {}
        self._task = loop.create_task(self._pump())

    def _start(self) -> Any:
        return start_relay(self._node_id)

    def open(self, cell_id: str, emit: Callable[..., None]) -> CellStreams:
        self.cells[cell_id] = streams = CellStreams(cell_id, emit)
        return streams

    async def drain(self, cell_id: str, timeout: float = 5.0) -> None:
        """Until everything pushed to the relay for ``cell_id`` so far has been delivered:
        the relay keeps the order of the pushes it has received, so a marker sent now
        comes out after them (the events a run's processes sent before it ended)."""
        streams = self.cells.get(cell_id)
        if streams is None:
            return
        streams.drained.clear()
        try:
            await self.relay.push.remote(cell_id, 0, -1, [(DRAINED, None)])
            await asyncio.wait_for(streams.drained.wait(), timeout)
        except Exception:
            log.warning("cell %s: its relay did not drain within %.0f s", cell_id, timeout)

    def close(self, cell_id: str) -> None:
        self.cells.pop(cell_id, None)

    async def _pump(self) -> None:
        while True:
            try:
                batches = await self.relay.pull.remote()
            except Exception:  # the relay died: make another, keep going
                log.exception("output relay failed; restarting it")
                self.relay = self._start()
                await asyncio.sleep(0.1)
                continue
            for cell_id, stream, index, batch in batches:
                streams = self.cells.get(cell_id)
                if streams is not None:
                    streams.deliver(stream, index, batch)


__all__ = ["CellStreams", "OutputPump"]
