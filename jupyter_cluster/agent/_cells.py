"""The agent's Ray-facing side: cells as the kernel asks for them.

:class:`CellRunner` turns a request into Ray calls (a task, an actor method, a map
of chunk tasks, or code in the agent's own driver namespace on its main thread),
registers each output in the :class:`ObjectTable` the moment the cell is accepted
(so a later cell can depend on it at once), sends each its printed output (see
:mod:`._output`), and stops work on interrupt or timeout. A cell never
fails with a Ray error: a worker that died, an actor that died or work that will
not stop each becomes the cell's own one-line failure. Everything a request
produces goes out through an ``emit`` callback, which the server turns into
sequenced events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import pickle
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._execute import (
    CellOutcome,
    CellOutput,
    CellSpec,
    MapChunk,
    Pickled,
    RemoteFailure,
    failed_outputs,
    fresh_namespace,
    unwrap,
)
from ._interrupt import MainThreadCells, interrupt_process
from ._map import ChunkWaiter, chunk_size, item_failure, join_lists, pack, submit_chunks
from ._objects import CellRequestError, Deferred, ObjectTable
from ._output import CellStreams, OutputPump
from ._remote import (
    CellNamespace,
    interrupt_actor_cell,
    node_ip,
    run_cell_in,
    run_cell_task,
    run_function,
    run_map_chunk,
)
from ._resources import ClusterResources, ray_options, retries, task_options

log = logging.getLogger("jupyter_cluster.agent")

Emit = Callable[..., None]
T = TypeVar("T")

#: Inputs smaller than this travel inline with the task instead of via ray.put.
INLINE_INPUT = 100 * 1024
#: Seconds the agent's loop may wait in place for a result that is nearly there: an
#: await costs a hop through Ray's callback thread, as long again as a quick cell.
FAST_PATH = 0.003
#: Seconds a cancelled cell gets to stop by itself: then a task's worker is killed, and
#: an actor or driver cell that did not stop is reported at once (it cannot be killed alone).
CANCEL_GRACE = 2.0
#: What a run's actor imports ahead of time (see ``CellRunner._start_spare``).
RUN_MODULES = ("ray.train.torch", "ray.tune", "jupyter_cluster.agent._train", "jupyter_cluster.agent._tune")
#: A run (``jc.train_torch``, ``jc.tune``) stops its workers or trials itself when
#: interrupted (Ray Train's abort removes its placement group): it gets this long.
RUN_GRACE = 30.0


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


@dataclass
class ActorRecord:
    handle: Any
    where: Any  # ObjectRef of CellNamespace.where()
    names: list[str] = field(default_factory=list)


@ray.remote(num_cpus=0)
def assemble(*parts: Any) -> list[Any]:
    """The list a ``--map`` output becomes, built on the cluster from its items."""
    return [unwrap(p) for p in parts]


@ray.remote(num_cpus=0)
def assemble_tuple(items: list[Any]) -> tuple[Any, ...]:
    return tuple(items)


def _request_failure(spec: CellSpec, message: str) -> RemoteFailure:
    return RemoteFailure("RequestError", "jupyter_cluster._errors", message, [], None, origin=spec.label)


class CellRunner:
    """Runs cells and keeps the objects and actors of the notebooks attached."""

    def __init__(self, loop: asyncio.AbstractEventLoop, driver: MainThreadCells) -> None:
        self.loop = loop
        self.driver = driver
        self.table = ObjectTable()
        self.cluster = ClusterResources()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.output = OutputPump(loop, self.node_id)
        self.running: dict[str, RunningCell] = {}
        self.inputs: dict[str, tuple[str, Any]] = {}
        self.actors: dict[str, ActorRecord] = {}
        self.killed: set[str] = set()  # actors killed on request: their cells say so
        self.driver_ns = fresh_namespace()
        self.driver_ns["ray"] = ray
        self._remotes: dict[Any, Any] = {}
        #: An actor ready for the next run (``jc.train_torch``, ``jc.tune``), once one was made.
        self._spare: ActorRecord | None = None

    @staticmethod
    async def _output_of(cell: RunningCell, batches: int, timeout: float = 10.0) -> None:
        """Wait until the ``batches`` of output the cell's workers sent have gone out."""
        if cell.streams is not None:
            await cell.streams.wait_for(batches, timeout)

    def _remote(self, fn: Any, num_returns: int, options: dict[str, Any]) -> Any:
        key = (fn, num_returns, repr(sorted(options.items())))
        remote = self._remotes.get(key)
        if remote is None:
            remote = fn.options(num_returns=num_returns, **options)
            self._remotes[key] = remote
        return remote

    # ---------------------------------------------------------------- inputs
    async def resolve_inputs(self, inputs: list[tuple[str, str, Any]], keep_pickled: bool = False) -> list[Any]:
        """Turn the kernel's input list into task arguments (values or ObjectRefs).

        ``keep_pickled``: leave values pickled for the process that runs the cell, which
        unpickles them once the notebook's own modules are installed there.
        """
        args = []
        for name, kind, data in inputs:
            if kind == "handle":
                args.append(await self.table.object_ref(data))
            elif kind == "cached":
                held = self.inputs.get(name)
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
                value = await self.loop.run_in_executor(None, self._load_input, blob, keep_pickled)
                self.inputs[name] = (digest, value)
                args.append(value)
            else:
                raise CellRequestError(f"unknown input kind {kind!r} for `{name}`")
        return args

    async def _inputs(self, cell: RunningCell, request: dict[str, Any]) -> list[Any]:
        """The cell's arguments. A cell cancelled meanwhile (its inputs can wait for a
        cell still running) raises :class:`CancelledBeforeStart`: nothing has started
        that a cancel could stop, so it must not start now."""
        args = await self.resolve_inputs(request["inputs"], keep_pickled=bool(cell.spec.sources))
        if cell.cancelled:
            raise CancelledBeforeStart
        return args

    @staticmethod
    def _load_input(blob: Pickled, keep_pickled: bool) -> Any:
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
        cell.streams = self.output.open(spec.cell_id, emit)
        self.running[spec.cell_id] = cell
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
                if mode == "task":
                    result = await self._run_task(cell, request)
                elif mode == "actor":
                    result = await self._run_actor(cell, request)
                elif mode == "driver":
                    result = await self._run_driver(cell, request)
                elif mode == "map":
                    result = await self._run_map(cell, request)
                else:
                    raise CellRequestError(f"unknown cell mode {mode!r}")
            except CancelledBeforeStart:
                result = {"outcome": CellOutcome(failure=_interrupted(cell.cancelled)), "handles": {}}
            outcome = result.get("outcome")
            failure = outcome.failure if outcome is not None else None
            if cell.cancelled:
                result["cancelled"] = cell.cancelled
            emit("done", result, final=True)
        except CellRequestError as exc:
            failure = _request_failure(spec, str(exc))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if options.get("ephemeral") and cell.actor:
                self._end_run(cell)
            self.running.pop(spec.cell_id, None)
            self.output.close(spec.cell_id)
            unsettled = [h for h in outputs if self.table.is_pending(h)]
            if unsettled:  # they will never have a value: they carry the failure
                marker = failed_outputs(spec, failure or _request_failure(spec, "the cell ended without a result"))[0]
                for handle_id in unsettled:
                    self.table.fail(handle_id, marker)

    @staticmethod
    def _started(cell: RunningCell, request: dict[str, Any], info: dict[str, Any]) -> None:
        # The kernel needs to hear it only when it sent values (it then knows the agent
        # holds them) or shows progress; a trivial cell is spared the extra message.
        if cell.mode == "map" or any(kind in ("value", "parts") for _, kind, _ in request["inputs"]):
            cell.emit("started", info)

    async def _unless_abandoned(self, cell: RunningCell, awaitable: Awaitable[T]) -> T | None:
        """``await awaitable``, or None once the cell is given up on (it would not stop)."""
        waiter: asyncio.Future[Any] = asyncio.ensure_future(awaitable)
        abandoned: asyncio.Future[Any] = cell.abandoned
        await asyncio.wait([waiter, abandoned], return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            result: T = waiter.result()
            return result
        waiter.cancel()
        return None

    async def _finish(self, cell: RunningCell, envelope: Any) -> CellOutcome:
        try:
            try:
                raw = ray.get(envelope, timeout=FAST_PATH)  # a quick cell: its result in place
            except ray.exceptions.GetTimeoutError:
                if cell.mode == "actor":  # an actor cell may ignore its interrupt: don't wait for ever
                    raw = await self._unless_abandoned(cell, envelope)
                    if raw is None:
                        return CellOutcome(failure=self._would_not_stop(cell))
                else:
                    raw = await envelope
            outcome: CellOutcome = pickle.loads(raw)
        except ray.exceptions.RayError as exc:
            stopped = (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)
            if cell.cancelled and isinstance(exc, stopped):
                outcome = CellOutcome(failure=_interrupted(cell.cancelled))
            else:
                outcome = CellOutcome(failure=self._lost(cell, exc, f"{cell.spec.label or 'the cell'} did not finish:"))
        await self._output_of(cell, outcome.chunks_sent, 1.0 if cell.cancelled else 10.0)
        return outcome

    def _lost(self, cell: RunningCell, exc: BaseException, what: str) -> RemoteFailure:
        """A cell whose worker, actor or node went away, said in one line."""
        log.warning("cell %s: %s", cell.cell_id, exc)
        if isinstance(exc, ray.exceptions.RayActorError):
            name = cell.actor
            self.actors.pop(name, None)
            how = "was killed (kill_actor)" if name in self.killed else "died"
            message = (
                f"{what} actor `{name}` {how} before it ended, and its namespace with it "
                f"(the next `--actor {name}` cell starts a fresh one)."
            )
        else:
            if isinstance(exc, ray.exceptions.OutOfMemoryError):
                why = "its node ran out of memory, and Ray killed the worker running it"
            elif isinstance(exc, ray.exceptions.NodeDiedError):
                why = "the node running it died"
            elif isinstance(exc, ray.exceptions.WorkerCrashedError):
                why = "the worker process running it died (it exited, crashed or was killed)"
            else:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            n = retries(cell.options)
            tries = "Ray did not retry it (--retries 0)" if n == 0 else f"Ray retried it {n} time{'s' * (n != 1)}"
            message = f"{what} {why}; {tries}."
        return RemoteFailure("WorkerDiedError", "jupyter_cluster._errors", message, [], None)

    def _spec_bytes(self, spec: CellSpec) -> bytes:
        spec.relay = self.output.name
        return pickle.dumps(spec, protocol=5)

    async def _run_task(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        spec = cell.spec
        self.cluster.check_feasible(cell.options)
        args = await self._inputs(cell, request)
        remote = self._remote(run_cell_task, 1 + len(spec.outputs), task_options(cell.options))
        refs = remote.remote(self._spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs = refs
        handles = self._settle_outputs(spec, refs[1:])
        self._started(cell, request, {"mode": "task"})
        outcome = await self._finish(cell, refs[0])
        return {"outcome": outcome, "handles": handles}

    def _settle_outputs(self, spec: CellSpec, held: list[Any]) -> dict[str, str]:
        handles = {}
        for name, value in zip(spec.outputs, held, strict=True):
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            self.table.settle(handle_id, value)
        return handles

    def actor(self, name: str, options: dict[str, Any]) -> ActorRecord:
        record = self.actors.get(name)
        if record is None:
            self.cluster.check_feasible(options)
            if options.get("ephemeral") and self._spare is not None:
                record, self._spare = self._spare, None  # started and warmed up while the last run ended
            else:
                record = self._new_actor(name, options)
            self.actors[name] = record
            self.killed.discard(name)
        return record

    def _new_actor(self, name: str, options: dict[str, Any]) -> ActorRecord:
        extra: dict[str, Any] = {}
        if options.get("head"):  # where the agent runs: a run's results stay on this node
            extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        if options.get("ephemeral"):  # its placement groups then go when it is killed
            extra["lifetime"] = "detached"
        handle = CellNamespace.options(  # type: ignore[attr-defined]
            name=f"cell-namespace:{name}", get_if_exists=True, **ray_options(options), **extra
        ).remote(name)
        return ActorRecord(handle, handle.where.remote())

    def _start_spare(self, options: dict[str, Any]) -> None:
        """Start the next run's actor now, with Ray Train and Ray Tune imported: a run then
        starts without a process to spawn and seconds of imports (only once a run was made)."""
        if self._spare is None:
            self._spare = self._new_actor(f"run-spare-{time.monotonic_ns()}", options)
            self._spare.handle.warm.remote(RUN_MODULES)

    def kill_actor(self, name: str) -> bool:
        """Kill actor ``name`` (its namespace and whatever it runs); False if there is none."""
        record = self.actors.pop(name, None)
        try:
            handle = record.handle if record is not None else ray.get_actor(f"cell-namespace:{name}")
        except ValueError:
            return False
        self.killed.add(name)
        ray.kill(handle, no_restart=True)
        return True

    async def _run_actor(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        spec = cell.spec
        cell.actor = cell.options["actor"]
        record = self.actor(cell.actor, cell.options)
        cell.where = record.where
        args = await self._inputs(cell, request)
        method = record.handle.run if not spec.outputs else record.handle.run.options(num_returns=1 + len(spec.outputs))
        refs = method.remote(self._spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs = refs
        handles = self._settle_outputs(spec, refs[1:])
        self._started(cell, request, {"mode": "actor", "actor": cell.actor})
        outcome = await self._finish(cell, refs[0])
        if cell.options.get("ephemeral"):  # a run: the events its workers sent come before its end
            await self.output.drain(cell.cell_id)
        return {"outcome": outcome, "handles": handles}

    async def _run_driver(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        spec = cell.spec
        args = await self._inputs(cell, request)

        def sink(index: int, batch: list[tuple[str, Any]]) -> None:
            self.loop.call_soon_threadsafe(cell.emit, "stream", batch)

        def run() -> tuple[CellOutcome, list[Any]]:
            if spec.announce:
                self.loop.call_soon_threadsafe(cell.emit, "running", {"node": node_ip(), "items": 1})
            values = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
            return run_cell_in(spec, self.driver_ns, values, CellOutput(sink))

        self._started(cell, request, {"mode": "driver"})
        cell.job = self.driver.submit(cell.cell_id, run)
        try:
            done = await self._unless_abandoned(cell, asyncio.wrap_future(cell.job))
        except (asyncio.CancelledError, KeyboardInterrupt):  # cancelled before it started
            done = (CellOutcome(failure=_interrupted(cell.cancelled or "interrupted")), [])
        if done is None:
            return {"outcome": CellOutcome(failure=self._would_not_stop(cell)), "handles": {}}
        outcome, values = done
        handles = {}
        for name, value in zip(spec.outputs, values, strict=False):
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            info = outcome.outputs.get(name)
            remote = info is not None and info.kind == "remote"
            # What came back inline is put in the object store only if a later cell asks.
            self.table.settle(handle_id, ray.put(value) if remote else Deferred(value))
        return {"outcome": outcome, "handles": handles}

    async def _run_map(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        """A ``--map`` cell (see :mod:`._map`: nothing here grows with the items but counting them)."""
        spec = cell.spec
        items: list[Any] = await asyncio.to_thread(request["items"].load)
        self.cluster.check_feasible(cell.options)
        args = await self._inputs(cell, request)
        size = chunk_size(len(items), self.cluster.cpus())
        remote = self._remote(run_map_chunk, 1 + len(spec.outputs), task_options(cell.options))
        spec_bytes = self._spec_bytes(spec)
        cell.total_items = len(items)
        submitted = await asyncio.to_thread(
            submit_chunks, remote, spec_bytes, items, size, args, lambda: bool(cell.cancelled)
        )
        cell.refs = [refs[0] for refs in submitted]
        if cell.cancelled:  # while the chunks were being submitted: stop those that were
            self._cancel_map(cell, force=False)
        cell.emit("started", {"mode": "map", "items": len(items), "chunks": len(submitted)})
        chunks: list[MapChunk | None] = [None] * len(submitted)
        failure: list[RemoteFailure] = []

        def on_batch(batch: list[tuple[int, Any]]) -> None:
            for index, result in batch:
                if failure:
                    return
                if isinstance(result, ray.exceptions.RayError):
                    start = index * size
                    if cell.cancelled:
                        failure.append(_interrupted(cell.cancelled))
                    else:
                        failure.append(self._lost(cell, result, _items(spec, start, items[start : start + size])))
                else:
                    chunks[index] = result
                    cell.done_items += result.count
                    if result.failure is not None:
                        failure.append(item_failure(result.failure, result.start + result.failed_at))
            if failure:
                waiter.stop()
            cell.emit("progress", {"done": cell.done_items, "total": cell.total_items})

        waiter = ChunkWaiter(self.loop, cell.refs, on_batch)
        await waiter.ended
        sent = sum(c.chunks_sent for c in chunks if c is not None)
        if failure or cell.cancelled or any(c is None for c in chunks):
            self._cancel_map(cell, force=False)
            await self._output_of(cell, sent, 1.0)
            why = failure[0] if failure else _interrupted(cell.cancelled or "the agent is stopping")
            return {"outcome": CellOutcome(failure=why), "handles": {}}
        await self._output_of(cell, sent)
        done = [c for c in chunks if c is not None]
        handles: dict[str, str] = {}
        for j, name in enumerate(spec.outputs):
            for chunk in done:
                for k, ref in chunk.refs.get(name, {}).items():
                    handle_id = f"{spec.cell_id}/{name}/{chunk.start + k}"
                    chunk.outputs[name].other[k].meta["handle"] = handle_id
                    self.table.add(handle_id, ref)
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            self.table.settle(handle_id, join_lists.remote(*[refs[1 + j] for refs in submitted]))
        return {"map": await asyncio.to_thread(pack, done), "count": len(items), "handles": handles}

    def _cancel_map(self, cell: RunningCell, force: bool) -> None:
        """Cancel a map's chunk tasks, on a thread: there may be very many (``--chunk 1``)."""
        refs = list(cell.refs)

        def cancel() -> None:
            for ref in refs:
                try:
                    ray.cancel(ref, force=force)
                except Exception:  # already finished
                    pass

        if len(refs) <= 64:
            cancel()
        else:
            self.loop.run_in_executor(None, cancel)

    def driver_cell_emit(self) -> Emit | None:
        """The emit of the driver cell started last and still running (any thread may ask)."""
        for cell in reversed(list(self.running.values())):
            if cell.mode == "driver":
                return cell.emit
        return None

    # ---------------------------------------------------------------- cancel
    def cancel(self, cell_id: str, reason: str = "interrupted") -> bool:
        cell = self.running.get(cell_id)
        if cell is None:
            return False
        if cell.cancelled:
            return True
        cell.cancelled = reason
        if cell.mode == "driver":
            if cell.job is not None and not cell.job.cancel():  # it runs: interrupt it
                self.driver.interrupt(cell_id)
            self.loop.call_later(CANCEL_GRACE, self._abandon, cell)
        elif cell.mode == "actor":
            if cell.refs:
                ray.cancel(cell.refs[0], force=False)  # a cell still queued never starts
            cell.interrupting = asyncio.ensure_future(self._interrupt_actor(cell))
            grace = RUN_GRACE if cell.options.get("ephemeral") else CANCEL_GRACE
            self.loop.call_later(grace, self._abandon, cell)
        elif cell.mode == "map":
            self._cancel_map(cell, force=False)
            self.loop.call_later(CANCEL_GRACE, self._force_cancel, cell)
        else:
            for ref in cell.refs[:1]:
                ray.cancel(ref, force=False)
            self.loop.call_later(CANCEL_GRACE, self._force_cancel, cell)
        return True

    async def _interrupt_actor(self, cell: RunningCell) -> None:
        try:
            where = await cell.where
            if where["node_id"] == self.node_id:
                interrupt_process(where["pid"], where["flag"], cell.cell_id)
            else:
                strategy = NodeAffinitySchedulingStrategy(where["node_id"], soft=False)
                await interrupt_actor_cell.options(scheduling_strategy=strategy).remote(
                    where["pid"], where["flag"], cell.cell_id
                )
        except Exception:  # the actor is gone: its cell ends by itself
            log.exception("could not interrupt cell %s in actor %s", cell.cell_id, cell.actor)

    def _abandon(self, cell: RunningCell) -> None:
        if cell.cell_id in self.running and not cell.abandoned.done():
            cell.abandoned.set_result(None)
            if cell.options.get("ephemeral") and cell.actor:  # nothing in it to keep: stop it all
                self._end_run(cell)

    def _end_run(self, cell: RunningCell) -> None:
        """Stop a run's own actor (``jc.train_torch``, ``jc.tune``) and all it started.

        The actor is detached, so the placement groups it made (Tune's trials') go with
        it; the actors it owns (trials, Ray Train's controller and workers) die with it;
        the placement groups its actors made (Ray Train's workers') are removed here.
        """
        self.kill_actor(cell.actor)
        if not self.loop.is_closed():
            self._start_spare(cell.options)
        for group_id in cell.streams.placement_groups if cell.streams is not None else ():
            try:
                from ray.util.placement_group import PlacementGroup, remove_placement_group

                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
            except Exception:  # removed already (the run ended well)
                pass

    def close(self) -> None:
        """The agent stops: runs still going stop with it (their actors are detached)."""
        for cell in list(self.running.values()):
            if cell.options.get("ephemeral") and cell.actor:
                self._end_run(cell)
        if self._spare is not None:
            ray.kill(self._spare.handle, no_restart=True)
            self._spare = None

    def _would_not_stop(self, cell: RunningCell) -> RemoteFailure:
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
        return _interrupted(cell.cancelled, message)

    def _force_cancel(self, cell: RunningCell) -> None:
        if cell.cell_id in self.running and cell.mode == "map":
            self._cancel_map(cell, force=True)
        elif cell.cell_id in self.running:
            for ref in cell.refs[:1]:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already finished
                    pass

    # --------------------------------------------------------------- objects
    async def submit(self, request: dict[str, Any]) -> str:
        options = request.get("options", {})
        self.cluster.check_feasible(options)
        sources = request.get("sources", ())
        args = await self.resolve_inputs(request["inputs"], keep_pickled=bool(sources))
        label = request.get("label", "jc.submit")
        ok, ref = self._remote(run_function, 2, task_options(options)).remote(label, sources, *args)
        handle_id = f"{request['id']}/result"
        self.table.add(handle_id, ref, status=ok)
        return handle_id

    # ---------------------------------------------------------------- status
    async def _started_by_cells(self) -> dict[str, Any] | None:
        from ._owned import started

        try:
            return await asyncio.wait_for(self.loop.run_in_executor(None, started), 10)
        except Exception:
            log.warning("could not list what the cells started", exc_info=True)
            return None

    async def reset_driver(self) -> dict[str, Any]:
        """Stop what the notebook's cells started (Serve, actors, placement groups) and
        empty the driver's namespace; refused while cells run."""
        from ._owned import stop_started

        if self.running:
            labels = ", ".join(c.spec.label or c.cell_id for c in self.running.values())
            return {"refused": f"cells are still running ({labels}): wait for them or cancel them, then reset"}
        return await self.loop.run_in_executor(None, stop_started, self.driver_ns)

    async def status(self) -> dict[str, Any]:
        nodes = self.cluster.nodes(max_age=0)
        available = await self.loop.run_in_executor(None, ray.available_resources)
        busy = {c.actor: c.cell_id for c in self.running.values() if c.mode == "actor"}
        actors = {}
        for name, record in self.actors.items():
            if name in busy:  # it runs one cell at a time: asking it now would wait for that cell
                actors[name] = {"name": name, "names": record.names, "running": busy[name]}
                continue
            try:
                info = await asyncio.wait_for(asyncio.ensure_future(record.handle.describe.remote()), 5)
                record.names = info["names"]
                actors[name] = info
            except Exception as exc:
                actors[name] = {"name": name, "error": str(exc)}
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
            "started": await self._started_by_cells(),
            "objects": len(self.table),
            "ray": ray.__version__,
        }


def _items(spec: CellSpec, first: int, chunk: list[Any]) -> str:
    """How a failure names the items of one chunk of a ``--map``."""
    if len(chunk) == 1:
        shown = repr(chunk[0])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"item {first} of --map ({spec.map_name} = {shown}) did not finish:"
    return f"one of items {first}–{first + len(chunk) - 1} of --map did not finish:"


def _interrupted(reason: str, message: str = "") -> RemoteFailure:
    return RemoteFailure(
        type_name="KeyboardInterrupt",
        module="builtins",
        message=message or f"the remote work was cancelled ({reason})",
        frames=[],
        exception=None,
        interrupted=True,
    )


__all__ = ["CellRequestError", "CellRunner"]
