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
import contextlib
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

from . import _prompts as prompts
from ._errors import AgentLostError, ClusterConnectionError, LinkLostError, RequestError, WaitTimeoutError
from ._segments import release as segments_release
from .agent import _shared as shared
from .agent._protocol import (
    PROTOCOL_VERSION,
    Frame,
    FrameWriter,
    dumps,
    loads,
    open_unix_frames,
    read_frame,
    write_frame,
)

log = logging.getLogger("jupyter_cluster")
T = TypeVar("T")

EventCallback = Callable[[str, Any], None]

#: Final answers larger than this (bytes) are read on a thread, not on the link's loop.
DELIVER_ON_THREAD = 1 << 20
#: Seconds the kernel waits before acknowledging events (so acks are batched).
ACK_DELAY = 0.05
#: Seconds of silence after which a link counts as lost (``jc.connect(..., keepalive=)``).
DEFAULT_KEEPALIVE = 15.0
#: Seconds for the agent to answer ``hello``, and for one reconnect attempt in all.
HANDSHAKE_TIMEOUT = 15.0
CONNECT_ATTEMPT_TIMEOUT = 45.0
#: The longest pause between reconnect attempts.
MAX_BACKOFF = 5.0


def _why(exc: BaseException) -> str:
    """A short reason for a failure: asyncssh's own reason where it gives one."""
    reason = getattr(exc, "reason", None)
    text = reason if isinstance(reason, str) and reason else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _abort(writer: Any) -> None:
    """End a stream at once, as a network failure would (an SSH stream aborts its channel)."""
    channel: Any = getattr(writer, "channel", None)  # an SSH stream has no transport
    with contextlib.suppress(Exception):
        if channel is not None:
            channel.abort()
        else:
            writer.transport.abort()


class Transport(Protocol):
    """How bytes reach the agent's socket: a local Unix socket, or one over SSH."""

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...

    def lost_reason(self) -> str | None:
        """Why the agent can never be reached again, or None if it may come back."""
        ...

    def discard(self) -> None:
        """Drop whatever carries the streams (an SSH connection), so the next open starts afresh."""
        ...

    def describe(self) -> str: ...

    def resume_hint(self, session: str) -> str | None:
        """How a user resumes ``session`` later, or None where that cannot be done."""
        ...


class UnixTransport:
    """The agent's socket on this machine (the embedded cluster)."""

    def __init__(self, path: str, exited: Callable[[], str | None] = lambda: None) -> None:
        self.path = path
        self._exited = exited

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_unix_frames(self.path, limit=1 << 20)

    def lost_reason(self) -> str | None:
        return self._exited()

    def discard(self) -> None:
        pass

    def describe(self) -> str:
        return f"unix:{self.path}"

    def resume_hint(self, session: str) -> str | None:
        return None


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


#: Requests at most this big (and without out-of-band buffers) go out behind a reconnect's hello.
PIPELINED_MOST = 1 << 16


def _small(frame: Frame) -> bool:
    return not frame.buffers and len(frame.payload) <= PIPELINED_MOST


@dataclass
class PendingRequest:
    """A request the agent has not finished answering."""

    id: str
    op: str
    frame: Frame
    on_event: EventCallback | None
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    #: The kernel's shared-memory segments its body names (:mod:`._segments`): back to the pool once the agent
    #: says it has taken what they hold (a ``taken`` event, or the answer), closed if the request ends otherwise.
    segments: list[Any] = field(default_factory=list)

    def settle(self, done: bool) -> None:
        segments_release(self.segments, done)


class AgentLink:
    """A session with one agent, kept alive across dropped connections.

    A connection can end in three ways, and each starts the reconnect loop: a reset,
    a clean close (asyncssh raises its own ``DisconnectError`` family then), and
    silence. Silence is caught by a heartbeat: the kernel sends a ``ping`` every
    ``keepalive / 3`` seconds and treats ``keepalive`` seconds with no byte from the
    agent as a dead link (SSH keepalives do the same one layer down). Nothing ends
    the reader quietly: an unexpected error is logged and handled as a drop.

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
    keepalive
        Seconds of silence after which the link counts as lost (0: never).
    """

    def __init__(
        self,
        transport: Transport,
        secret: str,
        session: str | None = None,
        reconnect_for: float = 600.0,
        keepalive: float = DEFAULT_KEEPALIVE,
    ) -> None:
        self.transport = transport
        self.secret = secret
        self.session = session or uuid.uuid4().hex[:12]
        self.reconnect_for = reconnect_for
        self.keepalive = keepalive
        self.welcome: dict[str, Any] = {}
        self.last_seq = 0
        self.pending: dict[str, PendingRequest] = {}
        self.closed = False
        self.lost: str | None = None
        self.lost_error: ClusterConnectionError | None = None
        #: "connecting", "connected", "reconnecting", "detached" or "lost".
        self.state = "connecting"
        #: When the current outage began (``time.time()``), while reconnecting.
        self.down_since: float | None = None
        #: Reconnect attempts in the current outage, and why the last one failed.
        self.attempts = 0
        self.last_error = ""
        #: The last heartbeat's round trip, in seconds.
        self.rtt: float | None = None
        #: Bytes received from the agent, as they were on the wire.
        self.bytes_received = 0
        #: Called with the reason when the link gives up for good (the session may live on).
        self.on_give_up: Callable[[BaseException], None] | None = None
        #: Turns why the agent is gone into what the user reads (what went with it: see ``Cluster``).
        self.explain: Callable[[str], tuple[str, str]] | None = None
        #: Called as ``watcher(what)`` when the ``state`` or the ``rtt`` changed (on any thread).
        self.watchers: list[Callable[[str], None]] = []
        #: Final events of requests this link did not send (an earlier kernel's).
        self.orphans: list[tuple[str, Any]] = []
        #: Tells this link's request ids (and its cells') from those of an earlier kernel
        #: of the same session: the agent runs each id once.
        self.tag = uuid.uuid4().hex[:4]
        self._ids = itertools.count(1)
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Future[None] | None = None
        self._heard_at = time.monotonic()
        self._ack_scheduled = False
        self._probe: tuple[int, dict[str, Any]] | None = None
        self._thread = _LoopThread.get()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self._changed("state")

    def _changed(self, what: str) -> None:
        for watcher in list(self.watchers):
            try:
                watcher(what)
            except Exception:
                log.exception("a watcher of the link failed")

    # ------------------------------------------------------------ connecting
    def connect(self, timeout: float = 60.0) -> dict[str, Any]:
        """Open the session (from the notebook's thread); return the agent's welcome."""
        return prompts.wait(self._thread.run(self._connect()), timeout)

    async def _connect(self) -> dict[str, Any]:
        reader, writer = await self.transport.open()
        hello = {
            "type": "hello",
            "protocol": PROTOCOL_VERSION,
            "secret": self.secret,
            "session": self.session,
            "last_seq": self.last_seq,
            "keepalive": self.keepalive,
            "python": platform.python_version(),
            "pid": os.getpid(),
        }
        offer = self._shared_offer()
        if offer is not None:
            hello["shared"] = offer
        # On a reconnect, the requests waiting for the link go out right behind the hello, not a round trip later
        # after the welcome: small ones, and only to the agent process the session was with (the hello names it,
        # and another agent ignores them; its welcome then fails them here).
        pipelined = [r for r in self.pending.values() if self.welcome and _small(r.frame)]
        if pipelined:
            hello.update(agent_pid=self.welcome.get("pid"), pipelined=[r.id for r in pipelined])
        write_frame(writer, Frame(hello))
        for request in pipelined:
            write_frame(writer, request.frame)
        try:
            await writer.drain()
            answer = await asyncio.wait_for(read_frame(reader), HANDSHAKE_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError) as exc:
            writer.close()
            raise ClusterConnectionError(
                f"the agent at {self.transport.describe()} did not complete the handshake ({_why(exc)})"
            ) from exc
        if answer.type != "welcome":
            writer.close()
            reason = answer.header.get("reason", answer.type)
            raise ClusterConnectionError(f"the agent refused the session: {reason}")
        if self.welcome and answer.header.get("pid") != self.welcome.get("pid"):
            # Another agent process: the old session's work is gone with the old agent.
            self._fail_all(AgentLostError("the agent was restarted; the work in flight is lost"))
            self.last_seq = 0
        self.welcome = answer.header
        self._writer = out = FrameWriter(writer)
        self._heard()
        self._reader_task = asyncio.ensure_future(self._read(reader, writer))
        if self.keepalive > 0:
            self._heartbeat_task = asyncio.ensure_future(self._heartbeat(out))
        sent = {r.id for r in pipelined}
        for request in list(self.pending.values()):
            if request.id not in sent:
                out.write(request.frame)
        self._set_state("connected")
        if self.down_since is not None:  # back; nothing was awaited since the reader was made,
            self._back()  # so the cells hear it before what arrived meanwhile
        return self.welcome

    @property
    def shared(self) -> bool:
        """Whether the agent reads and writes this kernel's shared-memory segments (:mod:`.agent._shared`)."""
        return bool(self.welcome.get("shared"))

    def _shared_offer(self) -> dict[str, Any] | None:
        """What the hello offers for the agent to try: a small segment and the word it holds."""
        if not shared.AVAILABLE or os.environ.get("JUPYTER_CLUSTER_SHARED_MEMORY", "1").strip() in ("0", "no", "off"):
            return None
        if self._probe is None:
            try:
                self._probe = shared.probe()
            except OSError as exc:  # no memfds here (a seccomp filter, say): values cross the socket
                log.info("no shared memory for values: %s", exc)
                return None
        return self._probe[1]

    def _heard(self) -> None:
        self._heard_at = time.monotonic()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await read_frame(reader, self._heard)
                self._on_frame(frame)
        except asyncio.CancelledError:
            return
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            reason = _why(exc)
        except Exception as exc:  # asyncssh's DisconnectError family, or a bug: never end quietly
            if type(exc).__module__.startswith("asyncssh"):
                reason = _why(exc)
            else:
                log.exception("the link's reader failed; treating it as a dropped connection")
                reason = f"an error in the link's reader ({_why(exc)})"
        self._drop(writer)
        if not self.closed and self._reconnecting is None:
            self._reconnecting = asyncio.ensure_future(self._reconnect(reason))

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        """Forget a connection that ended (or that we end)."""
        if self._heartbeat_task is not None and self._writer is not None and self._writer.writer is writer:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None
        if self._writer is not None and self._writer.writer is writer:
            self._writer = None
        with contextlib.suppress(Exception):
            writer.close()

    async def _heartbeat(self, out: FrameWriter) -> None:
        """Ping the agent; a link silent for ``keepalive`` seconds is dropped and reconnected."""
        interval = self.keepalive / 3
        while self._writer is out:
            await asyncio.sleep(interval)
            if self._writer is not out:
                return
            silent = time.monotonic() - self._heard_at
            if silent > self.keepalive:
                log.warning("no word from the agent for %.0f s; treating the link as lost", silent)
                # The carrier (an SSH connection) is presumed dead too: start afresh.
                self.transport.discard()
                _abort(out.writer)
                return
            out.write(Frame({"type": "ping", "t": time.monotonic()}))

    async def _reconnect(self, reason: str) -> None:
        self.attempts = 0
        self.last_error = reason
        log.warning("lost the link to the agent (%s); reconnecting", reason)
        self._down(reason)
        deadline = time.monotonic() + self.reconnect_for
        delay = 0.1
        try:
            while not self.closed:
                gone = self.transport.lost_reason()
                if gone is not None:
                    self._give_up(self._explained(gone))
                    return
                self.attempts += 1
                try:
                    await asyncio.wait_for(self._connect(), CONNECT_ATTEMPT_TIMEOUT)
                except Exception as exc:  # whatever the failure, the next attempt may work
                    self.last_error = _why(exc)
                    if not getattr(exc, "carrier_ok", False):
                        self.transport.discard()  # a half-dead SSH connection must not be reused
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._give_up(self._lost_error())
                        return
                    await asyncio.sleep(min(delay, left))  # the last attempt comes at the deadline
                    delay = min(delay * 2, MAX_BACKOFF)
                else:
                    if self._writer is None:  # the new connection ended at once: down again, go on trying
                        self._down(self.last_error)
                        continue
                    return
        finally:
            self._reconnecting = None

    def _down(self, reason: str) -> None:
        """Say that the link is down (the cells show it in their output)."""
        self._set_state("reconnecting")
        self.down_since = time.time()
        self._notify("link", {"state": "lost", "at": self.down_since, "reason": reason, "target": self.target})

    def _back(self) -> None:
        """Say that the link is back (from :meth:`_connect`, before the reader starts: a cell
        that ended during the outage hears it before its replayed end)."""
        after = time.time() - (self.down_since or time.time())
        log.warning("reconnected to the agent after %.1f s", after)
        self.down_since = None
        self._notify("link", {"state": "reconnected", "after": after, "attempts": self.attempts})

    @property
    def target(self) -> str:
        return self.transport.describe()

    def _lost_error(self) -> LinkLostError:
        since = time.strftime("%H:%M:%S", time.localtime(self.down_since or time.time()))
        hint = self.transport.resume_hint(self.session)
        resume = f" `{hint}` resumes it and binds what finished meanwhile." if hint else ""
        message = (
            f"the link to {self.target} was lost at {since} and did not come back within "
            f"{self.reconnect_for:.0f} s (last attempt: {self.last_error}). Session {self.session} and its work "
            f"live on in the agent; the notebook's variables are intact.{resume}"
        )
        return LinkLostError(message, self.session, hint)

    def _explained(self, gone: str) -> AgentLostError:
        if self.explain is None:
            return AgentLostError(gone)
        try:
            return AgentLostError(*self.explain(gone))
        except Exception:  # the plain reason is still the reason
            log.exception("could not say what went with the agent")
            return AgentLostError(gone)

    def _give_up(self, error: ClusterConnectionError) -> None:
        self.lost = str(error)
        self.lost_error = error
        self.closed = True
        self._set_state("lost")
        self._fail_all(error)
        if self.on_give_up is not None:
            try:
                self.on_give_up(error)
            except Exception:
                log.exception("on_give_up failed")

    def _fail_all(self, error: BaseException) -> None:
        for request in list(self.pending.values()):
            self.pending.pop(request.id, None)
            request.settle(done=False)
            if request.on_event is not None:
                request.on_event("lost", error)
            if not request.future.done():
                request.future.set_exception(error)

    def _notify(self, event: str, data: Any) -> None:
        """Tell every open request about the link (cells show it in their output)."""
        for request in list(self.pending.values()):
            if request.on_event is not None:
                try:
                    request.on_event(event, data)
                except Exception:
                    log.exception("event handler of request %s failed", request.id)

    # --------------------------------------------------------------- events
    def _on_frame(self, frame: Frame) -> None:
        self.bytes_received += frame.wire
        header = frame.header
        if frame.type == "pong":
            self.rtt = time.monotonic() - float(header.get("t", 0.0))
            self._changed("rtt")
            return
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
        if header.get("final") and frame.nbytes > DELIVER_ON_THREAD:
            # A large answer (a million --map items, a big value) is read on a thread: the link's
            # loop keeps reading frames and answering heartbeats meanwhile. It is the request's last.
            self.pending.pop(request.id, None)
            asyncio.get_running_loop().run_in_executor(None, self._deliver, request, frame)
            return
        self._deliver(request, frame)

    def _deliver(self, request: PendingRequest, frame: Frame) -> None:
        """Tell a request of one of its events; the final one settles its future."""
        header = frame.header
        if header.get("final") or header.get("event") == "taken":
            request.settle(done=True)  # the agent has what the request's segments held
            if not header.get("final"):
                return
        try:
            data = loads(frame.payload, frame.buffers) if frame.payload else None
        except Exception as exc:  # a class this kernel cannot load: the request fails, the link goes on
            log.exception("the answer to request %s could not be read", request.id)
            if header.get("final"):
                self.pending.pop(request.id, None)
                request.future.set_exception(RequestError(f"the agent's answer could not be read: {exc}", {}))
            return
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
        self,
        op: str,
        body: dict[str, Any] | None = None,
        on_event: EventCallback | None = None,
        segments: list[Any] | None = None,
    ) -> PendingRequest:
        """Send a request (from any thread); its future resolves with the final event.

        ``segments``: the shared-memory segments the body names; the request takes them
        from the list, and owns them (see :class:`PendingRequest`).
        """
        owned = list(segments or ())
        if segments:
            segments.clear()  # the request's now
        if self.closed:
            segments_release(owned, done=True)  # never sent
            raise self.lost_error or AgentLostError(self.lost or "the session is closed")
        request_id = f"{self.session}-{self.tag}-{next(self._ids)}"
        payload, buffers = dumps(body) if body else (b"", [])
        frame = Frame({"type": "request", "id": request_id, "op": op}, payload, buffers)
        pending = PendingRequest(request_id, op, frame, on_event, segments=owned)
        self.pending[request_id] = pending
        self._thread.loop.call_soon_threadsafe(self._send, pending)
        return pending

    def _send(self, request: PendingRequest) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(request.frame)
        # else: it goes out when the link is back (see _connect)

    def call(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = 60.0,
        segments: list[Any] | None = None,
    ) -> Any:
        """Send a request and wait for its answer."""
        pending = self.request(op, body, segments=segments)
        try:
            return prompts.wait(pending.future, timeout)
        except concurrent.futures.TimeoutError:
            raise WaitTimeoutError(f"the agent did not answer {op!r} within {timeout} s") from None

    def drop_connection(self) -> None:
        """Close the current connection as a network failure would (the link reconnects)."""
        writer = self._writer.writer if self._writer is not None else None
        if writer is not None:
            self._thread.loop.call_soon_threadsafe(_abort, writer)

    def reopen(self, timeout: float = 60.0) -> dict[str, Any]:
        """Resume the session after :meth:`close`: what arrived meanwhile is replayed."""
        self.closed = False
        self.lost = None
        self.lost_error = None
        return self.connect(timeout)

    def close(self) -> None:
        """End the link; the agent keeps the session and its work."""
        self.closed = True
        self._set_state("detached")

        def _close() -> None:
            if self._reader_task is not None:
                self._reader_task.cancel()
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
                self._heartbeat_task = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None

        self._thread.loop.call_soon_threadsafe(_close)
