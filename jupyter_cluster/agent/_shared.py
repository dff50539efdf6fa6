"""Large values in shared memory, between a kernel and an agent on one machine.

Where the kernel and the agent share a machine (the embedded cluster, or an SSH head
on the same host), a large value's bytes need not cross the socket. The kernel keeps
them in *segments*: memfds of its own (``memfd_create``), which it names to the agent
by process id, descriptor number and inode (:class:`SegmentName`). The agent opens a
segment through ``/proc/PID/fd/N`` and maps it, or writes into it. Every segment
belongs to the kernel, so a kernel that dies (``kill -9`` included) takes its segments
with it: nothing is left in ``/dev/shm``. The agent keeps its mapping of a segment for
the next value (:class:`Mappings`), and lets go of it within a second of the kernel
closing the segment, or dying.

- **There**: the kernel writes a value's pickle-5 buffers into a segment
  (:func:`write_buffers`); the request carries a
  :class:`Shared` in place of the bytes, and the agent ``ray.put``\\ s straight from the
  mapping (:meth:`Shared.pickled`): one copy, the one ``ray.put`` makes anyway.
- **Back**: the kernel offers a segment with its ``get``; the agent writes the value's
  buffers into it and answers a :class:`Shared`, and the kernel's value is a view on
  its own mapping of that segment.

Whether the agent can open the kernel's segments is tried at the handshake
(:func:`probe`, :func:`check_probe`): the same machine, and the right to read the
kernel's descriptors. Standard library only: this runs on the head too.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._protocol import Pickled, _size

#: Every segment's memfd name: how a look at ``/proc/*/fd`` or ``/proc/*/maps`` tells ours.
PREFIX = "jupyter_cluster"
#: A value whose out-of-band buffers are smaller than this in all crosses the socket.
SHARED_MIN = 1 << 20
#: How much is copied at a time, the GIL held.
COPY_CHUNK = 1 << 20
#: Each buffer starts at a multiple of this in its segment (what numpy wants of an array).
ALIGN = 64

AVAILABLE = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class SegmentError(OSError):
    """A segment named by the kernel cannot be opened here (gone, or not a segment)."""


class SegmentName(NamedTuple):
    """A kernel's segment, as the agent can find it: ``/proc/{pid}/fd/{fd}``, checked by inode."""

    pid: int
    fd: int
    ino: int
    size: int


def create(size: int) -> int:
    """A new segment of ``size`` bytes (pages are allocated as they are written)."""
    fd = os.memfd_create(PREFIX, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def name_of(fd: int) -> SegmentName:
    info = os.fstat(fd)
    return SegmentName(os.getpid(), fd, info.st_ino, info.st_size)


def open_segment(name: SegmentName, writable: bool = False) -> int:
    """Open the kernel's segment ``name`` (a descriptor of this process's own).

    It must be a memfd of ours with the inode named: a descriptor number the kernel
    has since reused for something else is refused, never opened.
    """
    pid, number, ino, size = name
    path = f"/proc/{int(pid)}/fd/{int(number)}"
    try:
        target = os.readlink(path)
    except OSError as exc:
        raise SegmentError(f"the notebook kernel's shared memory is gone ({path}: {exc.strerror})") from None
    if not target.startswith(f"/memfd:{PREFIX}"):
        raise SegmentError(f"{path} is not the notebook kernel's shared memory (it is {target})")
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SegmentError(f"cannot open the notebook kernel's shared memory {path}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_ino != ino or info.st_size < size:
        os.close(fd)
        raise SegmentError(f"{path} is no longer the segment the notebook kernel named")
    return fd


# ----------------------------------------------------------------- copying


def layout(buffers: Sequence[Any], start: int = 0) -> list[tuple[int, int]]:
    """Where each buffer goes in a segment: ``(offset, nbytes)``, aligned."""
    places = []
    offset = start
    for buffer in buffers:
        nbytes = memoryview(buffer).nbytes
        places.append((offset, nbytes))
        offset = -(-(offset + nbytes) // ALIGN) * ALIGN
    return places


def extent(places: Sequence[tuple[int, int]]) -> int:
    """The bytes of a segment that ``places`` use."""
    return max((offset + n for offset, n in places), default=0)


def write_buffers(target: memoryview, buffers: Sequence[Any], places: Sequence[tuple[int, int]]) -> None:
    """Copy ``buffers`` into ``target`` (a mapping of a segment) at ``places``, a chunk at a
    time: the GIL is let go between chunks, so the link's thread answers meanwhile."""
    for buffer, (offset, nbytes) in zip(buffers, places, strict=True):
        source = memoryview(buffer).cast("B")
        for start in range(0, nbytes, COPY_CHUNK):
            chunk = source[start : start + COPY_CHUNK]
            target[offset + start : offset + start + len(chunk)] = chunk


def map_views(fd: int, places: Sequence[tuple[int, int]], writable: bool = False) -> tuple[mmap.mmap, list[memoryview]]:
    """Map the part of ``fd`` that ``places`` use, its pages faulted in at once
    (``MAP_POPULATE``), and a view of each buffer. The mapping lives while a view does."""
    length = max(extent(places), 1)
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    mapping = mmap.mmap(fd, length, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=prot)
    whole = memoryview(mapping)
    views = [whole[offset : offset + n] for offset, n in places]
    whole.release()
    return mapping, views


@dataclass(eq=False)
class Shared:
    """A pickled value, as :class:`Pickled`, whose large buffers lie in a kernel's segment.

    It pickles as its name, its pickle stream and its layout: a few hundred bytes on the
    socket, whatever the value's size.
    """

    data: bytes
    segment: SegmentName
    places: list[tuple[int, int]]

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(n for _, n in self.places)

    def pickled(self) -> Pickled:
        """The value as a :class:`Pickled` whose buffers are views on a mapping of the
        segment (opened through ``/proc``: on the agent's side, where the mapping is kept
        for the next value: :func:`mapped`). Not on an event loop: a new mapping faults
        in every page."""
        whole = mapped(self.segment, extent(self.places))
        try:
            return Pickled(self.data, [whole[offset : offset + n] for offset, n in self.places])
        finally:
            whole.release()

    def load(self) -> Any:
        return self.pickled().load()

    def __reduce__(self) -> tuple[Any, ...]:
        return Shared, (self.data, tuple(self.segment), list(self.places))

    def __post_init__(self) -> None:
        self.segment = SegmentName(*self.segment)

    def __repr__(self) -> str:
        return f"<Shared {self.nbytes} bytes in {self.segment.pid}/fd/{self.segment.fd}>"


@dataclass
class Needs:
    """The agent's answer to a ``get`` whose value does not fit the segment offered:
    the kernel asks again with one of ``nbytes`` (of buffers)."""

    nbytes: int


def fill(name: SegmentName, blob: Pickled) -> Shared:
    """Write ``blob``'s buffers into the kernel's segment ``name`` (the agent's way back)."""
    places = layout(blob.buffers)
    whole = mapped(name, extent(places))
    try:
        write_buffers(whole, blob.buffers, places)
    finally:
        whole.release()
    return Shared(blob.data, name, places)


# ------------------------------------------------------- the agent's mappings

#: Seconds between two looks at whether the segments the agent keeps mapped are still their kernels'.
SWEEP = 1.0
#: Mappings of the kernels' segments the agent keeps at most.
KEPT = 8


class Mappings:
    """The agent's mappings of the kernels' segments, kept for the next value.

    Mapping a segment of 256 MiB (its page tables made at once) takes 20 ms on each side of
    a round; a kernel reuses its segments (``_segments``), so the agent keeps its mappings
    too. A mapping is used again only while ``/proc/PID/fd/N`` is still the same segment. A
    thread looks every :data:`SWEEP` seconds, and lets go of the mappings of a segment its
    kernel closed, or of a kernel that died: the memory is not held past that.
    """

    def __init__(self, sweep: float = SWEEP, keep: int = KEPT) -> None:
        self.sweep = sweep
        self.keep = keep
        self._lock = threading.Lock()
        self._maps: OrderedDict[SegmentName, mmap.mmap] = OrderedDict()
        self._sweeper: threading.Thread | None = None

    def view(self, name: SegmentName, length: int) -> memoryview:
        """A writable view of the first ``length`` bytes of the kernel's segment ``name``."""
        with self._lock:
            kept = self._maps.get(name)
            if kept is not None and len(kept) >= length and _still(name):
                self._maps.move_to_end(name)
                return memoryview(kept)
        fd = open_segment(name, writable=True)
        try:
            mapping, _ = map_views(fd, [(0, max(length, 1))], writable=True)
        finally:
            os.close(fd)  # the mapping keeps the segment
        with self._lock:
            self._let_go(self._maps.pop(name, None))
            self._maps[name] = mapping
            while len(self._maps) > self.keep:
                self._let_go(self._maps.popitem(last=False)[1])
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, name="jupyter-cluster-segments", daemon=True)
                self._sweeper.start()
            return memoryview(mapping)

    def __len__(self) -> int:
        return len(self._maps)

    def clear(self) -> None:
        with self._lock:
            while self._maps:
                self._let_go(self._maps.popitem()[1])

    def _sweep(self) -> None:
        while True:
            time.sleep(self.sweep)
            with self._lock:
                for name in [n for n in self._maps if not _still(n)]:
                    self._let_go(self._maps.pop(name))
                if not self._maps:
                    self._sweeper = None
                    return

    @staticmethod
    def _let_go(mapping: mmap.mmap | None) -> None:
        if mapping is not None:
            with contextlib.suppress(BufferError):  # a copy still reads it: unmapped when its views go
                mapping.close()


def _still(name: SegmentName) -> bool:
    """Whether ``/proc/PID/fd/N`` is still the segment ``name`` (the kernel lives, and has not closed it)."""
    try:
        return os.stat(f"/proc/{int(name.pid)}/fd/{int(name.fd)}").st_ino == name.ino
    except OSError:
        return False


_mappings = Mappings()


def mapped(name: SegmentName, length: int) -> memoryview:
    """A writable view of the kernel's segment ``name``, on the mapping this process keeps of it."""
    return _mappings.view(name, length)


def buffer_bytes(blob: Pickled) -> int:
    """What ``blob``'s out-of-band buffers take in a segment."""
    return extent(layout(blob.buffers))


def worth_sharing(blob: Pickled) -> bool:
    return _size(b"", blob.buffers) >= SHARED_MIN


# ------------------------------------------------------------------ probing

PROBE_BYTES = 16


def probe() -> tuple[int, dict[str, Any]]:
    """A small segment holding a random word, and what the hello says of it."""
    word = os.urandom(PROBE_BYTES)
    fd = create(PROBE_BYTES)
    os.pwrite(fd, word, 0)
    return fd, {"segment": list(name_of(fd)), "word": word.hex()}


def check_probe(offer: Any, opened: Callable[[SegmentName], int] = open_segment) -> bool:
    """Whether this process can open the segment a hello offers and read its word: the
    same machine, and the right to the kernel's descriptors."""
    try:
        name = SegmentName(*offer["segment"])
        fd = opened(name)
    except (OSError, TypeError, KeyError, ValueError):
        return False
    try:
        return os.pread(fd, PROBE_BYTES, 0).hex() == str(offer.get("word"))
    except OSError:
        return False
    finally:
        os.close(fd)


__all__ = [
    "AVAILABLE",
    "PREFIX",
    "SHARED_MIN",
    "Needs",
    "SegmentError",
    "SegmentName",
    "Shared",
    "check_probe",
    "create",
    "fill",
    "map_views",
    "mapped",
    "name_of",
    "open_segment",
    "probe",
    "write_buffers",
]
