"""The agent's Ray-facing side: cells as the kernel asks for them.

:class:`CellRunner` turns a request into Ray calls, by the cell's mode: a task (here), a
named actor's method (:mod:`._actors`), code in the agent's own driver namespace on its
main thread (:mod:`._driver`), or a map of chunk tasks (:mod:`._map`). For every mode it
registers each output in the :class:`ObjectTable` the moment the cell is accepted (so a
later cell can depend on it at once), sends each cell its printed output (see
:mod:`._output`), and stops work on interrupt or timeout. A cell never fails with a Ray
error: a worker that died, an actor that died or work that will not stop each becomes
the cell's own one-line failure. Everything a request produces goes out through an
``emit`` callback, which the server turns into sequenced events.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import ray

from .._shared import SegmentError, Shared
from ..watching._deaths import dead_on_this_node, memory_death
from . import _cellsource
from ._actors import ActorCells
from ._driver import DriverCells
from ._environment import Environments, is_setup_error, needs_setup, setup_failure, show_preparing
from ._execute import CellOutcome, CellSpec, Pickled, RemoteFailure, cell_filename, failed_outputs, unwrap
from ._interrupt import MainThreadCells
from ._logs import WorkerLines
from ._map import MapCells
from ._objects import CellRequestError, ObjectTable
from ._output import OutputPump
from ._remote import run_cell_task, run_function
from ._resources import ClusterResources, retries, task_options
from ._running import CANCEL_GRACE, CancelledBeforeStart, Emit, RunningCell, interrupted

log = logging.getLogger("jupyter_cluster.agent")

T = TypeVar("T")

#: Inputs smaller than this travel inline with the task instead of via ray.put.
INLINE_INPUT = 100 * 1024
#: Seconds the agent's loop may wait in place for a result that is nearly there: an
#: await costs a hop through Ray's callback thread, as long again as a quick cell.
FAST_PATH = 0.003


class Mode(Protocol):
    """How cells of one mode run and stop."""

    async def run(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]: ...

    def cancel(self, cell: RunningCell) -> None: ...


@ray.remote(num_cpus=0)
def assemble(*parts: Any) -> list[Any]:
    """A list input sent in parts (some of them handles), built on the cluster."""
    return [unwrap(p) for p in parts]


@ray.remote(num_cpus=0)
def assemble_tuple(items: list[Any]) -> tuple[Any, ...]:
    return tuple(items)


def _request_failure(spec: CellSpec, message: str) -> RemoteFailure:
    return RemoteFailure("RequestError", "jupyter_cluster._errors", message, [], None, origin=spec.label)


class TaskCells:
    """Plain ``%%remote`` cells: one Ray task each."""

    def __init__(self, runner: CellRunner) -> None:
        self.runner = runner

    async def run(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        runner, spec = self.runner, cell.spec
        runner.cluster.check_feasible(cell.options)
        args = await runner.inputs_of(cell, request)
        remote = runner.remote(run_cell_task, 1 + len(spec.outputs), task_options(cell.options))
        refs = remote.remote(runner.spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs = refs
        runner.note_work(cell, refs)
        handles = runner.settle_outputs(spec, refs[1:])
        runner.started(cell, request, {"mode": "task"})
        outcome = await runner.finish(cell, refs[0])
        return {"outcome": outcome, "handles": handles}

    def cancel(self, cell: RunningCell) -> None:
        for ref in cell.refs[:1]:
            ray.cancel(ref, force=False)
        self.runner.loop.call_later(CANCEL_GRACE, self.force, cell)

    def force(self, cell: RunningCell) -> None:
        if cell.cell_id in self.runner.running:
            for ref in cell.refs[:1]:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already finished
                    pass


def _dead_workers(lines: WorkerLines, cell_id: str) -> list[dict[str, Any]]:
    return dead_on_this_node(lines.tasks_of(cell_id))


#: How many ended cells the agent remembers (for their timelines).
ENDED_KEPT = 1_000
#: How long ended cells wait, at most, for the output relay to forget them, in one batch.
FORGET_EVERY = 1.0
#: The longest a cell sent in the agent's first moments waits for its start-up warm-up (see ``CellRunner.warm``).
WARM_WAIT = 90.0
#: How often the agent looks for a memory kill in its cgroup, and how long after one it looks for the cell it hit.
DEATH_WATCH = 1.0
DEATH_SETTLE = 15.0


class CellRunner:
    """Runs cells and keeps the objects and actors of the notebooks attached."""

    def __init__(self, loop: asyncio.AbstractEventLoop, driver: MainThreadCells) -> None:
        self.loop = loop
        self.driver = driver
        self.table = ObjectTable()
        self.cluster = ClusterResources()
        #: Set once the workers and the output relay the agent started with are up (see ._main.warm_up): a cell
        #: sent before waits for them, rather than for the relay in each of its tasks.
        self.warm = threading.Event()
        self.warm.set()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.output = OutputPump(loop, self.node_id)
        self.running: dict[str, RunningCell] = {}
        #: The values each session sent, by its name and theirs: what a ``cached`` input stands for.
        self.inputs: dict[tuple[str | None, str], tuple[str, Any]] = {}
        self._remotes: dict[Any, Any] = {}
        #: Routes the workers' lines to the cells that started the work (set by the agent; see ._logs).
        self.lines: WorkerLines | None = None
        #: Each session's runtime_env (set by the agent; see ._environment), and its synced folder (._sync).
        self.envs = Environments()
        self.synced: Any = None
        self._death_watch = loop.create_task(self._watch_deaths())
        #: The cells that ended, latest last: their label, mode, start and end (what a timeline is drawn against).
        self.ended: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: Ended cells the output relay has yet to forget (see :meth:`_forget_on_relay`).
        self._forgotten: list[str] = []
        self.actor_cells = ActorCells(self)
        self.driver_cells = DriverCells(self)
        self.modes: dict[str, Mode] = {
            "task": TaskCells(self),
            "actor": self.actor_cells,
            "driver": self.driver_cells,
            "map": MapCells(self),
        }

    @property
    def driver_ns(self) -> dict[str, Any]:
        """The namespace of ``--driver`` cells."""
        return self.driver_cells.namespace

    def timeline(self, cell_id: str) -> dict[str, Any]:
        """The tasks and actor calls cell ``cell_id`` ran (see ._timeline); run off the event loop."""
        from ..watching._timeline import RECENT, SETTLE, spans

        cell = self.running.get(cell_id)
        known = (
            {"label": cell.spec.label, "mode": cell.mode, "start": cell.started, "end": None}
            if cell is not None
            else self.ended.get(cell_id)
        )
        if known is None:
            raise CellRequestError(f"the agent knows no cell {cell_id} (it keeps the last {ENDED_KEPT:,})")
        tasks = self.lines.tasks_of(cell_id) if self.lines is not None else set()
        # A cell that just ended: the last events of its tasks may be on their way. One running, or long ended: as is.
        ended = known["end"]
        recent = isinstance(ended, float) and time.time() - ended < RECENT
        return {**known, "cell_id": cell_id, "spans": spans(tasks, SETTLE if recent else 0.0)}

    def kill_actor(self, name: str) -> bool:
        """Kill actor ``name`` (its namespace and whatever it runs); False if there is none."""
        return self.actor_cells.kill(name)

    def cell_emit(self, cell_id: str) -> Emit | None:
        """The emit of cell ``cell_id`` while it runs (any thread may ask)."""
        cell = self.running.get(cell_id)
        return cell.emit if cell is not None else None

    def note_work(self, cell: RunningCell, submitted: Any) -> None:
        """``submitted`` (refs, a chunk's refs, an actor call) is the cell's own work."""
        if self.lines is not None:
            self.lines.note_submitted(submitted, cell.cell_id)

    def started_work(self, cell: RunningCell) -> None:
        """The cell's code started tasks or actors: its end waits for what they print (see ._logs)."""
        if self.lines is not None:
            self.lines.mark_started(cell.cell_id)

    def driver_cell_emit(self) -> Emit | None:
        """The emit of the driver cell started last and still running (any thread may ask)."""
        return self.driver_cells.running_emit()

    async def reset_driver(self) -> dict[str, Any]:
        return await self.driver_cells.reset()

    # ------------------------------------------------------ what the modes share
    @staticmethod
    async def output_of(cell: RunningCell, batches: int, timeout: float = 10.0) -> None:
        """Wait until the ``batches`` of output the cell's workers sent have gone out."""
        if cell.streams is not None:
            await cell.streams.wait_for(batches, timeout)

    def remote(self, fn: Any, num_returns: int, options: dict[str, Any]) -> Any:
        key = (fn, num_returns, repr(sorted(options.items())))
        remote = self._remotes.get(key)
        if remote is None:
            remote = fn.options(num_returns=num_returns, **options)
            self._remotes[key] = remote
        return remote

    def spec_bytes(self, spec: CellSpec) -> bytes:
        spec.relay = self.output.name
        return pickle.dumps(spec, protocol=5)

    def settle_outputs(self, spec: CellSpec, held: list[Any]) -> dict[str, str]:
        handles = {}
        for name, value in zip(spec.outputs, held, strict=True):
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            self.table.settle(handle_id, value)
        return handles

    # ---------------------------------------------------------------- inputs
    async def resolve_inputs(
        self, inputs: list[tuple[str, str, Any]], keep_pickled: bool = False, session: str | None = None
    ) -> list[Any]:
        """Turn the kernel's input list into task arguments (values or ObjectRefs).

        ``keep_pickled``: leave values pickled for the process that runs the cell, which
        unpickles them once the notebook's own modules are installed there. ``session``:
        whose names they are; its values are kept for its next cells (a ``cached`` input),
        each notebook's apart from the others'. Without one, nothing is kept.
        """
        args = []
        for index, (name, kind, data) in enumerate(inputs):
            if kind == "handle":
                args.append(await self.table.object_ref(data))
            elif kind == "cached":
                held = self.inputs.get((session, name))
                if held is None or held[0] != data:
                    raise CellRequestError(f"input `{name}` is no longer held by the agent; run the cell again")
                args.append(held[1])
            elif kind == "parts":
                container, parts = data
                values = [await self.table.object_ref(d) if k == "handle" else d for k, d in parts]
                ref = assemble.remote(*values)
                args.append(assemble_tuple.remote(ref) if container == "tuple" else ref)
            elif kind == "value":
                digest, blob = data
                # What was sent under this name before is no longer the notebook's: let it go before the new
                # value takes its room in the object store (two large values are not held at once).
                self.inputs.pop((session, name), None)
                try:
                    value = await self.loop.run_in_executor(None, self._load_input, blob, keep_pickled)
                except SegmentError as exc:
                    raise CellRequestError(f"cannot read input `{name}`: {exc}. Run the cell again.") from None
                if session is not None:
                    self.inputs[(session, name)] = (digest, value)
                args.append(value)
                # The request lets go of the bytes: once in the object store, a value is not held twice.
                inputs[index] = (name, kind, (digest, None))
                del blob, data
            else:
                raise CellRequestError(f"unknown input kind {kind!r} for `{name}`")
        return args

    async def inputs_of(self, cell: RunningCell, request: dict[str, Any]) -> list[Any]:
        """The cell's arguments. A cell cancelled meanwhile (its inputs can wait for a
        cell still running) raises :class:`CancelledBeforeStart`: nothing has started
        that a cancel could stop, so it must not start now."""
        shared = any(kind == "value" and isinstance(data[1], Shared) for _, kind, data in request["inputs"])
        args = await self.resolve_inputs(
            request["inputs"], keep_pickled=bool(cell.spec.sources), session=request.get("session")
        )
        if shared:
            cell.emit("taken")  # in the object store now: the kernel's segments are free for its next value
        if not self.warm.is_set():  # the agent's first moments: the workers and the output relay are starting
            await asyncio.to_thread(self.warm.wait, WARM_WAIT)
        if cell.cancelled:
            raise CancelledBeforeStart
        return args

    @staticmethod
    def _load_input(blob: Pickled | Shared, keep_pickled: bool) -> Any:
        if isinstance(blob, Shared):
            # Views on the kernel's segment: ray.put copies them into the object store (a Shared is never
            # INLINE_INPUT small), and the mapping goes with the last view, as this returns.
            blob = blob.pickled()
        value: Any = blob
        if not keep_pickled:
            try:
                value = blob.load()
            except Exception:  # a type only the workers can import: they unpickle it
                value = blob
        if blob.nbytes > INLINE_INPUT:
            return ray.put(value)
        return value

    # ----------------------------------------------------------------- cells
    async def run_cell(self, request: dict[str, Any], emit: Emit) -> None:
        spec: CellSpec = request["spec"]
        mode: str = request["mode"]
        options: dict[str, Any] = request.get("options", {})
        if spec.cell_id in self.running:
            raise CellRequestError(f"cell {spec.cell_id} is already running")
        cell = RunningCell(spec.cell_id, mode, emit, spec, options)
        # For the workers' tracebacks through functions this cell defines (see ._cellsource).
        self.loop.run_in_executor(None, _cellsource.publish, cell_filename(spec.source), spec.source)
        cell.streams = self.output.open(spec.cell_id, emit)
        if self.lines is not None:
            self.lines.name(spec.cell_id, spec.label)
        self.running[spec.cell_id] = cell
        preparing = None
        if needs_setup(options.get("runtime_env")):  # Ray installs it first: the notebook sees that happen
            spec.announce = True
            preparing = asyncio.ensure_future(show_preparing(cell, options["runtime_env"]))
        # Registered before anything is awaited: a cell sent right after this one may read them.
        outputs = [f"{spec.cell_id}/{name}" for name in spec.outputs]
        for handle_id in outputs:
            self.table.pending(handle_id)
        timer = None
        if options.get("timeout"):
            timer = self.loop.call_later(
                options["timeout"], self.cancel, spec.cell_id, f"--timeout {options['timeout']:g} s"
            )
        failure: RemoteFailure | None = None
        try:
            try:
                runs = self.modes.get(mode)
                if runs is None:
                    raise CellRequestError(f"unknown cell mode {mode!r}")
                result = await runs.run(cell, request)
            except CancelledBeforeStart:
                result = {"outcome": CellOutcome(failure=interrupted(cell.cancelled)), "handles": {}}
            outcome = result.get("outcome")
            failure = outcome.failure if outcome is not None else None
            if cell.cancelled:
                result["cancelled"] = cell.cancelled
            if self.lines is not None:
                logged = await self.lines.settle(spec.cell_id, time.time() - cell.started)
                if logged and (failure is not None or "map" in result):  # the cause may be only there
                    result["ray_errors"] = logged
            emit("done", result, final=True)
        except CellRequestError as exc:
            failure = _request_failure(spec, str(exc))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if preparing is not None:
                preparing.cancel()
            if options.get("ephemeral") and cell.actor:
                self.actor_cells.end_run(cell)
            self.running.pop(spec.cell_id, None)
            self.ended[spec.cell_id] = {"label": spec.label, "mode": mode, "start": cell.started, "end": time.time()}
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)
            if self.lines is not None:
                self.lines.forget(spec.cell_id)
            self.output.close(spec.cell_id)
            self._forget_on_relay(spec.cell_id)
            unsettled = [h for h in outputs if self.table.is_pending(h)]
            if unsettled:  # they will never have a value: they carry the failure
                marker = failed_outputs(spec, failure or _request_failure(spec, "the cell ended without a result"))[0]
                for handle_id in unsettled:
                    self.table.fail(handle_id, marker)

    def _forget_on_relay(self, cell_id: str) -> None:
        """Let the relay forget ended cells (a debugger's state), a batch at most every :data:`FORGET_EVERY` s: an
        actor call of its own for each cell took a tenth of a trivial cell's time in the agent."""
        self._forgotten.append(cell_id)
        if len(self._forgotten) == 1:
            self.loop.call_later(FORGET_EVERY, self._forget_now)

    def _forget_now(self) -> None:
        cell_ids, self._forgotten = self._forgotten, []
        try:
            self.output.relay.forget.remote(cell_ids)
        except Exception:  # Ray is shutting down with the agent: nothing is left to forget
            log.debug("the output relay could not forget %d ended cells", len(cell_ids), exc_info=True)

    @staticmethod
    def started(cell: RunningCell, request: dict[str, Any], info: dict[str, Any]) -> None:
        # The kernel needs to hear it only when it sent values (it then knows the agent
        # holds them) or shows progress; a trivial cell is spared the extra message.
        if cell.mode == "map" or any(kind in ("value", "parts") for _, kind, _ in request["inputs"]):
            cell.emit("started", info)

    async def unless_abandoned(self, cell: RunningCell, awaitable: Awaitable[T]) -> T | None:
        """``await awaitable``, or None once the cell is given up on (it would not stop)."""
        waiter: asyncio.Future[Any] = asyncio.ensure_future(awaitable)
        abandoned: asyncio.Future[Any] = cell.abandoned
        await asyncio.wait([waiter, abandoned], return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            result: T = waiter.result()
            return result
        waiter.cancel()
        return None

    async def finish(self, cell: RunningCell, envelope: Any) -> CellOutcome:
        try:
            try:
                raw = ray.get(envelope, timeout=FAST_PATH)  # a quick cell: its result in place
            except ray.exceptions.GetTimeoutError:
                if cell.mode == "actor":  # an actor cell may ignore its interrupt: don't wait for ever
                    raw = await self.unless_abandoned(cell, envelope)
                    if raw is None:
                        return CellOutcome(failure=self.would_not_stop(cell))
                else:
                    raw = await envelope
            outcome: CellOutcome = pickle.loads(raw)
            if outcome.spawned:
                self.started_work(cell)
        except ray.exceptions.RayError as exc:
            stopped = (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)
            what = f"{cell.spec.label or 'the cell'} did not finish:"
            if cell.death:  # the agent stopped it: its worker was killed for memory (see _watch_deaths)
                outcome = CellOutcome(failure=self.died(what, cell.death))
            elif cell.cancelled and isinstance(exc, stopped):
                outcome = CellOutcome(failure=interrupted(cell.cancelled))
            else:
                why = await asyncio.to_thread(self.death_of, cell, exc)
                outcome = CellOutcome(failure=self.lost(cell, exc, what, why))
        await self.output_of(cell, outcome.chunks_sent, 1.0 if cell.cancelled else 10.0)
        return outcome

    async def _watch_deaths(self) -> None:
        """Stop a cell whose worker the kernel killed for memory, at once: Ray would retry it, and each retry would
        be killed again. (Ray's own memory monitor's kills fail the cell themselves: the embedded cluster does not
        retry them.) Each second it reads one file; only after a kill does it look at the running cells' tasks."""
        watching_until = 0.0
        while True:
            await asyncio.sleep(DEATH_WATCH)
            lines = self.lines
            if lines is None or not self.running:
                continue
            if lines.deaths.memory_killed():
                watching_until = time.monotonic() + DEATH_SETTLE  # Ray's events of the death take a moment
            if time.monotonic() > watching_until:
                continue
            # A run's workers and trials are Ray Train's and Ray Tune's to fail (a run's result names the death).
            running = self.running.values()
            for cell in [c for c in running if c.mode != "driver" and not c.death and not c.options.get("ephemeral")]:
                try:
                    dead = await asyncio.to_thread(_dead_workers, lines, cell.cell_id)
                except Exception:
                    log.warning("could not look at cell %s's workers", cell.cell_id, exc_info=True)
                    continue
                if dead and cell.cell_id in self.running:
                    cell.death = memory_death(ip=dead[0]["ip"])
                    self.cancel(cell.cell_id, "it ran out of memory")

    def death_of(self, cell: RunningCell, exc: BaseException) -> str | None:
        """What killed the worker of a cell that died, when more is known than Ray says (off the event loop: it
        reads Ray's task events)."""
        if self.lines is None or not isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.RayError)):
            return None
        try:
            tasks = self.lines.tasks_of(cell.cell_id)
            return self.lines.deaths.why(exc, tasks, cell.cell_id, self.lines.cell_of_worker)
        except Exception:
            log.warning("could not tell what killed cell %s's worker", cell.cell_id, exc_info=True)
            return None

    @staticmethod
    def died(what: str, why: str) -> RemoteFailure:
        """A cell the agent stopped because its worker was killed for memory."""
        message = f"{what} {why} It was not retried: a retry would need as much again."
        return RemoteFailure("WorkerDiedError", "jupyter_cluster._errors", message, [], None)

    def lost(self, cell: RunningCell, exc: BaseException, what: str, why: str | None = None) -> RemoteFailure:
        """A cell whose worker, actor or node went away, said in one line (``why``: what killed it, if known)."""
        log.warning("cell %s: %s", cell.cell_id, exc)
        if is_setup_error(exc):  # it never ran: Ray could not install what it asked for
            if cell.actor:
                self.actor_cells.lost(cell.actor)
            return setup_failure(exc, cell.options.get("runtime_env"))
        if isinstance(exc, ray.exceptions.RayActorError):
            name = cell.actor
            how = self.actor_cells.lost(name)
            message = (
                f"{what} actor `{name}` {how} before it ended, and its namespace with it "
                f"(the next `--actor {name}` cell starts a fresh one)."
            )
            if why:
                message += f" What killed it: {why}"
        elif why and "out of memory" in why:
            message = f"{what} {why} It was not retried: a retry would need as much again."
        else:
            if why is None and isinstance(exc, ray.exceptions.NodeDiedError):
                why = "the node running it died"
            elif why is None and isinstance(exc, ray.exceptions.WorkerCrashedError):
                why = "the worker process running it died (killed from outside it, or it crashed without a word)"
            elif why is None:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            n = retries(cell.options)
            tries = "Ray did not retry it (--retries 0)" if n == 0 else f"Ray retried it {n} time{'s' * (n != 1)}"
            message = f"{what} {why}; {tries}."
        return RemoteFailure("WorkerDiedError", "jupyter_cluster._errors", message, [], None)

    def would_not_stop(self, cell: RunningCell) -> RemoteFailure:
        """The failure of an actor or driver cell that ignored its interrupt."""
        if cell.mode == "actor":
            message = (
                f"the remote work was cancelled ({cell.cancelled}), but it did not stop within {CANCEL_GRACE:g} s: "
                f"actor `{cell.actor}` is busy in code that does not see interrupts (a blocking C call, or "
                "signals blocked). It goes on running there, and later cells of this actor wait behind it; "
                f"`jc.current().kill_actor({cell.actor!r})` stops it (and loses the actor's namespace)."
            )
        else:
            message = (
                f"the remote work was cancelled ({cell.cancelled}), but it did not stop within {CANCEL_GRACE:g} s: "
                "the driver cell is busy in code that does not see interrupts. It goes on running on the head, "
                "and later --driver cells wait behind it; `%cluster down` stops the agent."
            )
        return interrupted(cell.cancelled, message)

    # ---------------------------------------------------------------- cancel
    def cancel(self, cell_id: str, reason: str = "interrupted") -> bool:
        cell = self.running.get(cell_id)
        if cell is None:
            return False
        if not cell.cancelled:
            cell.cancelled = reason
            self.modes[cell.mode].cancel(cell)
        return True

    def abandon(self, cell: RunningCell) -> None:
        """Give up on a cell that did not stop (its ``unless_abandoned`` waits end)."""
        if cell.cell_id in self.running and not cell.abandoned.done():
            cell.abandoned.set_result(None)
            if cell.options.get("ephemeral") and cell.actor:  # nothing in it to keep: stop it all
                self.actor_cells.end_run(cell)

    def close(self) -> None:
        """The agent stops: runs still going stop with it (their actors are detached)."""
        for cell in list(self.running.values()):
            if cell.options.get("ephemeral") and cell.actor:
                self.actor_cells.end_run(cell)
        self.actor_cells.close()

    # --------------------------------------------------------------- objects
    async def submit(self, request: dict[str, Any]) -> str:
        options = request.get("options", {})
        self.cluster.check_feasible(options)
        sources = request.get("sources", ())
        args = await self.resolve_inputs(request["inputs"], keep_pickled=bool(sources))
        label = request.get("label", "jc.submit")
        ok, ref = self.remote(run_function, 2, task_options(options)).remote(label, sources, *args)
        handle_id = f"{request['id']}/result"
        self.table.add(handle_id, ref, status=ok)
        return handle_id

    # ---------------------------------------------------------------- status
    async def status(self) -> dict[str, Any]:
        nodes = self.cluster.nodes(max_age=0)
        available = await self.loop.run_in_executor(None, ray.available_resources)
        busy = {c.actor: c.cell_id for c in self.running.values() if c.mode == "actor"}
        actors = await self.actor_cells.describe(busy)
        return {
            "nodes": [
                {
                    "id": n.get("NodeID"),
                    "address": n.get("NodeManagerAddress"),
                    "resources": n.get("Resources", {}),
                    "alive": n.get("Alive"),
                    "head": "node:__internal_head__" in n.get("Resources", {}),
                }
                for n in nodes
            ],
            "available": available,
            "cells": [
                {
                    "cell_id": c.cell_id,
                    "label": c.spec.label,
                    "mode": c.mode,
                    "elapsed": time.time() - c.started,
                    "done": c.done_items,
                    "total": c.total_items,
                }
                for c in self.running.values()
            ],
            "actors": actors,
            "started": await self.driver_cells.started(),
            "others": await self.driver_cells.others(),
            "objects": len(self.table),
            "ray": ray.__version__,
        }


__all__ = ["CellRequestError", "CellRunner", "Mode", "TaskCells"]
