"""The wire protocol between a notebook kernel and the agent.

A frame is a fixed 12-byte prefix (header length, payload length), a JSON header, an
opaque payload (a pickle, or empty) and the pickle's out-of-band buffers, whose sizes
the header lists under ``"oob"``. Large buffers (numpy arrays, bytes) are written from
their own memory and read into their own, never copied into the pickle stream. Both
ends speak it over an asyncio stream, whatever carries that stream (a local Unix
socket, or one forwarded by SSH).

Every agent-to-kernel event carries a sequence number and stays in the session's
:class:`SessionOutbox` until the kernel acknowledges it, so a kernel that loses its
link reconnects, says the last number it saw, and gets the rest again, exactly once
and in order. Requests carry ids, so a request re-sent after a reconnect is not run
twice. This module imports only the standard library: it runs on the head too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import pickle
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1

_PREFIX = struct.Struct("!IQ")
#: Headers are small JSON objects; anything bigger is a corrupt or hostile stream.
MAX_HEADER = 1 << 20


#: Pickle buffers at least this big travel out of band; smaller ones stay in the stream.
OOB_MIN = 1 << 16
#: How much of an out-of-band buffer is read from (written to) the stream at a time.
READ_CHUNK = 1 << 22
WRITE_CHUNK = 1 << 20

Buffers = Sequence[Any]  # objects with the buffer protocol


def _size(data: bytes, buffers: Buffers) -> int:
    """Bytes in a pickle stream and its out-of-band buffers."""
    return len(data) + sum(memoryview(b).nbytes for b in buffers)


def _collector(buffers: list[Any]) -> Callable[[pickle.PickleBuffer], bool]:
    def keep(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OOB_MIN:
            return True  # in band
        buffers.append(buffer)
        return False

    return keep


def _cloudpickle_dumps() -> Callable[..., bytes]:
    try:
        import cloudpickle
    except ImportError:
        from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]
    return cloudpickle.dumps


def dumps(obj: Any) -> tuple[bytes, list[Any]]:
    """Pickle a payload: the pickle stream and its large buffers, kept out of band.

    The C pickler when it can (most messages are plain data and dataclasses),
    cloudpickle when the payload holds something only it can pickle.
    """
    buffers: list[Any] = []
    try:
        return pickle.dumps(obj, protocol=5, buffer_callback=_collector(buffers)), buffers
    except Exception:
        buffers.clear()
        return _cloudpickle_dumps()(obj, protocol=5, buffer_callback=_collector(buffers)), buffers


def loads(data: bytes, buffers: Buffers = ()) -> Any:
    return pickle.loads(data, buffers=buffers)


#: A value is hashed in pieces of about this size (its small buffers grouped, a large one cut), side by side.
HASH_PIECE = 32 << 20
#: A piece is hashed this much at a time, so that another thread can take over between steps.
HASH_STEP = 1 << 20
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _hashing_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="hash")
    return _pool


class _Piece:
    """Consecutive bytes of a value, hashed a step at a time by whichever thread holds its lock."""

    __slots__ = ("at", "digest", "h", "lock", "offset", "views")

    def __init__(self, views: list[memoryview]) -> None:
        self.views = views
        self.h = hashlib.sha256()
        self.at = self.offset = 0
        self.lock = threading.Lock()
        self.digest: bytes | None = None

    def work(self, stop: Callable[[], bool] | None = None) -> None:
        """Hash on to the end, or until ``stop()`` (asked between steps). The caller holds :attr:`lock`."""
        while self.at < len(self.views):
            view = self.views[self.at]
            if self.offset >= len(view):
                self.at, self.offset = self.at + 1, 0
                continue
            if stop is not None and stop():
                return
            self.h.update(view[self.offset : self.offset + HASH_STEP])
            self.offset += HASH_STEP
        self.digest = self.h.digest()


class Digest:
    """:meth:`Pickled.digest`, taken piece by piece: by one thread in the background
    (:meth:`run`), and finished at once by whoever needs it (:meth:`result`).

    A thread that hashes in the background runs only when a core is free. On a busy
    machine it may not run for a long time, and nothing may wait for it: whoever asks for
    the result takes over, picks up the pieces where they were left (a piece is handed
    over between two steps of :data:`HASH_STEP`) and hashes the rest side by side.
    """

    def __init__(self, blob: Pickled) -> None:
        self._data = blob.data
        self._pieces: list[_Piece] = []
        group: list[memoryview] = []
        grouped = 0
        for buffer in blob.buffers:
            view = memoryview(buffer).cast("B")
            if len(view) >= HASH_PIECE:
                self._pieces += [_Piece([view[i : i + HASH_PIECE]]) for i in range(0, len(view), HASH_PIECE)]
                continue
            group.append(view)
            grouped += len(view)
            if grouped >= HASH_PIECE:
                self._pieces.append(_Piece(group))
                group, grouped = [], 0
        if group:
            self._pieces.append(_Piece(group))
        self._hurry = False
        self._lock = threading.Lock()
        self._value: str | None = None
        self._callbacks: list[Callable[[Digest], Any]] = []

    def run(self) -> None:
        """Hash in the background, until done or until :meth:`result` takes over."""
        for piece in self._pieces:
            if self._hurry or not piece.lock.acquire(blocking=False):
                return  # taken over
            try:
                if piece.digest is None:
                    piece.work(lambda: self._hurry)
            finally:
                piece.lock.release()
        self._finish()

    def result(self, side_by_side: bool = True) -> str:
        """The hash: what is left of it taken now, on several threads (``side_by_side``: hashlib
        lets go of the GIL), or on this one alone."""
        if self._value is None:
            self._hurry = True
            left = [piece for piece in self._pieces if piece.digest is None]
            if side_by_side and len(left) > 1:
                list(_hashing_pool().map(_finish_piece, left))
            else:
                for piece in left:
                    _finish_piece(piece)
            self._finish()
        assert self._value is not None
        return self._value

    def done(self) -> bool:
        return self._value is not None

    def add_done_callback(self, then: Callable[[Digest], Any]) -> None:
        """``then(self)`` once the hash is taken (at once if it is)."""
        with self._lock:
            if self._value is None:
                self._callbacks.append(then)
                return
        then(self)

    def _finish(self) -> None:
        with self._lock:
            if self._value is not None or any(piece.digest is None for piece in self._pieces):
                return
            h = hashlib.sha256(self._data)
            for piece in self._pieces:
                h.update(piece.digest or b"")
                for view in piece.views:
                    view.release()  # the bytes may be a segment's, which cannot close while a view is out
                piece.views = []
            self._value = h.hexdigest()[:32]
            callbacks, self._callbacks = self._callbacks, []
        for then in callbacks:
            then(self)


def _finish_piece(piece: _Piece) -> None:
    with piece.lock:
        if piece.digest is None:
            piece.work()


class Pickled:
    """A value kept pickled (protocol 5): its pickle stream and out-of-band buffers.

    Unpickled only where it is used. Pickling a ``Pickled`` hands its buffers on as
    :class:`pickle.PickleBuffer`, so a protocol frame, or Ray's object store, carries
    them without a copy.

    >>> import numpy as np
    >>> blob = Pickled.of(np.arange(1 << 15))  # 256 KiB of data: out of band
    >>> len(blob.buffers), blob.nbytes > 1 << 18
    (1, True)
    >>> bool((loads(*dumps(blob)).load() == np.arange(1 << 15)).all())
    True
    """

    __slots__ = ("buffers", "data")

    def __init__(self, data: bytes, buffers: Buffers = ()) -> None:
        self.data = data
        self.buffers = list(buffers)

    @classmethod
    def of(cls, value: Any, pickler: Callable[..., bytes] | None = None) -> Pickled:
        """Pickle ``value`` (with ``pickler``, cloudpickle's ``dumps`` by default)."""
        buffers: list[Any] = []
        data = (pickler or _cloudpickle_dumps())(value, protocol=5, buffer_callback=_collector(buffers))
        return cls(data, buffers)

    @property
    def nbytes(self) -> int:
        return _size(self.data, self.buffers)

    def load(self) -> Any:
        return pickle.loads(self.data, buffers=self.buffers)

    def digest(self, side_by_side: bool = True) -> str:
        """A content hash of the stream and its buffers (:class:`Digest`): on several threads
        (hashing a gigabyte takes half a second on one core), or on this one alone."""
        return Digest(self).result(side_by_side)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if isinstance(protocol, int) and protocol >= 5:
            return Pickled, (self.data, [pickle.PickleBuffer(b) for b in self.buffers])
        return Pickled, (self.data, [bytes(memoryview(b)) for b in self.buffers])

    def __repr__(self) -> str:
        return f"<Pickled {self.nbytes} bytes, {len(self.buffers)} out-of-band>"


class ProtocolError(ConnectionError):
    """The peer sent something that is not a frame of this protocol."""


@dataclass
class Frame:
    """One protocol message: a JSON-able ``header`` and an opaque ``payload``."""

    header: dict[str, Any]
    payload: bytes = b""
    buffers: Buffers = ()
    #: Bytes it took on the wire, for a frame that was read (prefix and header included).
    wire: int = field(default=0, compare=False)

    @property
    def type(self) -> str:
        return str(self.header.get("type", ""))

    @property
    def nbytes(self) -> int:
        return _size(self.payload, self.buffers)

    def _head(self) -> bytes:
        header = self.header
        if self.buffers:
            header = {**header, "oob": [memoryview(b).nbytes for b in self.buffers]}
        return json.dumps(header, separators=(",", ":")).encode()

    def encode(self) -> bytes:
        head = self._head()
        parts = [_PREFIX.pack(len(head), len(self.payload)), head, self.payload]
        return b"".join(parts + [memoryview(b).cast("B") for b in self.buffers])


async def read_frame(reader: asyncio.StreamReader, heard: Callable[[], None] | None = None) -> Frame:
    """Read one frame; raise :class:`asyncio.IncompleteReadError` at end of stream.

    ``heard`` is called as each part arrives, so a watchdog sees a large frame
    arriving over a slow link as a live link, not a silent one.
    """
    prefix = await reader.readexactly(_PREFIX.size)
    if heard is not None:
        heard()
    head_len, payload_len = _PREFIX.unpack(prefix)
    if head_len > MAX_HEADER:
        raise ProtocolError(f"frame header of {head_len} bytes: not a jupyter_cluster peer")
    head = await reader.readexactly(head_len)
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise ProtocolError("frame header is not JSON: not a jupyter_cluster peer") from exc
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    if payload_len <= READ_CHUNK:
        payload = await reader.readexactly(payload_len) if payload_len else b""
    else:
        payload = bytes(await _read_buffer(reader, payload_len, heard))
    sizes = header.pop("oob", ())
    buffers = tuple([await _read_buffer(reader, int(n), heard) for n in sizes])
    wire = _PREFIX.size + head_len + payload_len + sum(len(b) for b in buffers)
    return Frame(header, payload, buffers, wire)


async def _read_buffer(reader: asyncio.StreamReader, size: int, heard: Callable[[], None] | None = None) -> bytearray:
    """Read ``size`` bytes into a buffer of their own (writable: arrays built on it are too)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    if isinstance(reader, FrameReader):
        await reader.read_into(view, heard)
        return buffer
    got = 0
    while got < size:
        chunk = await reader.read(min(size - got, READ_CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(bytes(view[:got]), size)
        view[got : got + len(chunk)] = chunk
        got += len(chunk)
        if heard is not None:
            heard()
    return buffer


class FrameReader(asyncio.StreamReader):
    """A stream reader that can fill a large buffer straight from the socket.

    An ``asyncio.StreamReader`` copies what arrives into a buffer of its own, and a read
    copies it out again: a 256 MiB array crossed memory four times on arrival, and
    took twice as long as the socket needed. :meth:`read_into` takes what the reader
    already holds, then has the socket receive the rest into the caller's buffer
    (:class:`FrameProtocol`). Everything else reads as from any stream reader.
    """

    _target: memoryview | None = None
    _got = 0
    _filled: asyncio.Future[None] | None = None
    _heard: Callable[[], None] | None = None

    async def read_into(self, view: memoryview, heard: Callable[[], None] | None = None) -> None:
        """Fill ``view``; raise :class:`asyncio.IncompleteReadError` if the stream ends first."""
        # What arrived before this read (a frame's start, or more behind it): the reader's own buffer, a
        # bytearray, and the call that resumes a transport paused for it, as in every asyncio since 3.4.
        held: bytearray = self._buffer  # type: ignore[attr-defined]
        got = min(len(held), len(view))
        if got:
            view[:got] = held[:got]
            del held[:got]
            self._maybe_resume_transport()  # type: ignore[attr-defined]
        if got == len(view):
            return
        failure = self.exception()
        if failure is not None:
            raise failure
        if self.at_eof():  # nothing held now, so: the stream ended
            raise asyncio.IncompleteReadError(bytes(view[:got]), len(view))
        self._target, self._got, self._heard = view, got, heard
        self._filled = asyncio.get_running_loop().create_future()
        try:
            await self._filled
        finally:
            self._target = self._filled = self._heard = None

    def _received(self, nbytes: int) -> None:
        assert self._target is not None and self._filled is not None
        self._got += nbytes
        if self._heard is not None:
            self._heard()
        if self._got == len(self._target):
            # At once: the socket may be read again before the reading coroutine resumes, and what it reads
            # then belongs to the reader's own buffer.
            self._target = None
            if not self._filled.done():
                self._filled.set_result(None)

    def feed_eof(self) -> None:
        super().feed_eof()
        if self._filled is not None and not self._filled.done():
            assert self._target is not None
            self._filled.set_exception(asyncio.IncompleteReadError(bytes(self._target[: self._got]), len(self._target)))

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        if self._filled is not None and not self._filled.done():
            self._filled.set_exception(exc)


class FrameProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """The protocol under a :class:`FrameReader`: the socket receives into the buffer
    being filled, or else into a scratch buffer whose bytes go to the reader as usual."""

    def __init__(self, reader: FrameReader, *args: Any, **kwargs: Any) -> None:
        super().__init__(reader, *args, **kwargs)
        self._reader = reader
        self._scratch = memoryview(bytearray(1 << 18))

    def get_buffer(self, sizehint: int) -> memoryview:
        reader = self._reader
        if reader._target is not None:
            return reader._target[reader._got :]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._reader._target is not None:
            self._reader._received(nbytes)
        else:
            self.data_received(self._scratch[:nbytes])  # type: ignore[arg-type]


async def open_unix_frames(path: str, limit: int) -> tuple[FrameReader, asyncio.StreamWriter]:
    """``asyncio.open_unix_connection``, with a :class:`FrameReader`."""
    loop = asyncio.get_running_loop()
    reader = FrameReader(limit=limit, loop=loop)
    protocol = FrameProtocol(reader, loop=loop)
    transport, _ = await loop.create_unix_connection(lambda: protocol, path)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def serve_unix_frames(connected: Callable[..., Any], path: str, limit: int) -> asyncio.AbstractServer:
    """``asyncio.start_unix_server``, each connection with a :class:`FrameReader`."""
    loop = asyncio.get_running_loop()

    def protocol() -> FrameProtocol:
        return FrameProtocol(FrameReader(limit=limit, loop=loop), connected, loop=loop)

    return await loop.create_unix_server(protocol, path)


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queue ``frame`` on ``writer`` (the caller drains when it wants back-pressure)."""
    _write_start(writer, frame)
    for buffer in frame.buffers:
        writer.write(memoryview(buffer).cast("B"))


#: Payloads up to this size are written in one piece with their header.
SMALL_PAYLOAD = 1 << 16


def _write_start(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Everything of ``frame`` but its out-of-band buffers.

    A small frame goes out in one write: in two, the second part can wait a round trip
    for the first one's acknowledgement where a relay (sshd) leaves Nagle's algorithm on.
    """
    head = frame._head()
    start = _PREFIX.pack(len(head), len(frame.payload)) + head
    if len(frame.payload) <= SMALL_PAYLOAD:
        writer.write(start + frame.payload)
    else:
        # Large payloads are written as their own buffer: no copy into the prefix.
        writer.write(start)
        writer.write(frame.payload)


class FrameWriter:
    """Writes frames to one stream, in order.

    A small frame goes out at once. A frame with large buffers is written a chunk at a
    time as the stream drains, and the frames after it wait their turn: neither the
    transport nor SSH then copies a whole array into a buffer of its own.
    """

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self._queue: deque[Frame] = deque()
        self._pump: asyncio.Task[None] | None = None

    def write(self, frame: Frame) -> None:
        if self._pump is None and len(frame.buffers) == 0:
            write_frame(self.writer, frame)
            return
        self._queue.append(frame)
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._write_queued())

    async def _write_queued(self) -> None:
        try:
            while self._queue and not self.writer.is_closing():
                frame = self._queue.popleft()
                _write_start(self.writer, frame)
                for buffer in frame.buffers:
                    view = memoryview(buffer).cast("B")
                    for start in range(0, len(view), WRITE_CHUNK):
                        self.writer.write(view[start : start + WRITE_CHUNK])
                        await self.writer.drain()
        except (ConnectionError, OSError):
            pass  # the reading side notices and reconnects; the outbox still has the frames
        finally:
            self._pump = None

    def is_closing(self) -> bool:
        return bool(self.writer.is_closing())

    def close(self) -> None:
        self._queue.clear()
        if self._pump is not None:
            self._pump.cancel()
        self.writer.close()


@dataclass
class SessionOutbox:
    """Agent-to-kernel events kept until the kernel acknowledges them.

    >>> box = SessionOutbox()
    >>> box.append({"type": "event"}).header["seq"]
    1
    >>> box.ack(1); len(box)
    0
    """

    _frames: deque[Frame] = field(default_factory=deque)
    last_seq: int = 0
    acked: int = 0

    def append(self, header: dict[str, Any], payload: bytes = b"", buffers: Buffers = ()) -> Frame:
        self.last_seq += 1
        frame = Frame({**header, "seq": self.last_seq}, payload, buffers)
        self._frames.append(frame)
        return frame

    def ack(self, seq: int) -> None:
        """Forget every frame up to and including ``seq``."""
        self.acked = max(self.acked, min(seq, self.last_seq))
        while self._frames and self._frames[0].header["seq"] <= self.acked:
            self._frames.popleft()

    def after(self, seq: int) -> Iterator[Frame]:
        """The frames a kernel that last saw ``seq`` has not seen, in order."""
        return (f for f in self._frames if f.header["seq"] > seq)

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def pending_bytes(self) -> int:
        return sum(f.nbytes for f in self._frames)
