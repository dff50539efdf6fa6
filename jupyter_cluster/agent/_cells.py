"""The agent's Ray-facing side: cells, objects and actors as the kernel asks for them.

:class:`CellRunner` turns a request into Ray calls (a task, an actor method, a map
of chunk tasks, or code in the agent's own driver namespace), keeps the objects a
notebook holds handles to, pumps printed output from the relay actor to the right
cell, and cancels work on interrupt or timeout. Everything a request produces goes
out through an ``emit`` callback, which the server turns into sequenced events.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

try:
    import cloudpickle
except ImportError:  # a head without it: Ray carries its own copy
    from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._execute import (
    CellOutcome,
    CellOutput,
    CellSpec,
    OutputInfo,
    Pickled,
    RemoteFailure,
    describe,
    fresh_namespace,
    interrupt_thread,
    package_value,
    run_in_namespace,
    unwrap,
)
from ._remote import (
    CellNamespace,
    OutputRelay,
    bind_inputs,
    node_ip,
    run_cell_task,
    run_function,
    run_map_chunk,
)

log = logging.getLogger("jupyter_cluster.agent")

Emit = Callable[..., None]

#: Inputs smaller than this travel inline with the task instead of via ray.put.
INLINE_INPUT = 100 * 1024
#: Seconds the agent's loop may wait in place for a result that is nearly there.
FAST_PATH = 0.003
#: Seconds a cancelled task gets to stop by itself before its worker is killed.
CANCEL_GRACE = 2.0


class CellRequestError(Exception):
    """A request the agent refuses; the message goes to the notebook as it is."""


@dataclass
class RunningCell:
    cell_id: str
    mode: str
    emit: Emit
    refs: list[Any] = field(default_factory=list)
    actor: Any = None
    thread: int | None = None
    cancelled: str = ""
    chunks: int = 0
    early: dict[tuple[int, int], list[tuple[str, Any]]] = field(default_factory=dict)
    following: dict[int, int] = field(default_factory=dict)
    chunk_event: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.time)
    done_items: int = 0
    total_items: int = 1


@ray.remote(num_cpus=0)
def assemble(*parts: Any) -> list[Any]:
    """The list a ``--map`` output becomes, built on the cluster from its items."""
    return [unwrap(p) for p in parts]


@ray.remote(num_cpus=0)
def assemble_tuple(items: list[Any]) -> tuple[Any, ...]:
    return tuple(items)


def _format_resources(resources: dict[str, float]) -> str:
    shown = []
    for key, value in sorted(resources.items()):
        if key.startswith("node:") or key.endswith("_group") or "_group_" in key:
            continue
        if key in ("memory", "object_store_memory"):
            shown.append(f"{key} {value / 2**30:.1f} GiB")
        else:
            shown.append(f"{key} {value:g}")
    return ", ".join(shown)


class CellRunner:
    """Runs cells and keeps the objects and actors of the notebooks attached."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.relay_name = f"jupyter-cluster-relay-{os.getpid()}"
        self.relay = self._start_relay()
        self.running: dict[str, RunningCell] = {}
        self.objects: dict[str, Any] = {}
        self.inputs: dict[str, tuple[str, Any]] = {}
        self.actors: dict[str, Any] = {}
        self.driver_ns = fresh_namespace()
        self.driver_ns["ray"] = ray
        self._driver_pool = ThreadPoolExecutor(1, thread_name_prefix="driver-cell")
        self._remotes: dict[Any, Any] = {}
        self._nodes: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._pump = loop.create_task(self._pump_output())

    # ----------------------------------------------------------------- output
    def _start_relay(self) -> Any:
        here = ray.get_runtime_context().get_node_id()
        return OutputRelay.options(  # type: ignore[attr-defined]
            name=self.relay_name,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote()

    async def _pump_output(self) -> None:
        while True:
            try:
                batches = await self.relay.pull.remote()
            except Exception:  # the relay died: make another, keep going
                log.exception("output relay failed; restarting it")
                self.relay = self._start_relay()
                await asyncio.sleep(0.1)
                continue
            for cell_id, stream, index, batch in batches:
                self._deliver(cell_id, stream, index, batch)

    def _deliver(self, cell_id: str, stream: int, index: int, batch: list[tuple[str, Any]]) -> None:
        cell = self.running.get(cell_id)
        if cell is None:
            return
        cell.early[stream, index] = batch
        following = cell.following.get(stream, 0)
        while (stream, following) in cell.early:  # in the order the cell wrote them
            cell.emit("stream", cell.early.pop((stream, following)))
            following += 1
            cell.chunks += 1
        cell.following[stream] = following
        cell.chunk_event.set()

    async def _await_chunks(self, cell: RunningCell, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while cell.chunks < count:
            cell.chunk_event.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("cell %s: %d output batches never arrived", cell.cell_id, count)
                return
            try:
                await asyncio.wait_for(cell.chunk_event.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------- resources
    def nodes(self, max_age: float = 2.0) -> list[dict[str, Any]]:
        stamp, nodes = self._nodes
        if time.monotonic() - stamp > max_age:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._nodes = (time.monotonic(), nodes)
        return nodes

    def check_feasible(self, request: dict[str, float]) -> None:
        """Refuse at once a request that no node of the cluster can ever hold."""
        wanted = {k: v for k, v in request.items() if v}
        if not wanted:
            return
        nodes = self.nodes()
        for node in nodes:
            have = node.get("Resources", {})
            if all(have.get(k, 0.0) >= v for k, v in wanted.items()):
                return
        asked = ", ".join(f"{k} {v:g}" for k, v in wanted.items())
        if "memory" in wanted:
            asked = asked.replace(f"memory {wanted['memory']:g}", f"memory {wanted['memory'] / 2**30:.1f} GiB")
        have = "; ".join(
            f"node {n.get('NodeManagerAddress')}: {_format_resources(n.get('Resources', {}))}" for n in nodes
        )
        raise CellRequestError(
            f"no node of this cluster can ever provide {asked}; the cluster has {have}. "
            "Ask for less, or attach to a cluster that has it."
        )

    @staticmethod
    def ray_options(options: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if options.get("cpus") is not None:
            out["num_cpus"] = options["cpus"]
        if options.get("gpus") is not None:
            out["num_gpus"] = options["gpus"]
        if options.get("memory") is not None:
            out["memory"] = options["memory"]
        if options.get("resources"):
            out["resources"] = dict(options["resources"])
        return out

    def resource_request(self, options: dict[str, Any], default_cpus: float) -> dict[str, float]:
        opts = self.ray_options(options)
        request = {"CPU": float(opts.get("num_cpus", default_cpus)), "GPU": float(opts.get("num_gpus", 0))}
        if "memory" in opts:
            request["memory"] = float(opts["memory"])
        request.update({k: float(v) for k, v in opts.get("resources", {}).items()})
        return request

    def _remote(self, fn: Any, num_returns: int, options: dict[str, Any]) -> Any:
        key = (fn, num_returns, repr(sorted(options.items())))
        remote = self._remotes.get(key)
        if remote is None:
            remote = fn.options(num_returns=num_returns, **options)
            self._remotes[key] = remote
        return remote

    # ---------------------------------------------------------------- inputs
    async def resolve_inputs(self, inputs: list[tuple[str, str, Any]]) -> list[Any]:
        """Turn the kernel's input list into task arguments (values or ObjectRefs)."""
        args = []
        for name, kind, data in inputs:
            if kind == "handle":
                args.append(await self.object_ref(data))
            elif kind == "cached":
                held = self.inputs.get(name)
                if held is None or held[0] != data:
                    raise CellRequestError(f"input `{name}` is no longer held by the agent; run the cell again")
                args.append(held[1])
            elif kind == "parts":
                container, parts = data
                values = [await self.object_ref(d) if k == "handle" else d for k, d in parts]
                ref = assemble.remote(*values)
                args.append(assemble_tuple.remote(ref) if container == "tuple" else ref)
            elif kind == "value":
                digest, blob = data
                value = await self.loop.run_in_executor(None, self._load_input, blob)
                self.inputs[name] = (digest, value)
                args.append(value)
            else:
                raise CellRequestError(f"unknown input kind {kind!r} for `{name}`")
        return args

    @staticmethod
    def _load_input(blob: Pickled) -> Any:
        try:
            value = blob.load()
        except Exception:  # a type only the workers can import: they unpickle it
            value = blob
        if blob.nbytes > INLINE_INPUT:
            return ray.put(value)
        return value

    async def object_ref(self, handle_id: str) -> Any:
        held = self.objects.get(handle_id)
        if held is None:
            raise CellRequestError(
                f"the cluster no longer holds object {handle_id} (it was released, or the "
                "agent restarted); run the cell that made it again"
            )
        if isinstance(held, asyncio.Future):
            held = await held
        return held

    # ----------------------------------------------------------------- cells
    async def run_cell(self, request: dict[str, Any], emit: Emit) -> None:
        spec: CellSpec = request["spec"]
        mode: str = request["mode"]
        options: dict[str, Any] = request.get("options", {})
        cell = RunningCell(spec.cell_id, mode, emit)
        if spec.cell_id in self.running:
            raise CellRequestError(f"cell {spec.cell_id} is already running")
        self.running[spec.cell_id] = cell
        timer = None
        if options.get("timeout"):
            timer = self.loop.call_later(
                options["timeout"], self.cancel, spec.cell_id, f"--timeout {options['timeout']:g} s"
            )
        try:
            if mode == "task":
                result = await self._run_task(cell, spec, request, options)
            elif mode == "actor":
                result = await self._run_actor(cell, spec, request, options)
            elif mode == "driver":
                result = await self._run_driver(cell, spec, request)
            elif mode == "map":
                result = await self._run_map(cell, spec, request, options)
            else:
                raise CellRequestError(f"unknown cell mode {mode!r}")
            if cell.cancelled:
                result["cancelled"] = cell.cancelled
            emit("done", result, final=True)
        finally:
            if timer is not None:
                timer.cancel()
            self.running.pop(spec.cell_id, None)

    @staticmethod
    def _started(cell: RunningCell, request: dict[str, Any], info: dict[str, Any]) -> None:
        # The kernel needs to hear it only when it sent values (it then knows the agent
        # holds them) or shows progress; a trivial cell is spared the extra message.
        if cell.mode == "map" or any(kind in ("value", "parts") for _, kind, _ in request["inputs"]):
            cell.emit("started", info)

    def _register_outputs(self, spec: CellSpec, refs: list[Any]) -> dict[str, str]:
        handles = {}
        for name, ref in zip(spec.outputs, refs, strict=True):
            handle_id = f"{spec.cell_id}/{name}"
            self.objects[handle_id] = ref
            handles[name] = handle_id
        return handles

    async def _result(self, ref: Any) -> Any:
        """The value of ``ref``: a quick cell's result is waited for right here (an
        await costs a hop through Ray's callback thread, as long again as the call),
        a slower one asynchronously."""
        try:
            return ray.get(ref, timeout=FAST_PATH)
        except ray.exceptions.GetTimeoutError:
            return await ref

    async def _finish(self, cell: RunningCell, envelope: Any) -> CellOutcome:
        try:
            outcome: CellOutcome = pickle.loads(await self._result(envelope))
        except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError) as exc:
            if not cell.cancelled:
                raise CellRequestError(f"the cell's worker died: {exc}") from exc
            outcome = CellOutcome(failure=_interrupted(cell.cancelled))
        except ray.exceptions.RayActorError as exc:
            raise CellRequestError(f"the actor running the cell died: {exc}") from exc
        await self._await_chunks(cell, outcome.chunks_sent, 1.0 if cell.cancelled else 10.0)
        return outcome

    async def _run_task(
        self, cell: RunningCell, spec: CellSpec, request: dict[str, Any], options: dict[str, Any]
    ) -> dict[str, Any]:
        ray_opts = self.ray_options(options)
        self.check_feasible(self.resource_request(options, 1))
        if options.get("retries") is not None:
            ray_opts["max_retries"] = options["retries"]
            ray_opts["retry_exceptions"] = False
        args = await self.resolve_inputs(request["inputs"])
        remote = self._remote(run_cell_task, 1 + len(spec.outputs), ray_opts)
        refs = remote.remote(self._spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs = refs
        handles = self._register_outputs(spec, refs[1:])
        self._started(cell, request, {"mode": "task"})
        outcome = await self._finish(cell, refs[0])
        return {"outcome": outcome, "handles": handles}

    def _spec_bytes(self, spec: CellSpec) -> bytes:
        spec.relay = self.relay_name
        return pickle.dumps(spec, protocol=5)

    def actor(self, name: str, options: dict[str, Any]) -> Any:
        handle = self.actors.get(name)
        if handle is None:
            ray_opts = self.ray_options(options)
            self.check_feasible(self.resource_request(options, 1 if "num_cpus" not in ray_opts else 0))
            handle = CellNamespace.options(  # type: ignore[attr-defined]
                name=f"cell-namespace:{name}", get_if_exists=True, **ray_opts
            ).remote(name)
            self.actors[name] = handle
        return handle

    async def _run_actor(
        self, cell: RunningCell, spec: CellSpec, request: dict[str, Any], options: dict[str, Any]
    ) -> dict[str, Any]:
        actor = self.actor(options["actor"], options)
        args = await self.resolve_inputs(request["inputs"])
        method = actor.run if not spec.outputs else actor.run.options(num_returns=1 + len(spec.outputs))
        refs = method.remote(self._spec_bytes(spec), *args)
        refs = refs if isinstance(refs, list) else [refs]
        cell.refs, cell.actor = refs, actor
        handles = self._register_outputs(spec, refs[1:])
        self._started(cell, request, {"mode": "actor", "actor": options["actor"]})
        try:
            outcome = await self._finish(cell, refs[0])
        except CellRequestError:
            self.actors.pop(options["actor"], None)
            raise
        return {"outcome": outcome, "handles": handles}

    async def _run_driver(self, cell: RunningCell, spec: CellSpec, request: dict[str, Any]) -> dict[str, Any]:
        args = await self.resolve_inputs(request["inputs"])

        def sink(index: int, batch: list[tuple[str, Any]]) -> None:
            self.loop.call_soon_threadsafe(cell.emit, "stream", batch)

        def run() -> tuple[CellOutcome, list[Any]]:
            cell.thread = threading.get_ident()
            try:
                values = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args]
                bind_inputs(spec, self.driver_ns, tuple(values))
                return run_in_namespace(spec, self.driver_ns, CellOutput(sink), node_ip())
            finally:
                cell.thread = None

        self._started(cell, request, {"mode": "driver"})
        outcome, values = await self.loop.run_in_executor(self._driver_pool, run)
        handles = {}
        for name, value in zip(spec.outputs, values, strict=False):
            if outcome.outputs[name].kind == "remote":
                handle_id = f"{spec.cell_id}/{name}"
                self.objects[handle_id] = ray.put(value)
                handles[name] = handle_id
        return {"outcome": outcome, "handles": handles}

    async def _run_map(
        self, cell: RunningCell, spec: CellSpec, request: dict[str, Any], options: dict[str, Any]
    ) -> dict[str, Any]:
        items: list[Any] = request["items"].load()
        ray_opts = self.ray_options(options)
        self.check_feasible(self.resource_request(options, 1))
        args = await self.resolve_inputs(request["inputs"])
        cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in self.nodes()) or 1
        # Tiny items are batched so that scheduling costs do not dominate; there are
        # still several chunks per CPU so that the cluster stays busy to the end.
        per_chunk = max(1, math.ceil(len(items) / (4 * cpus)), math.ceil(len(items) / 256))
        per_chunk = min(per_chunk, int(options.get("chunk") or per_chunk))
        remote = self._remote(run_map_chunk, 1, ray_opts)
        chunks = [items[i : i + per_chunk] for i in range(0, len(items), per_chunk)]
        spec_bytes = self._spec_bytes(spec)
        refs = [remote.remote(spec_bytes, i, chunk, *args) for i, chunk in enumerate(chunks)]
        cell.refs, cell.total_items = refs, len(items)
        futures = {self._as_future(r): i for i, r in enumerate(refs)}
        futures_pending = set(futures)
        cell.emit("started", {"mode": "map", "items": len(items), "chunks": len(chunks)})
        results: list[list[tuple[CellOutcome, list[Any]]] | None] = [None] * len(refs)
        failure: RemoteFailure | None = None
        chunks_sent = 0
        while futures_pending and failure is None:
            done, futures_pending = await asyncio.wait(futures_pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                try:
                    chunk_result = fut.result()
                except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError):
                    failure = _interrupted(cell.cancelled or "the map was cancelled")
                    break
                results[futures[fut]] = chunk_result
                chunks_sent += chunk_result[-1][0].chunks_sent
                cell.done_items += len(chunk_result)
                bad = next((o.failure for o, _ in chunk_result if o.failure), None)
                if bad is not None:
                    failure = bad
                    failure.message += f"  [in item {futures[fut] * per_chunk + len(chunk_result) - 1} of --map]"
                cell.emit("progress", {"done": cell.done_items, "total": cell.total_items})
        if failure is not None:
            for ref in cell.refs:
                ray.cancel(ref, force=False)
            await self._await_chunks(cell, chunks_sent, 1.0)
            return {"outcome": CellOutcome(failure=failure), "handles": {}}
        await self._await_chunks(cell, chunks_sent)
        outcomes = [o for chunk in results for o, _ in (chunk or [])]
        handles: dict[str, str] = {}
        for j, name in enumerate(spec.outputs):
            parts: list[Any] = []
            for chunk in results:
                for outcome, refs_ in chunk or []:
                    info = outcome.outputs[name]
                    if info.kind == "remote":
                        info.meta["handle"] = handle_id = f"{spec.cell_id}/{name}/{len(parts)}"
                        self.objects[handle_id] = refs_[j]
                        parts.append(refs_[j])
                    else:
                        parts.append(Pickled(info.data) if info.kind == "inline" else None)
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            self.objects[handle_id] = assemble.remote(*parts)
        return {"items": outcomes, "handles": handles}

    @staticmethod
    def _as_future(ref: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(ref)

    # ---------------------------------------------------------------- cancel
    def cancel(self, cell_id: str, reason: str = "interrupted") -> bool:
        cell = self.running.get(cell_id)
        if cell is None:
            return False
        cell.cancelled = reason
        if cell.mode == "driver":
            if cell.thread is not None:
                interrupt_thread(cell.thread)
        elif cell.mode == "actor":
            cell.actor.interrupt.remote(cell_id)
            ray.cancel(cell.refs[0], force=False)
        else:
            for ref in cell.refs if cell.mode == "map" else cell.refs[:1]:
                ray.cancel(ref, force=False)
            self.loop.call_later(CANCEL_GRACE, self._force_cancel, cell)
        return True

    def _force_cancel(self, cell: RunningCell) -> None:
        if cell.cell_id in self.running:
            for ref in cell.refs if cell.mode == "map" else cell.refs[:1]:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # already finished
                    pass

    # --------------------------------------------------------------- objects
    async def put(self, blob: Pickled) -> tuple[str, dict[str, Any]]:
        value = await self.loop.run_in_executor(None, blob.load)
        ref = ray.put(value)
        handle_id = f"put/{ref.hex()}"
        self.objects[handle_id] = ref
        return handle_id, {**describe(value), "nbytes": blob.nbytes, "node": node_ip()}

    async def get(self, handle_id: str) -> Pickled:
        """The object as it travels to the kernel: its large buffers straight from the object store."""
        value = await (await self.object_ref(handle_id))
        if isinstance(value, Pickled):
            return value
        return await self.loop.run_in_executor(None, Pickled.of, value, cloudpickle.dumps)

    async def wait(self, handle_ids: list[str], num_returns: int, timeout: float | None) -> list[str]:
        refs = {await self.object_ref(h): h for h in handle_ids}
        ready, _ = await self.loop.run_in_executor(
            None, lambda: ray.wait(list(refs), num_returns=num_returns, timeout=timeout, fetch_local=False)
        )
        return [refs[r] for r in ready]

    async def submit(self, request: dict[str, Any]) -> str:
        options = request.get("options", {})
        self.check_feasible(self.resource_request(options, 1))
        args = await self.resolve_inputs(request["inputs"])
        fn = args.pop(0)
        ref = self._remote(run_function, 1, self.ray_options(options)).remote(fn, *args)
        handle_id = f"{request['id']}/result"
        self.objects[handle_id] = ref
        return handle_id

    async def describe_object(self, handle_id: str) -> dict[str, Any]:
        value = await (await self.object_ref(handle_id))
        info, _ = package_value(unwrap(value), 0)
        return info.meta

    def release(self, handle_ids: list[str]) -> None:
        for handle_id in handle_ids:
            self.objects.pop(handle_id, None)

    # ---------------------------------------------------------------- status
    async def status(self) -> dict[str, Any]:
        nodes = self.nodes(max_age=0)
        available = await self.loop.run_in_executor(None, ray.available_resources)
        actors = {}
        for name, actor in self.actors.items():
            try:
                actors[name] = await asyncio.wait_for(asyncio.ensure_future(actor.describe.remote()), 5)
            except Exception as exc:
                actors[name] = {"name": name, "error": str(exc)}
        return {
            "nodes": [
                {
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
                    "mode": c.mode,
                    "elapsed": time.time() - c.started,
                    "done": c.done_items,
                    "total": c.total_items,
                }
                for c in self.running.values()
            ],
            "actors": actors,
            "objects": len(self.objects),
            "ray": ray.__version__,
        }


def _interrupted(reason: str) -> RemoteFailure:
    return RemoteFailure(
        type_name="KeyboardInterrupt",
        module="builtins",
        message=f"the remote work was cancelled ({reason})",
        frames=[],
        exception=None,
        interrupted=True,
    )


__all__ = ["CellRequestError", "CellRunner", "OutputInfo"]
