"""The objects a notebook holds handles to, by handle id.

Each entry is one of: a Ray ``ObjectRef``; an ``asyncio.Future`` for an output of a
cell still running that will resolve to one (a later cell, or ``jc.get``, waits on
it); or a :class:`Deferred` value of a driver cell, put in the object store only if
someone asks for it. A failed cell's outputs resolve to a :class:`FailedValue`, so
whatever reads one fails with that cell's error. ``jc.put/get/wait/submit`` are
served here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

try:
    import cloudpickle
except ImportError:  # a head without it: Ray carries its own copy
    from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]
import ray

from .._shared import Needs, SegmentError, SegmentName, Shared, buffer_bytes, fill, worth_sharing
from ._execute import FailedValue, Pickled, RemoteFailure, describe, package_value, unwrap
from ._remote import node_ip

log = logging.getLogger("jupyter_cluster.agent")


class CellRequestError(Exception):
    """A request the agent refuses; the message goes to the notebook as it is.

    ``failure`` is set when the request failed because a cell failed (reading the
    output of a failed cell, say): the notebook then shows that cell's error.
    """

    def __init__(self, message: str, failure: RemoteFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass
class Deferred:
    """A driver cell's output, put in the object store when first asked for."""

    value: Any


class ObjectTable:
    """Handle ids to objects, for every notebook attached to this agent."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        #: For ``jc.submit`` results: a tiny ObjectRef saying whether the call succeeded.
        self.status: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.objects)

    def add(self, handle_id: str, held: Any, status: Any = None) -> None:
        self.objects[handle_id] = held
        if status is not None:
            self.status[handle_id] = status

    def pending(self, handle_id: str) -> asyncio.Future[Any]:
        """An entry for an output not made yet; :meth:`settle` gives it its object."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.objects[handle_id] = future
        return future

    def is_pending(self, handle_id: str) -> bool:
        return isinstance(self.objects.get(handle_id), asyncio.Future)

    def settle(self, handle_id: str, held: Any) -> None:
        """Give a pending entry its object (an ObjectRef or a Deferred value)."""
        future = self.objects.get(handle_id)
        if isinstance(future, asyncio.Future):
            if not future.done():
                future.set_result(held)
            self.objects[handle_id] = held

    def fail(self, handle_id: str, marker: FailedValue) -> None:
        """Settle a pending entry with a cell's failure (anything that reads it fails so)."""
        future = self.objects.get(handle_id)
        if isinstance(future, asyncio.Future) and not future.done():
            self.settle(handle_id, Deferred(marker))

    async def object_ref(self, handle_id: str) -> Any:
        """The ObjectRef for ``handle_id`` (waiting for a cell still running)."""
        held = self.objects.get(handle_id)
        if held is None:
            raise CellRequestError(
                f"the cluster no longer holds object {handle_id} (it was released, or the "
                "agent restarted); run the cell that made it again"
            )
        if isinstance(held, asyncio.Future):
            held = await asyncio.shield(held)
        if isinstance(held, Deferred):
            held = ray.put(held.value)
            if handle_id in self.objects:
                self.objects[handle_id] = held
        return held

    async def _fetch(self, handle_id: str) -> Any:
        """The object behind ``handle_id`` as Ray holds it; a failure to compute it, said in one line."""
        ref = await self.object_ref(handle_id)
        try:
            value = await ref
        except ray.exceptions.RayError as exc:  # the task that computes it did not finish
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if isinstance(exc, ray.exceptions.WorkerCrashedError):
                first = "the worker process computing it died (it exited, crashed or was killed)"
            raise CellRequestError(f"the value of {handle_id} was never made: {first}") from None
        if isinstance(value, FailedValue):
            failure = value.failure
            raise CellRequestError(f"{failure.origin or 'the cell'} failed: {failure.message}", failure)
        return value

    async def value(self, handle_id: str) -> Any:
        return unwrap(await self._fetch(handle_id))

    def release(self, handle_ids: list[str]) -> None:
        for handle_id in handle_ids:
            self.objects.pop(handle_id, None)
            self.status.pop(handle_id, None)

    # ------------------------------------------------ jc.put / get / wait
    async def put(self, blob: Pickled | Shared) -> tuple[str, dict[str, Any]]:
        def store() -> tuple[Any, dict[str, Any]]:
            # A value in the kernel's segment is read from it, and copied into the object store, here: by
            # the time this returns, the mapping is gone, and the kernel may write its next value there.
            value = (blob.pickled() if isinstance(blob, Shared) else blob).load()
            return ray.put(value), describe(value)

        try:
            ref, meta = await asyncio.get_running_loop().run_in_executor(None, store)
        except SegmentError as exc:
            raise CellRequestError(f"cannot read the value given to put(): {exc}") from None
        handle_id = f"put/{ref.hex()}"
        self.objects[handle_id] = ref
        return handle_id, {**meta, "nbytes": blob.nbytes, "node": node_ip()}

    async def get(
        self, handle_id: str, into: SegmentName | None = None, shared: bool = False
    ) -> Pickled | Shared | Needs:
        """The object as it travels to the kernel: its large buffers straight from the object store.

        ``shared``: the kernel shares this machine, and ``into`` is the segment it offers
        (or none, for a value whose size it does not know). Large buffers are written
        there, and a :class:`Shared` names them; a value too big for it is answered
        :class:`Needs`, and the kernel asks again with a segment that fits.
        """
        value = await self._fetch(handle_id)
        loop = asyncio.get_running_loop()
        if isinstance(value, Pickled):
            blob = value
        else:
            blob = await loop.run_in_executor(None, Pickled.of, value, cloudpickle.dumps)
        if not shared or not worth_sharing(blob):
            return blob
        needed = buffer_bytes(blob)
        if into is None or needed > into.size:
            return Needs(needed)
        try:
            return await loop.run_in_executor(None, fill, into, blob)
        except SegmentError as exc:
            log.warning("answering get(%s) over the socket: %s", handle_id, exc)
            return blob

    async def wait(self, handle_ids: list[str], num_returns: int, timeout: float | None) -> list[str]:
        refs = {await self.object_ref(h): h for h in handle_ids}
        ready, _ = await asyncio.get_running_loop().run_in_executor(
            None, lambda: ray.wait(list(refs), num_returns=num_returns, timeout=timeout, fetch_local=False)
        )
        return [refs[r] for r in ready]

    async def wait_progress(
        self, handle_ids: list[str], num_returns: int, timeout: float | None, emit: Any, every: float = 0.25
    ) -> list[str]:
        """:meth:`wait`, telling ``emit`` how many are done and how many of those failed as
        they finish (``progress`` events: ``done``, ``failed``, ``total``)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # A submit's status ref is tiny: waiting on it, and reading it, costs no transfer.
        watched = {}
        for h in handle_ids:
            watched[self.status.get(h) or await self.object_ref(h)] = h
        ready: list[str] = []
        failed = 0
        remaining = list(watched)
        while remaining and len(ready) < num_returns:
            left = every if deadline is None else min(every, deadline - loop.time())
            if left <= 0:
                break
            done, remaining = await loop.run_in_executor(None, _wait_all, remaining, left)
            if not done:
                continue
            for ref in done:
                ready.append(watched[ref])
                failed += await self._failed(watched[ref], ref)
            emit("progress", {"done": len(ready), "failed": failed, "total": len(handle_ids)})
        return ready

    async def _failed(self, handle_id: str, ref: Any) -> int:
        if handle_id not in self.status:
            return 0  # a cell's output: its cell reports its own failure
        try:
            return 0 if await ref else 1
        except ray.exceptions.RayError:
            return 1

    async def describe(self, handle_id: str) -> dict[str, Any]:
        info, _ = package_value(await self.value(handle_id), 0)
        return info.meta


def _wait_all(refs: list[Any], timeout: float) -> tuple[list[Any], list[Any]]:
    """Those of ``refs`` ready within ``timeout`` s, and the rest (nothing fetched)."""
    ready, rest = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
    return list(ready), list(rest)


__all__ = ["CellRequestError", "Deferred", "ObjectTable"]
