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

from ._execute import MapChunk, Pickled, RemoteFailure

log = logging.getLogger("jupyter_cluster.agent")

#: Seconds the waiting thread waits for a chunk before it looks at whether the map was stopped.
WAIT_SLICE = 0.2


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


__all__ = ["ChunkWaiter", "chunk_size", "item_failure", "join_lists", "pack", "submit_chunks"]
