"""``--actor NAME`` cells: a named actor per name, holding the cells' namespace.

Each name is a :class:`._remote.CellNamespace` actor (``cell-namespace:NAME``), made by
the first cell that names it and kept until it is killed or dies; its cells run one at a
time, in order. A cell is interrupted in the actor's own process (:mod:`._interrupt`),
wherever on the cluster that runs. Runs (``jc.train_torch``, ``jc.tune``) are cells of an
ephemeral actor of their own, detached so that what they start goes with it; a spare one,
warmed up with Ray Train and Ray Tune imported, waits for the next run once one was made.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._environment import describe
from ._interrupt import interrupt_process
from ._objects import CellRequestError
from ._remote import CellNamespace, interrupt_actor_cell
from ._resources import ray_options
from ._running import CANCEL_GRACE, CellHost, RunningCell

log = logging.getLogger("jupyter_cluster.agent")

#: What a run's actor imports ahead of time (see :meth:`ActorCells.start_spare`).
RUN_MODULES = ("ray.train.torch", "ray.tune", "jupyter_cluster.agent.runs._train", "jupyter_cluster.agent.runs._tune")
#: A run (``jc.train_torch``, ``jc.tune``) stops its workers or trials itself when
#: interrupted (Ray Train's abort removes its placement group): it gets this long.
RUN_GRACE = 30.0


#: What a run's actor holds unless the run asks for more (a local-mode training run holds a worker's CPUs).
RUN_OPTIONS: dict[str, Any] = {"cpus": 0, "gpus": None, "memory": None, "resources": None}


def _held(options: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(options.get(key) or 0 for key in RUN_OPTIONS)


@dataclass
class ActorRecord:
    handle: Any
    where: Any  # ObjectRef of CellNamespace.where()
    names: list[str] = field(default_factory=list)
    env: dict[str, Any] | None = None  # the runtime_env it was made with


class ActorCells:
    """The named actors of the notebooks attached, and their cells."""

    def __init__(self, runner: CellHost) -> None:
        self.runner = runner
        self.actors: dict[str, ActorRecord] = {}
        self.killed: set[str] = set()  # actors killed on request: their cells say so
        #: An actor ready for the next run (``jc.train_torch``, ``jc.tune``), once one was made.
        self._spare: ActorRecord | None = None

    def actor(self, name: str, options: dict[str, Any]) -> ActorRecord:
        record = self.actors.get(name)
        env = options.get("runtime_env")
        if record is not None and options.get("own_env") and env != record.env:
            raise CellRequestError(
                f"actor `{name}` runs in the environment it was made with, and this cell asks for another "
                f"({describe(env or {})}); `jc.current().kill_actor({name!r})` ends it (and its namespace), and the "
                f"next `--actor {name}` cell makes it anew in the environment it asks for"
            )
        if record is None:
            self.runner.cluster.check_feasible(options)
            spare = self._spare
            if options.get("ephemeral") and spare is not None and not env and _held(options) == _held(RUN_OPTIONS):
                record, self._spare = spare, None  # started and warmed up while the last run ended
            else:
                record = self._new_actor(name, options)
            self.actors[name] = record
            self.killed.discard(name)
        return record

    def _new_actor(self, name: str, options: dict[str, Any]) -> ActorRecord:
        extra: dict[str, Any] = {}
        if options.get("head"):  # where the agent runs: a run's results stay on this node
            extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.runner.node_id, soft=False)
        if options.get("ephemeral"):  # its placement groups then go when it is killed
            extra["lifetime"] = "detached"
        handle = CellNamespace.options(  # type: ignore[attr-defined]
            name=f"cell-namespace:{name}", get_if_exists=True, **ray_options(options), **extra
        ).remote(name)
        return ActorRecord(handle, handle.where.remote(), env=options.get("runtime_env"))

    def start_spare(self, options: dict[str, Any]) -> None:
        """Start the next run's actor now, with Ray Train and Ray Tune imported: a run then
        starts without a process to spawn and seconds of imports (only once a run was made).

        It holds what a run's actor holds by default (no CPU: a local-mode run, which holds one,
        gets an actor of its own), and none is kept in a small container, where its 250 MiB and
        more of imports would wait idle beside the notebook's work."""
        from .._sizing import small_machine

        if self._spare is None and not options.get("runtime_env") and not small_machine():
            self._spare = self._new_actor(f"run-spare-{time.monotonic_ns()}", {**options, **RUN_OPTIONS})
            self._spare.handle.warm.remote(RUN_MODULES)

    def kill(self, name: str) -> bool:
        """Kill actor ``name`` (its namespace and whatever it runs); False if there is none."""
        record = self.actors.pop(name, None)
        try:
            handle = record.handle if record is not None else ray.get_actor(f"cell-namespace:{name}")
        except ValueError:
            return False
        self.killed.add(name)
        ray.kill(handle, no_restart=True)
        return True

    def lost(self, name: str) -> str:
        """Forget actor ``name``, which went away under a cell: how it went."""
        self.actors.pop(name, None)
        return "was killed (kill_actor)" if name in self.killed else "died"

    async def run(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        runner, spec = self.runner, cell.spec
        cell.actor = cell.options["actor"]
        record = self.actor(cell.actor, cell.options)
        cell.where = record.where
        args = await runner.inputs_of(cell, request)
        method = record.handle.run if not spec.outputs else record.handle.run.options(num_returns=1 + len(spec.outputs))
        refs = method.remote(runner.spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs = refs
        runner.note_work(cell, refs)
        handles = runner.settle_outputs(spec, refs[1:])
        runner.started(cell, request, {"mode": "actor", "actor": cell.actor})
        outcome = await runner.finish(cell, refs[0])
        if cell.options.get("ephemeral"):  # a run: the events its workers sent come before its end
            await runner.output.drain(cell.cell_id)
        return {"outcome": outcome, "handles": handles}

    def cancel(self, cell: RunningCell) -> None:
        if cell.refs:
            ray.cancel(cell.refs[0], force=False)  # a cell still queued never starts
        cell.interrupting = asyncio.ensure_future(self._interrupt(cell))
        grace = RUN_GRACE if cell.options.get("ephemeral") else CANCEL_GRACE
        self.runner.loop.call_later(grace, self.runner.abandon, cell)

    async def _interrupt(self, cell: RunningCell) -> None:
        try:
            where = await cell.where
            if where["node_id"] == self.runner.node_id:
                interrupt_process(where["pid"], where["flag"], cell.cell_id)
            else:
                strategy = NodeAffinitySchedulingStrategy(where["node_id"], soft=False)
                await interrupt_actor_cell.options(scheduling_strategy=strategy).remote(
                    where["pid"], where["flag"], cell.cell_id
                )
        except Exception:  # the actor is gone: its cell ends by itself
            log.exception("could not interrupt cell %s in actor %s", cell.cell_id, cell.actor)

    def end_run(self, cell: RunningCell) -> None:
        """Stop a run's own actor (``jc.train_torch``, ``jc.tune``) and all it started.

        The actor is detached, so the placement groups it made (Tune's trials') go with
        it; the actors it owns (trials, Ray Train's controller and workers) die with it;
        the placement groups its actors made (Ray Train's workers') are removed here.
        """
        self.kill(cell.actor)
        if not self.runner.loop.is_closed():
            self.start_spare(cell.options)
        for group_id in cell.streams.placement_groups if cell.streams is not None else ():
            try:
                from ray.util.placement_group import PlacementGroup, remove_placement_group

                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
            except Exception:  # removed already (the run ended well)
                pass

    def close(self) -> None:
        if self._spare is not None:
            ray.kill(self._spare.handle, no_restart=True)
            self._spare = None

    async def describe(self, busy: dict[str, str]) -> dict[str, Any]:
        """Each actor's names (an actor running a cell, ``busy``, is not asked: it would answer after it)."""
        actors = {}
        for name, record in self.actors.items():
            if name in busy:
                actors[name] = {"name": name, "names": record.names, "running": busy[name]}
                continue
            try:
                info = await asyncio.wait_for(asyncio.ensure_future(record.handle.describe.remote()), 5)
                record.names = info["names"]
                actors[name] = info
            except Exception as exc:
                actors[name] = {"name": name, "error": str(exc)}
        return actors


__all__ = ["RUN_GRACE", "RUN_MODULES", "ActorCells", "ActorRecord"]
