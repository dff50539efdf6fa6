"""The agent's socket server: handshakes, sessions, and request dispatch.

The agent listens on a Unix socket in a 0700 folder. A kernel opens a connection
with a ``hello`` carrying the per-agent secret, a session name and the last event
sequence number it saw; the agent answers ``welcome`` (its Python and Ray versions)
and replays that session's unacknowledged events. A session outlives its
connections: work goes on and events wait in the outbox while no kernel is attached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import platform
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .. import _shared as shared
from .._protocol import (
    PROTOCOL_VERSION,
    Buffers,
    Frame,
    FrameWriter,
    ProtocolError,
    SessionOutbox,
    dumps,
    loads,
    read_frame,
    serve_unix_frames,
    write_frame,
)

log = logging.getLogger("jupyter_cluster.agent")

HELLO_TIMEOUT = 10.0


@dataclass
class Session:
    """One notebook's conversation with the agent, across reconnects."""

    name: str
    outbox: SessionOutbox = field(default_factory=SessionOutbox)
    writer: FrameWriter | None = None
    requests: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    #: Requests answered, by the sequence number of their final event: once the kernel
    #: has acknowledged that, it cannot send the request again, and the id is forgotten.
    answered: dict[str, int] = field(default_factory=dict)
    detached_since: float = field(default_factory=time.monotonic)
    #: Whether this agent can open the kernel's shared-memory segments (tried at each handshake).
    shared: bool = False

    def send(self, header: dict[str, Any], payload: bytes = b"", buffers: Buffers = ()) -> None:
        frame = self.outbox.append(header, payload, buffers)
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(frame)

    def emitter(self, request_id: str) -> Callable[..., None]:
        def emit(event: str, data: Any = None, final: bool = False) -> None:
            payload, buffers = (b"", []) if data is None else dumps(data)
            self.send({"type": "event", "req": request_id, "event": event, "final": final}, payload, buffers)
            if final:
                self.answered[request_id] = self.outbox.last_seq

        return emit


Handler = Callable[[dict[str, Any], Any, Callable[..., None]], Awaitable[None]]


class AgentServer:
    """Serves sessions on a Unix socket; requests go to ``handlers`` by ``op``."""

    def __init__(self, socket_path: str, secret: str, handlers: dict[str, Handler]) -> None:
        self.socket_path = socket_path
        self.secret = secret
        self.handlers = handlers
        self.sessions: dict[str, Session] = {}
        self.stopped = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        folder = os.path.dirname(self.socket_path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = await serve_unix_frames(self._connection, self.socket_path, limit=1 << 20)
        os.chmod(self.socket_path, 0o600)

    def attached(self) -> int:
        return sum(1 for s in self.sessions.values() if s.writer is not None)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for session in self.sessions.values():
            if session.writer is not None:
                session.writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.stopped.set()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session: Session | None = None
        watchdog: asyncio.Task[None] | None = None
        heard = [time.monotonic()]

        def hear() -> None:
            heard[0] = time.monotonic()

        try:
            hello = await asyncio.wait_for(read_frame(reader), HELLO_TIMEOUT)
            session = self._handshake(hello, writer)
            if session is None:
                return
            out = session.writer
            # Requests sent right behind the hello for another agent process (this one started since): not ours to run.
            void = set(hello.header.get("pipelined") or ()) if hello.header.get("agent_pid") != os.getpid() else set()
            keepalive = float(hello.header.get("keepalive") or 0)
            if keepalive > 0:
                watchdog = asyncio.ensure_future(self._watch(writer, heard, keepalive))
            while True:
                frame = await read_frame(reader, hear)
                if frame.type == "ping" and out is not None:
                    out.write(Frame({"type": "pong", "t": frame.header.get("t")}))
                elif void and frame.type == "request" and frame.header.get("id") in void:
                    void.discard(frame.header.get("id"))
                else:
                    self._on_frame(session, frame)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError, ProtocolError) as exc:
            log.info("connection closed: %r", exc)
        except Exception:
            log.exception("connection failed")
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if session is not None and session.writer is not None and session.writer.writer is writer:
                session.writer = None
                session.detached_since = time.monotonic()
            writer.close()

    @staticmethod
    async def _watch(writer: asyncio.StreamWriter, heard: list[float], keepalive: float) -> None:
        """Close a connection whose kernel has been silent for twice its keepalive: the
        kernel pings every third of it, so the link is dead. The session keeps its
        outbox, and the kernel's next connection gets what this one missed."""
        limit = 2 * keepalive
        while True:
            await asyncio.sleep(keepalive / 2)
            silent = time.monotonic() - heard[0]
            if silent > limit:
                log.warning("no word from the kernel for %.0f s; closing its connection", silent)
                writer.transport.abort()
                return

    def _handshake(self, hello: Frame, writer: asyncio.StreamWriter) -> Session | None:
        header = hello.header
        given = str(header.get("secret", ""))
        if hello.type != "hello" or not hmac.compare_digest(given.encode(), self.secret.encode()):
            write_frame(writer, Frame({"type": "refused", "reason": "wrong session secret"}))
            log.warning("refused a connection without the session secret")
            return None
        name = str(header.get("session") or "default")
        session = self.sessions.setdefault(name, Session(name))
        if session.writer is not None:  # a newer connection of the same session wins
            session.writer.close()
        session.writer = out = FrameWriter(writer)
        # A few bytes read from the kernel's probe segment, if it offers one: the same machine, and its descriptors
        # are ours to open (the agent's own user, in the same process namespace).
        session.shared = "shared" in header and shared.check_probe(header["shared"])
        import ray

        welcome = {
            "type": "welcome",
            "protocol": PROTOCOL_VERSION,
            "session": name,
            "python": platform.python_version(),
            "executable": sys.executable,
            "agent_path": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # jupyter_cluster/agent
            "ray": ray.__version__,
            "pid": os.getpid(),
            "last_seq": session.outbox.last_seq,
            "shared": session.shared,
        }
        out.write(Frame(welcome))
        last_seen = int(header.get("last_seq", 0))
        session.outbox.ack(last_seen)
        for frame in session.outbox.after(last_seen):
            out.write(frame)
        log.info("session %s attached (resuming after %d)", name, last_seen)
        return session

    def _on_frame(self, session: Session, frame: Frame) -> None:
        if frame.type == "ack":
            session.outbox.ack(int(frame.header["seq"]))
            for request_id, seq in list(session.answered.items()):
                if seq <= session.outbox.acked:
                    del session.answered[request_id]
                    session.requests.pop(request_id, None)
        elif frame.type == "request":
            request_id = str(frame.header["id"])
            if request_id in session.requests:
                return  # a request re-sent after a reconnect: it is running or ran
            task = asyncio.ensure_future(self._dispatch(session, frame))
            session.requests[request_id] = task
        else:
            raise ProtocolError(f"unexpected frame type {frame.type!r}")

    async def _dispatch(self, session: Session, frame: Frame) -> None:
        request_id = str(frame.header["id"])
        op = str(frame.header.get("op"))
        emit = session.emitter(request_id)
        handler = self.handlers.get(op)
        try:
            if handler is None:
                raise ValueError(f"unknown request {op!r}")
            body = loads(frame.payload, frame.buffers) if frame.payload else {}
            # The body holds what it needs: the frame lets go of the bytes, so a value, once in the object
            # store, is not held here too while its cell runs.
            frame.payload, frame.buffers = b"", ()
            body["id"] = request_id
            await handler(body, session, emit)
        except Exception as exc:
            from ..cells._objects import CellRequestError

            if isinstance(exc, CellRequestError):
                emit("error", {"message": str(exc), "failure": exc.failure}, final=True)
            else:
                log.exception("request %s (%s) failed", request_id, op)
                detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                emit(
                    "error", {"message": f"the agent failed: {detail}", "traceback": traceback.format_exc()}, final=True
                )
