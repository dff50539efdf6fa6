"""``--map`` cells on the agent: the items cut into chunks, one Ray task a chunk.

Everything here that grows with the number of items runs off the agent's event loop:
taking in the items, submitting the chunks (each pickles its items), waiting for them
and reading their results (``ray.wait``/``ray.get`` on a thread of the map's own, which
hands the loop one batch of finished chunks at a time), and packing the answer. The
loop only counts progress and routes events, so pings, cancels and other notebooks'
cells are answered while a million items go by.

The outputs stay on the cluster as one list per chunk and output; the list a later cell
reads is joined from those (one task, one argument a chunk), never from one Ray argument
per item.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import ray

from ._execute import CellOutcome, CellSpec, MapChunk, Pickled, RemoteFailure
from ._remote import run_map_chunk
from ._resources import task_options
from ._running import CANCEL_GRACE, CellHost, RunningCell, interrupted

log = logging.getLogger("jupyter_cluster.agent")

#: Seconds the waiting thread waits for a chunk before it looks at whether the map was stopped.
WAIT_SLICE = 0.2
#: Seconds after an item failed that the map's other chunks are stopped (see ``MapMode.run``).
STOP_AFTER_FAILURE = 1.0


@ray.remote(num_cpus=0)
def join_lists(*lists: list[Any]) -> list[Any]:
    """Lists joined in order; a value left in the object store (an ObjectRef in a chunk's list) is read."""
    joined = [value for part in lists for value in part]
    at = [i for i, value in enumerate(joined) if isinstance(value, ray.ObjectRef)]
    for i, value in zip(at, ray.get([joined[i] for i in at]) if at else [], strict=True):
        joined[i] = value
    return joined


#: The most chunks a map is cut into: the list a later cell reads is joined from one list per chunk, in one task.
MAX_CHUNKS = 256


def chunk_size(items: int, cpus: float) -> int:
    """Items per chunk: tiny items are batched so that scheduling costs do not dominate, with several
    chunks per CPU so that the cluster stays busy to the end, and at most :data:`MAX_CHUNKS` chunks."""
    return max(1, math.ceil(items / (4 * max(cpus, 1.0))), math.ceil(items / MAX_CHUNKS))


class ChunkWaiter:
    """Waits for a map's chunks on a thread of its own, and hands the loop their results in batches.

    ``on_batch(batch)`` runs on the loop with ``[(index, MapChunk | RayError), ...]``; ``on_end()`` runs
    once every chunk is in, or once :meth:`stop` was called. The chunk results are read (unpickled) on
    this thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        refs: list[Any],
        on_batch: Callable[[list[tuple[int, Any]]], None],
    ) -> None:
        self.loop = loop
        self.refs = refs
        self.on_batch = on_batch
        self.ended: asyncio.Future[None] = loop.create_future()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="map-chunks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _wait(self) -> None:
        index = {ref: i for i, ref in enumerate(self.refs)}
        pending = list(self.refs)
        try:
            while pending and not self._stopped.is_set():
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=WAIT_SLICE, fetch_local=True)
                if not ready:
                    continue
                batch: list[tuple[int, Any]] = []
                for ref in ready:
                    try:
                        batch.append((index[ref], ray.get(ref)))
                    except ray.exceptions.RayError as exc:
                        batch.append((index[ref], exc))
                self.loop.call_soon_threadsafe(self.on_batch, batch)
        except Exception:  # the agent is stopping (Ray shut down under us)
            log.exception("waiting for a --map's chunks failed")
        finally:
            self.loop.call_soon_threadsafe(self._end)

    def _end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


def submit_chunks(
    remote: Any, spec_bytes: bytes, items: list[Any], size: int, args: list[Any], stopped: Callable[[], bool]
) -> list[list[Any]]:
    """Submit the chunks (off the loop: each pickles its items); per chunk, its refs (the
    :class:`MapChunk` first, then one list per output). Stops early once ``stopped()``."""
    submitted = []
    for chunk, start in enumerate(range(0, len(items), size)):
        if stopped():
            break
        refs = remote.remote(spec_bytes, chunk, start, items[start : start + size], *args)
        submitted.append(refs if isinstance(refs, list) else [refs])
    return submitted


def pack(chunks: list[MapChunk]) -> Pickled:
    """The notebook's answer, pickled once (off the loop): the chunks in order, their refs taken out."""
    for chunk in chunks:
        chunk.refs = {}
    return Pickled.of(chunks)


def item_failure(failure: RemoteFailure, index: int) -> RemoteFailure:
    """An item's failure, saying which item it was."""
    failure.message += f"  [in item {index} of --map]"
    return failure


class MapCells:
    """``--map`` cells: the chunks' tasks submitted, waited for and read off the loop."""

    def __init__(self, runner: CellHost) -> None:
        self.runner = runner

    async def run(self, cell: RunningCell, request: dict[str, Any]) -> dict[str, Any]:
        """Nothing here grows with the items but counting them."""
        runner, spec = self.runner, cell.spec
        items: list[Any] = await asyncio.to_thread(request["items"].load)
        runner.cluster.check_feasible(cell.options)
        args = await runner.inputs_of(cell, request)
        size = chunk_size(len(items), runner.cluster.cpus())
        remote = runner.remote(run_map_chunk, 1 + len(spec.outputs), task_options(cell.options))
        spec_bytes = runner.spec_bytes(spec)
        cell.total_items = len(items)
        submitted = await asyncio.to_thread(
            submit_chunks, remote, spec_bytes, items, size, args, lambda: bool(cell.cancelled)
        )
        cell.refs = [refs[0] for refs in submitted]
        for refs in submitted:  # each chunk is the cell's own work (its timeline; at most MAX_CHUNKS)
            runner.note_work(cell, refs)
        if cell.cancelled:  # while the chunks were being submitted: stop those that were
            self.stop(cell, force=False)
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
                        failure.append(interrupted(cell.cancelled))
                    else:
                        failure.append(runner.lost(cell, result, _items(spec, start, items[start : start + size])))
                else:
                    chunks[index] = result
                    cell.done_items += result.count
                    if result.failure is not None:
                        failure.append(item_failure(result.failure, result.start + result.failed_at))
            if failure:
                waiter.stop()
            cell.emit("progress", {"done": cell.done_items, "total": cell.total_items})

        waiter = ChunkWaiter(runner.loop, cell.refs, on_batch)
        await waiter.ended
        sent = sum(c.chunks_sent for c in chunks if c is not None)
        if any(c.spawned for c in chunks if c is not None):
            runner.started_work(cell)
        if failure or cell.cancelled or any(c is None for c in chunks):
            if failure and not cell.cancelled:
                # An item failed and the cell's outcome is decided: the other chunks are stopped a moment later,
                # not now. Chunks end together in a small map, and Ray 2.60 aborts the process that cancels a
                # task whose reply it is taking in at that moment ("Tried to complete task that was not
                # pending"): this agent, seen beside a busy test run. A moment later, those have ended.
                self.runner.loop.call_later(STOP_AFTER_FAILURE, self.stop, cell, False)
            else:
                self.stop(cell, force=False)
            await runner.output_of(cell, sent, 1.0)
            why = failure[0] if failure else interrupted(cell.cancelled or "the agent is stopping")
            return {"outcome": CellOutcome(failure=why), "handles": {}}
        await runner.output_of(cell, sent)
        done = [c for c in chunks if c is not None]
        handles: dict[str, str] = {}
        for j, name in enumerate(spec.outputs):
            for chunk in done:
                for k, ref in chunk.refs.get(name, {}).items():
                    handle_id = f"{spec.cell_id}/{name}/{chunk.start + k}"
                    chunk.outputs[name].other[k].meta["handle"] = handle_id
                    runner.table.add(handle_id, ref)
            handles[name] = handle_id = f"{spec.cell_id}/{name}"
            runner.table.settle(handle_id, join_lists.remote(*[refs[1 + j] for refs in submitted]))
        return {"map": await asyncio.to_thread(pack, done), "count": len(items), "handles": handles}

    def cancel(self, cell: RunningCell) -> None:
        self.stop(cell, force=False)
        self.runner.loop.call_later(CANCEL_GRACE, self.force, cell)

    def force(self, cell: RunningCell) -> None:
        if cell.cell_id in self.runner.running:
            self.stop(cell, force=True)

    def stop(self, cell: RunningCell, force: bool) -> None:
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
            self.runner.loop.run_in_executor(None, cancel)


def _items(spec: CellSpec, first: int, chunk: list[Any]) -> str:
    """How a failure names the items of one chunk of a ``--map``."""
    if len(chunk) == 1:
        shown = repr(chunk[0])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"item {first} of --map ({spec.map_name} = {shown}) did not finish:"
    return f"one of items {first}–{first + len(chunk) - 1} of --map did not finish:"


__all__ = ["ChunkWaiter", "MapCells", "chunk_size", "item_failure", "join_lists", "pack", "submit_chunks"]
