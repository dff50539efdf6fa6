"""The kernel's end of the session with the agent.

An :class:`AgentLink` lives on a background asyncio loop (one per kernel, in a
daemon thread), beside the kernel's own event loop, so events land while the
notebook is idle. It says ``hello`` with the last event number it saw, hands each
event to the request that asked for it, acknowledges what it has processed, and
after a dropped connection reconnects with backoff and re-sends the requests still
open (the agent runs each id once). Calls from the notebook's thread go through
thread-safe futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import platform
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ._errors import AgentLostError, ClusterConnectionError, RequestError
from .agent._protocol import PROTOCOL_VERSION, Frame, FrameWriter, dumps, loads, read_frame, write_frame

log = logging.getLogger("jupyter_cluster")
T = TypeVar("T")

EventCallback = Callable[[str, Any], None]

#: Seconds the kernel waits before acknowledging events (so acks are batched).
ACK_DELAY = 0.05


class Transport(Protocol):
    """How bytes reach the agent's socket: a local Unix socket, or one over SSH."""

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...

    def lost_reason(self) -> str | None:
        """Why the agent can never be reached again, or None if it may come back."""
        ...

    def describe(self) -> str: ...


class UnixTransport:
    """The agent's socket on this machine (the embedded cluster)."""

    def __init__(self, path: str, exited: Callable[[], str | None] = lambda: None) -> None:
        self.path = path
        self._exited = exited

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(self.path, limit=1 << 20)

    def lost_reason(self) -> str | None:
        return self._exited()

    def describe(self) -> str:
        return f"unix:{self.path}"


class _LoopThread:
    """One asyncio loop in a daemon thread, shared by the kernel's links."""

    _instance: _LoopThread | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="jupyter-cluster-link", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> _LoopThread:
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


@dataclass
class PendingRequest:
    """A request the agent has not finished answering."""

    id: str
    op: str
    frame: Frame
    on_event: EventCallback | None
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


class AgentLink:
    """A session with one agent, kept alive across dropped connections.

    Parameters
    ----------
    transport
        Opens a fresh byte stream to the agent's socket.
    secret
        The agent's session secret, sent in the handshake.
    session
        The session's name; a later link with the same name resumes it.
    reconnect_for
        Seconds to keep trying after a connection drops before failing open requests.
    """

    def __init__(
        self, transport: Transport, secret: str, session: str | None = None, reconnect_for: float = 600.0
    ) -> None:
        self.transport = transport
        self.secret = secret
        self.session = session or uuid.uuid4().hex[:12]
        self.reconnect_for = reconnect_for
        self.welcome: dict[str, Any] = {}
        self.last_seq = 0
        self.pending: dict[str, PendingRequest] = {}
        self.closed = False
        self.lost: str | None = None
        self.on_disconnect: Callable[[str], None] | None = None
        self.on_reconnect: Callable[[], None] | None = None
        #: Final events of requests this link did not send (an earlier kernel's).
        self.orphans: list[tuple[str, Any]] = []
        self._ids = itertools.count(1)
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Future[None] | None = None
        self._ack_scheduled = False
        self._thread = _LoopThread.get()

    # ------------------------------------------------------------ connecting
    def connect(self, timeout: float = 60.0) -> dict[str, Any]:
        """Open the session (from the notebook's thread); return the agent's welcome."""
        return self._thread.run(self._connect()).result(timeout)

    async def _connect(self) -> dict[str, Any]:
        reader, writer = await self.transport.open()
        hello = {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "secret": self.secret,
            "session": self.session,
            "last_seq": self.last_seq,
            "python": platform.python_version(),
            "pid": os.getpid(),
        }
        write_frame(writer, Frame(hello))
        await writer.drain()
        try:
            answer = await asyncio.wait_for(read_frame(reader), 15)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            writer.close()
            raise ClusterConnectionError(
                f"the agent at {self.transport.describe()} closed the connection during the handshake"
            ) from exc
        if answer.type != "welcome":
            writer.close()
            reason = answer.header.get("reason", answer.type)
            raise ClusterConnectionError(f"the agent refused the session: {reason}")
        if self.welcome and answer.header.get("pid") != self.welcome.get("pid"):
            # Another agent process: the old session's work is gone with the old agent.
            self._fail_all("the agent was restarted; the work in flight is lost")
            self.last_seq = 0
        self.welcome = answer.header
        self._writer = out = FrameWriter(writer)
        self._reader_task = asyncio.ensure_future(self._read(reader, writer))
        for request in list(self.pending.values()):
            out.write(request.frame)
        return self.welcome

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await read_frame(reader)
                self._on_frame(frame)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            return
        writer.close()
        if self._writer is not None and self._writer.writer is writer:
            self._writer = None
        if not self.closed:
            self._reconnecting = asyncio.ensure_future(self._reconnect(reason))

    async def _reconnect(self, reason: str) -> None:
        log.warning("lost the link to the agent (%s); reconnecting", reason)
        if self.on_disconnect is not None:
            self.on_disconnect(reason)
        deadline = time.monotonic() + self.reconnect_for
        delay = 0.1
        while not self.closed:
            gone = self.transport.lost_reason()
            if gone is not None:
                self._give_up(gone)
                return
            try:
                await self._connect()
            except (OSError, ClusterConnectionError, asyncio.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    self._give_up(f"could not reconnect for {self.reconnect_for:.0f} s: {exc}")
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                log.warning("reconnected to the agent")
                if self.on_reconnect is not None:
                    self.on_reconnect()
                return

    def _give_up(self, reason: str) -> None:
        self.lost = reason
        self.closed = True
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        for request in list(self.pending.values()):
            self.pending.pop(request.id, None)
            error = AgentLostError(reason)
            if request.on_event is not None:
                request.on_event("lost", error)
            if not request.future.done():
                request.future.set_exception(error)

    # --------------------------------------------------------------- events
    def _on_frame(self, frame: Frame) -> None:
        header = frame.header
        seq = int(header.get("seq", 0))
        if seq and seq <= self.last_seq:
            return  # already seen before a reconnect
        self.last_seq = max(self.last_seq, seq)
        self._schedule_ack()
        request = self.pending.get(str(header.get("req")))
        if request is None:
            if header.get("final"):
                # The answer to a request of an earlier kernel of this session.
                data = loads(frame.payload, frame.buffers) if frame.payload else None
                self.orphans.append((str(header.get("event")), data))
            return
        data = loads(frame.payload, frame.buffers) if frame.payload else None
        event = str(header.get("event"))
        if request.on_event is not None:
            try:
                request.on_event(event, data)
            except Exception:
                log.exception("event handler of request %s failed", request.id)
        if header.get("final"):
            self.pending.pop(request.id, None)
            if event == "error":
                detail = data if isinstance(data, dict) else {}
                request.future.set_exception(RequestError(detail.get("message", "the agent failed"), detail))
            else:
                request.future.set_result(data)

    def _schedule_ack(self) -> None:
        # Acks only free the agent's outbox: one per burst, a moment later, is plenty
        # and keeps them off the path of a quick cell's round trip.
        if not self._ack_scheduled:
            self._ack_scheduled = True
            asyncio.get_running_loop().call_later(ACK_DELAY, self._send_ack)

    def _send_ack(self) -> None:
        self._ack_scheduled = False
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(Frame({"type": "ack", "seq": self.last_seq}))

    # ------------------------------------------------------------- requests
    def request(
        self, op: str, body: dict[str, Any] | None = None, on_event: EventCallback | None = None
    ) -> PendingRequest:
        """Send a request (from any thread); its future resolves with the final event."""
        if self.closed:
            raise AgentLostError(self.lost or "the session is closed")
        request_id = f"{self.session}-{next(self._ids)}"
        payload, buffers = dumps(body) if body else (b"", [])
        frame = Frame({"type": "request", "id": request_id, "op": op}, payload, buffers)
        pending = PendingRequest(request_id, op, frame, on_event)
        self.pending[request_id] = pending
        self._thread.loop.call_soon_threadsafe(self._send, pending)
        return pending

    def _send(self, request: PendingRequest) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(request.frame)
        # else: it goes out when the link is back (see _connect)

    def call(self, op: str, body: dict[str, Any] | None = None, timeout: float | None = 60.0) -> Any:
        """Send a request and wait for its answer."""
        pending = self.request(op, body)
        try:
            return pending.future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            raise TimeoutError(f"the agent did not answer {op!r} within {timeout} s") from exc

    def drop_connection(self) -> None:
        """Close the current connection as a network failure would (the link reconnects)."""
        writer = self._writer.writer if self._writer is not None else None
        if writer is not None:
            channel: Any = getattr(writer, "channel", None)  # an SSH stream has no transport
            abort = channel.abort if channel is not None else writer.transport.abort
            self._thread.loop.call_soon_threadsafe(abort)

    def reopen(self, timeout: float = 60.0) -> dict[str, Any]:
        """Resume the session after :meth:`close`: what arrived meanwhile is replayed."""
        self.closed = False
        self.lost = None
        return self.connect(timeout)

    def close(self) -> None:
        """End the link; the agent keeps the session and its work."""
        self.closed = True

        def _close() -> None:
            if self._reader_task is not None:
                self._reader_task.cancel()
            if self._writer is not None:
                self._writer.close()

        self._thread.loop.call_soon_threadsafe(_close)
