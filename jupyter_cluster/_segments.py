"""The kernel's shared-memory segments: a small pool, reused while values of a size keep coming.

A large value sent to an agent on the same machine is written into a segment
(:mod:`.agent._shared`); one fetched from it is written by the agent into a segment the
kernel offers, and the notebook's value is a view on the kernel's mapping of it. Fresh
memory is dear the first time it is touched (the page is allocated and zeroed, and on
a virtual machine the host backs it too), so a segment the agent is done with goes
back to the pool, its pages still there, and the next value of about its size is
written into it. A segment nothing has used for :data:`IDLE` seconds is given back to
the system, as is any beyond :data:`KEEP`.

A segment given to the agent comes back to the pool only when the agent has said it is
done with it; a request that ends any other way closes it instead (the agent's own
descriptor, if it still copies, keeps the memory until it is done).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .agent._protocol import Digest, Pickled
from .agent._shared import SegmentName, Shared, create, extent, layout, map_views, name_of, write_buffers

#: Seconds a free segment is kept for the next value.
IDLE = 30.0
#: Free segments kept at most.
KEEP = 3
#: Segments are made in multiples of this.
GRAIN = 2 << 20


class Segment:
    """One memfd of the kernel's, mapped here for as long as it lives."""

    __slots__ = ("__weakref__", "capacity", "fd", "freed_at", "hashing", "ino", "mapping", "view")

    def __init__(self, capacity: int) -> None:
        self.fd = create(capacity)
        self.capacity = capacity
        self.ino = name_of(self.fd).ino
        self.freed_at = 0.0
        #: The hash of what was written into it, while it is still to be taken (:meth:`SegmentPool.stage`).
        self.hashing: Digest | None = None
        try:
            self.mapping, (self.view,) = map_views(self.fd, [(0, capacity)], writable=True)
        except BaseException:
            os.close(self.fd)
            raise

    def name(self) -> SegmentName:
        return SegmentName(os.getpid(), self.fd, self.ino, self.capacity)

    def after_hashing(self, then: Callable[[Segment], None]) -> None:
        """``then(self)`` once the hash of what it holds is taken (at once if there is none to take).
        The agent is done with it by now: the hash is taken in the background from here on."""
        hashing = self.hashing
        if hashing is None or hashing.done():
            then(self)
        else:
            hashing.add_done_callback(lambda _: then(self))
            _idle_thread().submit(hashing.run)

    def close(self) -> None:
        """Unmap and close it (a value still on it keeps its pages until it goes)."""
        if self.fd < 0:
            return
        self.view.release()
        with contextlib.suppress(BufferError):  # a view of the notebook's: the mapping goes with it
            self.mapping.close()
        os.close(self.fd)
        self.fd = -1

    def __repr__(self) -> str:
        return f"<Segment fd {self.fd}, {self.capacity} bytes>"


class SegmentPool:
    """Segments the agent is done with, kept for the next value of about their size."""

    def __init__(self, idle: float = IDLE, keep: int = KEEP) -> None:
        self.idle = idle
        self.keep = keep
        self._free: list[Segment] = []
        #: Segments given back whose hash is still to be taken (they come to :attr:`_free` then).
        self._hashing: set[Segment] = set()
        # Reentrant: a value's end gives its segment back from the garbage collector, which may run while this
        # thread is inside the pool already.
        self._lock = threading.RLock()
        self._trimmer: threading.Timer | None = None
        #: Segments made, and those reused, since the kernel started (for tests and benchmarks).
        self.made = self.reused = 0

    def take(self, nbytes: int) -> Segment:
        """A segment of at least ``nbytes``: the smallest free one that is not much bigger, else a new one.

        A segment that waits for its hash (on a machine too busy to take it in the background)
        is not passed over for a new one: its hash is taken now, here.
        """
        with self._lock:
            free = any(self._fits(s, nbytes) for s in self._free)
            waiting = [(s.capacity, s.hashing) for s in self._hashing if self._fits(s, nbytes) and s.hashing]
        if waiting and not free:
            min(waiting, key=lambda pair: pair[0])[1].result()  # its segment comes to the free list
        with self._lock:
            fits = [s for s in self._free if self._fits(s, nbytes)]
            if fits:
                segment = min(fits, key=lambda s: s.capacity)
                self._free.remove(segment)
                self.reused += 1
                return segment
            self.made += 1
        return Segment(max(GRAIN, -(-nbytes // GRAIN) * GRAIN))

    @staticmethod
    def _fits(segment: Segment, nbytes: int) -> bool:
        return nbytes <= segment.capacity <= 2 * nbytes + GRAIN

    def give(self, segment: Segment) -> None:
        """``segment`` is no one's now: keep it for the next value (or close it, past :attr:`keep`)."""
        if segment.fd < 0:
            return
        if segment.hashing is not None and not segment.hashing.done():
            with self._lock:
                self._hashing.add(segment)
            segment.after_hashing(self.give)
            return
        segment.freed_at = time.monotonic()
        with self._lock:
            self._hashing.discard(segment)
            self._free.append(segment)
            while len(self._free) > self.keep:
                self._free.pop(0).close()  # the one freed longest ago
            if self._trimmer is None:
                self._trimmer = threading.Timer(self.idle, self._trim)
                self._trimmer.daemon = True
                self._trimmer.start()

    def _trim(self) -> None:
        """Close the segments idle for :attr:`idle` seconds; look again while any is left."""
        now = time.monotonic()
        with self._lock:
            idle = [s for s in self._free if now - s.freed_at >= self.idle]
            for segment in idle:  # all closed before any leaves the list: what is not in it is closed
                segment.close()
            self._free = [s for s in self._free if s not in idle]
            self._trimmer = None
            if self._free:
                wait = max(0.1, min(s.freed_at for s in self._free) + self.idle - now)
                self._trimmer = threading.Timer(wait, self._trim)
                self._trimmer.daemon = True
                self._trimmer.start()

    def clear(self) -> None:
        with self._lock:
            for segment in self._free:
                segment.close()
            self._free.clear()

    @property
    def free_bytes(self) -> int:
        return sum(s.capacity for s in self._free)

    # ---------------------------------------------------------------- values
    def stage(self, blob: Pickled, hash_later: bool = False) -> tuple[Shared, Segment, Digest | None]:
        """Write ``blob``'s buffers into a segment: what travels in its place, the segment,
        and, ``hash_later``, the value's content hash still to be taken (:class:`.Digest`).

        For a value that differs from anything sent under its name (:func:`._inputs.sample`),
        nothing needs that hash at once. It is taken from the segment once the agent is done
        with it, in the background (a thread that runs when a core is free), or at once by
        whoever needs it first: a later cell whose value has the same sample, or
        :meth:`take`. The segment waits for it before it is used again.
        """
        places = layout(blob.buffers)
        segment = self.take(max(1, extent(places)))
        try:
            write_buffers(segment.view, blob.buffers, places)
        except BaseException:
            segment.close()
            raise
        segment.hashing = None  # (a reused segment's hash of its last value, taken, is dropped)
        if hash_later:
            segment.hashing = Digest(Pickled(blob.data, [segment.view[offset : offset + n] for offset, n in places]))
        return Shared(blob.data, segment.name(), places), segment, segment.hashing

    def receive(self, shared: Shared, segment: Segment) -> Pickled:
        """The value the agent wrote into ``segment``: views on the kernel's mapping of it,
        which go back to the pool with the last of them (the notebook's value)."""
        if shared.segment.fd != segment.fd or shared.segment.ino != segment.ino:
            raise ValueError(f"the agent answered in {shared.segment}, not in the segment offered ({segment})")
        length = extent(shared.places)
        # An object of its own exports the bytes the value uses; the views the value is built on keep it alive,
        # and its end hands the segment back.
        exporter = (ctypes.c_char * max(length, 1)).from_buffer(segment.mapping)
        weakref.finalize(exporter, self.give, segment)
        whole = memoryview(exporter).cast("B")
        return Pickled(shared.data, [whole[offset : offset + n] for offset, n in shared.places])


_pool_lock = threading.Lock()
_hasher: concurrent.futures.ThreadPoolExecutor | None = None


def _idle_thread() -> concurrent.futures.ThreadPoolExecutor:
    """A thread that runs only on a core nothing else wants (Linux's ``SCHED_IDLE``, else the lowest
    priority): the hashes taken while a value is on its way leave the agent and the workers alone."""
    global _hasher
    with _pool_lock:
        if _hasher is None:
            _hasher = concurrent.futures.ThreadPoolExecutor(1, "hash-idle", initializer=_idle)
        return _hasher


def _idle() -> None:
    me = threading.get_native_id()
    try:
        os.sched_setscheduler(me, os.SCHED_IDLE, os.sched_param(0))  # this thread only, on Linux
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, me, 19)


_pool: SegmentPool | None = None


def pool() -> SegmentPool:
    """The kernel's pool (one for every cluster it talks to)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SegmentPool()
        return _pool


def release(segments: list[Any], done: bool) -> None:
    """A request's segments: back to the pool when the agent is ``done`` with them, else closed."""
    while segments:
        segment = segments.pop()
        if done:
            pool().give(segment)
        else:
            segment.after_hashing(Segment.close)


__all__ = ["Segment", "SegmentPool", "pool", "release"]
