"""A slow link on loopback: a TCP proxy that delivers every chunk ``delay`` seconds late, each way.

``tc netem`` needs a kernel module and privileges a container may not have; this does the same
for one TCP port in userspace. :class:`DelayProxy` listens on 127.0.0.1 (a free port) and
forwards each connection to a loopback target. Every chunk read from one side is stamped with
``now + delay`` and queued for that direction; a writer task delivers the queue in order, each
chunk at its own due time, so chunks in flight overlap as on a real link (a chunk read at ``t``
arrives at ``t + delay`` even while an earlier one is still on its way), rather than one
``sleep(delay)`` per chunk. The round trip is ``2 * delay``. What it does not model: bandwidth
(the proxy reads as fast as loopback delivers) and TCP's own handshake, which the proxy answers
at once (a real link adds one round trip per new TCP connection, the same for every client).

With ``nagle=True`` it also models a target that leaves Nagle's algorithm on, which a proxy
that acknowledges everything at once on loopback would otherwise hide: OpenSSH's sshd sets
``TCP_NODELAY`` on a connection only once it runs a command there (a session's exec), so a
connection used for nothing but port or socket forwarding keeps Nagle on for good. Each new
connection starts with Nagle modelled; :meth:`DelayProxy.nodelay` ends it for the connections
open now (call it once the target is known to have set ``TCP_NODELAY`` on them).

``delay`` may be changed at any time (it applies to chunks read afterwards); :meth:`reset`
aborts every proxied connection (both sides see a reset, as after a network failure) and keeps
listening. The loop runs in a daemon thread and stops on :meth:`close` (or leaving ``with``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
import time
from typing import Any

CHUNK = 1 << 16
#: A TCP segment's payload on an Ethernet path (what Nagle's algorithm compares with).
MSS = 1448
OP_TIMEOUT = 10.0


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close abruptly: linger 0, so the peer sees a reset rather than a clean end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _quickack(sock: Any) -> None:
    """Acknowledge what was read at once (Linux may delay an ACK by 40 ms, which a sender with
    Nagle's algorithm on, as sshd, waits for on loopback; the delay is the proxy's to model)."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


class DelayProxy:
    """``127.0.0.1:port`` -> ``target_host:target_port`` (loopback only), ``delay`` seconds late each way."""

    def __init__(
        self, target_port: int, delay: float = 0.025, target_host: str = "127.0.0.1", *, nagle: bool = False
    ) -> None:
        if not ipaddress.ip_address(socket.gethostbyname(target_host)).is_loopback:
            raise ValueError(f"DelayProxy forwards only to loopback, not {target_host}")
        if delay < 0:
            raise ValueError("delay must not be negative")
        self.host = "127.0.0.1"
        self.port = 0
        self.target = (target_host, target_port)
        #: Seconds each chunk is held, in each direction (read when the chunk is read).
        self.delay = delay
        #: Connections accepted so far.
        self.accepted = 0
        #: Model the target's Nagle algorithm on new connections (until :meth:`nodelay`): a chunk
        #: smaller than an Internet MSS that the target writes while an earlier one is
        #: unacknowledged leaves only when that one's ACK would be back, a round trip after it
        #: left (the receiver assumed to ACK at once: a lower bound of the real wait).
        self.nagle = nagle
        self._nagle: dict[tuple[asyncio.StreamWriter, ...], list[bool]] = {}
        #: Set to a list to record ``(time.monotonic(), "up" | "down", bytes)`` for every chunk
        #: read (up: client to target); None records nothing.
        self.trace: list[tuple[float, str, int]] | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, ...]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="DelayProxy", daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self._stop_loop()
            raise

    @property
    def rtt(self) -> float:
        """The round trip the proxy adds, in seconds."""
        return 2 * self.delay

    def nodelay(self) -> None:
        """The target has set ``TCP_NODELAY`` on the connections open now: stop modelling Nagle there."""

        def clear() -> None:
            for flag in self._nagle.values():
                flag[0] = False

        self._loop.call_soon_threadsafe(clear)

    def reset(self) -> None:
        """Abort every proxied connection (both sides); new connections are still accepted."""
        self._call(self._reset())

    def close(self) -> None:
        """Stop listening, abort what is proxied, stop the thread."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._close())
        finally:
            self._stop_loop()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<DelayProxy {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} +{self.delay * 1e3:g} ms>"

    # -- on the proxy's loop

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(OP_TIMEOUT)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(OP_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _reset(self) -> None:
        for pair in list(self._conns):
            for writer in pair:
                _abort(writer)
        self._conns.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=OP_TIMEOUT)

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._reset()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        pair: tuple[asyncio.StreamWriter, ...] = (client_w,)
        self._conns.add(pair)
        try:
            try:
                up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.target), OP_TIMEOUT)
            except (OSError, asyncio.TimeoutError):
                _abort(client_w)
                return
            self._conns.discard(pair)
            pair = (client_w, up_w)
            self._conns.add(pair)
            nagle = self._nagle[pair] = [self.nagle]
            await asyncio.gather(
                self._pipe(client_r, client_w, up_w, pair, "up", [False]),
                self._pipe(up_r, up_w, client_w, pair, "down", nagle),
            )
        except asyncio.CancelledError:
            pass
        finally:
            self._nagle.pop(pair, None)
            if pair in self._conns:  # ended by the peers, not by reset(): close politely
                self._conns.discard(pair)
                for writer in pair:
                    writer.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        source: asyncio.StreamWriter,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, ...],
        direction: str,
        nagle: list[bool],
    ) -> None:
        """One direction: read as it comes (from ``reader``, ``source``'s stream), deliver each
        chunk (and the end) to ``writer`` ``delay`` after it was read."""
        loop = asyncio.get_running_loop()
        sock = source.get_extra_info("socket")
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:  # the sender's end, delivered late like the rest
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                try:
                    writer.write(data)
                    await writer.drain()
                except (OSError, RuntimeError):  # this side was reset: so is the other
                    for w in pair:
                        _abort(w)
                    return

        sender = asyncio.ensure_future(deliver())
        sent_at = ack_at = float("-inf")  # the target's last transmission, and when its ACK is back
        try:
            while True:
                data = await reader.read(CHUNK)
                now = loop.time()
                _quickack(sock)
                if nagle[0]:
                    if now < sent_at:  # joins data already held back
                        now = sent_at
                    elif now < ack_at and len(data) < MSS:  # a small segment with data unacknowledged
                        now = sent_at = ack_at
                        ack_at = now + 2 * self.delay
                    else:
                        sent_at, ack_at = now, now + 2 * self.delay
                queue.put_nowait((now + self.delay, data))
                if self.trace is not None:
                    self.trace.append((time.monotonic(), direction, len(data)))
                if not data:
                    break
            await sender
        except (OSError, RuntimeError):
            # A reset on either side: pass it on to both, as a broken link would.
            for w in pair:
                _abort(w)
        finally:
            sender.cancel()
