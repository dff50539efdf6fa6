"""Port forwards: a port on the head (Ray Serve, TensorBoard) reachable from this machine.

``Cluster.forward(port)`` (``%cluster forward PORT``) listens on this machine's loopback
and carries each connection to ``127.0.0.1:PORT`` on the head through the cluster's SSH
connection (a ``direct-tcpip`` channel per connection, opened on whichever connection
the link holds now, so a forward outlives a reconnect). The embedded cluster runs on
this machine: its ports are reachable as they are, and a forward relays only when asked
for another local port.

A connection to a head port nothing listens on is closed at once, and the forward
keeps why (``last_error``, shown by ``%cluster status``), rather than leaving the
client waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from ._errors import ClusterConnectionError
from ._link import _LoopThread
from ._links import browser_url

log = logging.getLogger("jupyter_cluster")

#: Opens a byte stream to the head's port: ``(reader, writer)``.
Opener = Callable[[int], Awaitable[tuple[Any, Any]]]


def check_port(port: Any, what: str = "port") -> int:
    """``port`` as an int in 1..65535, or a ValueError saying what was wrong.

    >>> check_port("8000")
    8000
    >>> check_port(0)
    Traceback (most recent call last):
    ValueError: port must be a TCP port number, 1 to 65535 (got 0)
    """
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a TCP port number, 1 to 65535 (got {port!r})") from None
    if (isinstance(port, float) and port != number) or not 1 <= number <= 65535:
        raise ValueError(f"{what} must be a TCP port number, 1 to 65535 (got {port!r})")
    return number


def free_port() -> int:
    """A port nothing listens on on this machine's loopback, now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PortForward:
    """``local_port`` on this machine's loopback, carried to ``remote_port`` on the head.

    ``url`` is what to open here; ``close()`` stops listening (connections in flight end).
    """

    def __init__(self, remote_port: int, local_port: int, where: str, opener: Opener | None) -> None:
        self.remote_port = remote_port
        self.local_port = local_port
        #: What the forward reaches, in words ("head 10.0.0.5").
        self.where = where
        self._opener = opener
        self._server: asyncio.Server | None = None
        self._streams: set[Any] = set()
        #: Connections carried so far.
        self.connections = 0
        #: Why the last connection could not be carried, if it could not.
        self.last_error: str | None = None
        #: Why nothing answered on the head's port when the forward was opened, if nothing did.
        self.note: str | None = None
        self.closed = False

    @property
    def url(self) -> str:
        """The address code in this kernel reaches it at."""
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def link(self) -> str:
        """The address a person's browser reaches it at: through the Jupyter server's proxy where the kernel runs
        under one (see :mod:`.._links`), else :attr:`url`."""
        return browser_url(self.url) or self.url

    @property
    def relays(self) -> bool:
        """Whether connections pass through this process (an SSH forward, or another local port)."""
        return self._opener is not None

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.url
        return f"<PortForward {state} -> {self.where}:{self.remote_port}>"

    def describe(self) -> str:
        """One line for ``%cluster status``."""
        line = f"{self.link} -> {self.where}:{self.remote_port}"
        if self.link != self.url:
            line += f" (from code in this kernel: {self.url})"
        if not self.relays:
            line += " (the same port: the cluster runs on this machine)"
        if self.last_error:
            line += f"; last connection failed: {self.last_error}"
        return line

    # ---------------------------------------------------------------- listening
    async def _listen(self) -> None:
        if self._opener is not None:
            self._server = await asyncio.start_server(self._carry, "127.0.0.1", self.local_port)

    async def _carry(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        assert self._opener is not None
        try:
            remote_r, remote_w = await asyncio.wait_for(self._opener(self.remote_port), 30)
        except Exception as exc:
            self.last_error = _why(exc, self.where, self.remote_port)
            log.warning("port forward %s: %s", self.url, self.last_error)
            client_w.close()
            return
        self.connections += 1
        self.last_error = None
        streams = (client_w, remote_w)
        self._streams.update(streams)
        try:
            await asyncio.gather(_pump(client_r, remote_w), _pump(remote_r, client_w))
        finally:
            for writer in streams:
                self._streams.discard(writer)
                with contextlib.suppress(Exception):
                    writer.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._streams):
            with contextlib.suppress(Exception):
                writer.close()
        self._streams.clear()

    def close(self) -> None:
        """Stop listening and end the connections it carries."""
        if self.closed:
            return
        self.closed = True
        if self._opener is not None:
            _LoopThread.get().run(self._close()).result(10)

    # ---------------------------------------------------------------- probing
    def probe(self) -> str | None:
        """Why nothing answers on the head's port now, or None when something listens."""
        opener = self._opener or _local_opener  # the embedded cluster's port is this machine's

        async def check() -> str | None:
            try:
                _, writer = await asyncio.wait_for(opener(self.remote_port), 30)
            except Exception as exc:
                return _why(exc, self.where, self.remote_port)
            writer.close()
            return None

        return _LoopThread.get().run(check()).result(40)


async def _pump(reader: Any, writer: Any) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except Exception:  # either side went away: the other is closed by the caller
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


def _why(exc: BaseException, where: str, port: int) -> str:
    """Why a connection to ``where:port`` could not be made, in words."""
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if isinstance(exc, ConnectionRefusedError) or "refused" in str(reason).lower():
        return f"nothing listens on port {port} of the {where} (connection refused)"
    if isinstance(exc, asyncio.TimeoutError):
        return f"port {port} of the {where} did not answer in 30 s"
    if isinstance(exc, ClusterConnectionError):
        return f"the SSH link is down ({reason}); the forward works again once it is back"
    return f"could not reach port {port} of the {where} ({reason})"


def open_forward(remote_port: int, local_port: int | None, where: str, opener: Opener | None) -> PortForward:
    """Start a forward. ``opener`` None: the port is on this machine already.

    ``local_port`` None: a free port, picked by the system. (Not the head's port number
    when free here: on a head that is this machine, that port would lead back into the
    forward itself.) A ``local_port`` in use here is a ValueError naming a free one.
    """
    if opener is None and local_port in (None, remote_port):
        return PortForward(remote_port, remote_port, where, None)
    if opener is None:  # another local port for a port of this machine: a plain relay
        opener = _local_opener
    if local_port is None:
        local_port = 0
    forward = PortForward(remote_port, local_port, where, opener)
    try:
        _LoopThread.get().run(forward._listen()).result(30)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        free = free_port()
        raise ValueError(
            f"local port {local_port} is already in use on this machine; port {free} is free: "
            f"`%cluster forward {remote_port} --local {free}` (or leave --local out to pick one)"
        ) from None
    if local_port == 0:
        assert forward._server is not None
        forward.local_port = int(forward._server.sockets[0].getsockname()[1])
    return forward


async def _local_opener(port: int) -> tuple[Any, Any]:
    return await asyncio.open_connection("127.0.0.1", port)


def ssh_opener(transport: Any) -> Opener:
    """Connections to the head's loopback through ``transport``'s SSH connection (the one
    the link holds now: after a reconnect, the new one)."""

    async def opener(port: int) -> tuple[Any, Any]:
        import asyncssh

        try:
            conn = await transport.connection()
        except ClusterConnectionError:
            raise
        except (OSError, asyncssh.Error) as exc:
            raise ClusterConnectionError(str(getattr(exc, "reason", exc))) from None
        return await conn.open_connection("127.0.0.1", port)

    return opener


__all__ = ["PortForward", "check_port", "free_port", "open_forward", "ssh_opener"]
