"""The wire protocol between a notebook kernel and the agent.

A frame is a fixed 12-byte prefix (header length, payload length), a JSON header and
an opaque payload (cloudpickle bytes, or empty). Both ends speak it over an asyncio
stream, whatever carries that stream (a local Unix socket, or one forwarded by SSH).

Every agent-to-kernel event carries a sequence number and stays in the session's
:class:`SessionOutbox` until the kernel acknowledges it, so a kernel that loses its
link reconnects, says the last number it saw, and gets the rest again, exactly once
and in order. Requests carry ids, so a request re-sent after a reconnect is not run
twice. This module imports only the standard library: it runs on the head too.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import struct
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1

_PREFIX = struct.Struct("!IQ")
#: Headers are small JSON objects; anything bigger is a corrupt or hostile stream.
MAX_HEADER = 1 << 20


def dumps(obj: Any) -> bytes:
    """Pickle a payload: the C pickler when it can (most messages are plain data and
    dataclasses), cloudpickle when the payload holds something only it can pickle."""
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        try:
            import cloudpickle
        except ImportError:
            from ray import cloudpickle  # type: ignore[no-redef,unused-ignore]

        return cloudpickle.dumps(obj, protocol=5)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


class ProtocolError(ConnectionError):
    """The peer sent something that is not a frame of this protocol."""


@dataclass
class Frame:
    """One protocol message: a JSON-able ``header`` and an opaque ``payload``."""

    header: dict[str, Any]
    payload: bytes = b""

    @property
    def type(self) -> str:
        return str(self.header.get("type", ""))

    def encode(self) -> bytes:
        head = json.dumps(self.header, separators=(",", ":")).encode()
        return _PREFIX.pack(len(head), len(self.payload)) + head + self.payload


async def read_frame(reader: asyncio.StreamReader) -> Frame:
    """Read one frame; raise :class:`asyncio.IncompleteReadError` at end of stream."""
    prefix = await reader.readexactly(_PREFIX.size)
    head_len, payload_len = _PREFIX.unpack(prefix)
    if head_len > MAX_HEADER:
        raise ProtocolError(f"frame header of {head_len} bytes: not a jupyter_cluster peer")
    head = await reader.readexactly(head_len)
    payload = await reader.readexactly(payload_len) if payload_len else b""
    try:
        header = json.loads(head)
    except ValueError as exc:
        raise ProtocolError("frame header is not JSON: not a jupyter_cluster peer") from exc
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    return Frame(header, payload)


def write_frame(writer: asyncio.StreamWriter, frame: Frame) -> None:
    """Queue ``frame`` on ``writer`` (the caller drains when it wants back-pressure)."""
    head = json.dumps(frame.header, separators=(",", ":")).encode()
    writer.write(_PREFIX.pack(len(head), len(frame.payload)) + head)
    if frame.payload:
        # Large payloads are written as their own buffer: no copy into the prefix.
        writer.write(frame.payload)


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

    def append(self, header: dict[str, Any], payload: bytes = b"") -> Frame:
        self.last_seq += 1
        frame = Frame({**header, "seq": self.last_seq}, payload)
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
        return sum(len(f.payload) for f in self._frames)
