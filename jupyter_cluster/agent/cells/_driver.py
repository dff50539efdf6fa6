"""``--driver`` cells: code in the agent's own namespace, on its main thread (the head's driver).

The namespace has ``ray`` and lives as long as the agent: what a driver cell starts
(Serve applications, actors, placement groups, Ray Data pipelines) is the notebook's until
``jc.current().reset_driver()`` (:meth:`DriverCells.reset`) stops it. A cell runs on the main thread,
where an interrupt reaches it (:mod:`._interrupt`); one that ignores it is given up on after
``CANCEL_GRACE`` s and goes on running, which its failure says.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import sys
import tempfile
import types
from typing import Any

import ray

from . import _cellsource
from ._execute import CellOutcome, CellOutput, cell_filename, fresh_namespace
from ._fdout import PROCESS_OUTPUT
from ._objects import Deferred
from ._remote import node_ip, run_cell_in
from ._running import CANCEL_GRACE, CellHost, Emit, RunningCell, interrupted

log = logging.getLogger("jupyter_cluster.agent")


class DriverCells:
    """The agent's own namespace, and the cells that run in it."""

    def __init__(self, runner: CellHost) -> None:
        self.runner = runner
        # The namespace is the dict of the module `__main__` names from here on, as a script's is: what pickles
        # by reference (multiprocessing's pool and its functions, pickle itself) finds `__main__.f` of a cell.
        module = types.ModuleType("__main__", "The notebook's --driver cells")
        self.namespace = module.__dict__
        self.namespace.update(fresh_namespace(), ray=ray)
        sys.modules["__main__"] = module
        #: Where each driver cell's source is written, as `__main__.__file__` while it runs: a process that
        #: multiprocessing spawns runs the file of `__main__` again (a script's `if __name__ == "__main__":`
        #: guards its start), as it runs the script under `python`.
        self.files = tempfile.mkdtemp(prefix="jupyter-cluster-driver-")
        atexit.register(shutil.rmtree, self.files, True)

    async def run(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        runner, spec, loop = self.runner, cell.spec, self.runner.loop
        spec.relay = spec.relay or runner.output.name  # a breakpoint()'s prompts go through it, as a worker's do
        args = await runner.inputs_of(cell, request)

        def sink(index: int, batch: list[tuple[str, Any]]) -> None:
            loop.call_soon_threadsafe(cell.emit, "stream", batch)

        filename = cell_filename(spec.source)
        script = os.path.join(self.files, filename.strip("<>") + ".py")

        def run() -> tuple[CellOutcome, list[Any]]:
            if not os.path.exists(script):
                with open(script, "w") as f:
                    f.write(spec.source)
            self.namespace["__file__"] = script
            # Before the code runs, which may start tasks at once that print a traceback through it (._cellsource).
            _cellsource.publish(filename, spec.source)
            # Said at once, whether or not the cell asked: here it costs one message, not a worker's round trip.
            loop.call_soon_threadsafe(cell.emit, "running", {"node": node_ip(), "items": 1})
            values = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
            # What the cell's child processes and C code write to the agent's descriptors comes to it (._fdout).
            output = CellOutput(sink, before_close=PROCESS_OUTPUT.settle)
            PROCESS_OUTPUT.target = output
            try:
                return run_cell_in(spec, self.namespace, values, output)
            finally:
                PROCESS_OUTPUT.target = None

        runner.started(cell, request, {"mode": "driver"})
        cell.job = runner.driver.submit(cell.cell_id, run)
        try:
            done = await runner.unless_abandoned(cell, asyncio.wrap_future(cell.job))
        except (asyncio.CancelledError, KeyboardInterrupt):  # cancelled before it started
            done = (CellOutcome(failure=interrupted(cell.cancelled or "interrupted")), [])
        if done is None:
            return {"outcome": CellOutcome(failure=runner.would_not_stop(cell)), "handles": {}}
        outcome, values = done
        handles = {}
        for name, value in zip(spec.outputs, values, strict=False):
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            info = outcome.outputs.get(name)
            remote = info is not None and info.kind == "remote"
            # What came back inline is put in the object store only if a later cell asks. An ObjectRef is held as
            # it is (Ray refuses to put one): a later cell, like a task given a ref, reads the value it stands for.
            if isinstance(value, ray.ObjectRef):
                runner.table.settle(handle_id, value)
            else:
                runner.table.settle(handle_id, ray.put(value) if remote else Deferred(value))
        return {"outcome": outcome, "handles": handles}

    def cancel(self, cell: RunningCell) -> None:
        if cell.job is not None and not cell.job.cancel():  # it runs: interrupt it
            self.runner.driver.interrupt(cell.cell_id)
        self.runner.loop.call_later(CANCEL_GRACE, self.runner.abandon, cell)

    def running_emit(self) -> Emit | None:
        """The emit of the driver cell started last and still running (any thread may ask)."""
        for cell in reversed(list(self.runner.running.values())):
            if cell.mode == "driver":
                return cell.emit
        return None

    async def started(self) -> dict[str, Any] | None:
        """What the cells started that outlives them (see :mod:`._owned`)."""
        from ._owned import started

        try:
            return await asyncio.wait_for(self.runner.loop.run_in_executor(None, started), 10)
        except Exception:
            log.warning("could not list what the cells started", exc_info=True)
            return None

    async def others(self) -> list[dict[str, Any]] | None:
        """The cluster's other live drivers (see :func:`._owned.other_drivers`); None where Ray's job table could
        not be read."""
        from ._owned import other_drivers

        try:
            return await asyncio.wait_for(self.runner.loop.run_in_executor(None, other_drivers), 10)
        except Exception:
            log.warning("could not list the cluster's other drivers", exc_info=True)
            return None

    async def reset(self) -> dict[str, Any]:
        """Stop what the notebook's cells started (Serve, actors, placement groups) and
        empty the driver's namespace; refused while cells run."""
        from ._owned import stop_started

        running = self.runner.running
        if running:
            labels = ", ".join(c.spec.label or c.cell_id for c in running.values())
            return {"refused": f"cells are still running ({labels}): wait for them or cancel them, then reset"}
        return await self.runner.loop.run_in_executor(None, stop_started, self.namespace)


__all__ = ["DriverCells"]
