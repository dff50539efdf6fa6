"""A head reached through any command: ``%cluster connect --via COMMAND``.

Any command that runs a program on the head with its stdin and stdout joined to ours carries the session:
``kubectl exec -i -n ray POD -c ray-head --``, ``docker exec -i CONTAINER``, ``ssh -p 2222 user@host`` (an
OpenSSH client, for a jump host, Kerberos or a hardware key that asyncssh cannot do), ``srun --pty``... The
command is given one more argument, ``sh``, the one word every such command passes through unchanged (``ssh``
joins its arguments into a shell line, ``kubectl exec`` does not), and the shell reads what to run from its
stdin. A shell may read ahead on a pipe (dash does), so nothing more is sent until the program it runs has said
so: what follows on stdin is then that program's. Everything above the byte stream is the SSH link's: the agent
is started or found by the same boot script (shipped through stdin where the head lacks the package), and the
session's stream is a small relay on the head between the command's stdin and stdout and the agent's Unix
socket, started again for each reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import os
import shlex
import shutil
import tarfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ._crash import how_it_ended
from ._errors import ClusterConnectionError
from ._prompts import Terminal
from ._ssh import _AGENT_DIR, HeadError, RemoteHead, agent_fingerprint, agent_modules

#: Stderr lines of a failed command that an error quotes.
STDERR_LINES = 8
#: Seconds the first command on the head (is there a shell, and that Python?) has to answer: a command that logs
#: in over a slow link answers in seconds; one that hangs (a stalled ``kubectl``, a host that drops packets) never.
PROBE_TIMEOUT = 60.0
#: Seconds a relay has to say it reached the agent's socket (a ``kubectl exec`` starts in about a second).
RELAY_TIMEOUT = 30.0
#: What a command's inner shell says before its input is sent (see :meth:`CommandHead.run`).
READY = "jupyter-cluster-ready"
READY_LINE = READY.encode() + b"\n"
#: The relay's first line: what it found (then bytes, both ways).
RELAY_OK = b"jupyter-cluster-relay ok\n"

#: Run on the head: joins its stdin and stdout to the agent's Unix socket (argv[1]), or to a TCP port of the head's
#: loopback (``tcp:PORT``: a port forward). Its first line says whether it reached it; then bytes go both ways until
#: either side ends.
RELAY = r"""
import os, socket, sys, threading
where = sys.argv[1]
tcp = where.startswith("tcp:")
s = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX)
try:
    s.connect(("127.0.0.1", int(where[4:])) if tcp else where)
except OSError as exc:
    os.write(1, ("jupyter-cluster-relay error %s\n" % exc).encode())
    sys.exit(3)
os.write(1, b"jupyter-cluster-relay ok\n")
def up():
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            break
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(1 << 16)
    if not data:
        break
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
"""

#: Run on the head: passes argv[1] bytes of its stdin on to its stdout, then ends (the input of a command run by
#: :meth:`CommandHead.run`, whose end a ``kubectl exec`` over ``v4.channel.k8s.io`` cannot pass on).
TAKE = r"""
import os, sys
left = int(sys.argv[1])
while left > 0:
    data = os.read(0, min(left, 1 << 16))
    if not data:
        break
    left -= len(data)
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
"""

#: Run on the head: unpacks the agent's modules (a tar on stdin) into argv[1], then marks them complete with
#: argv[2] (the modules' fingerprint), as the SSH link's SFTP copy does.
UNPACK = r"""
import io, os, sys, tarfile
lib, marker = sys.argv[1], sys.argv[2]
with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
    tar.extractall(lib)
with open(os.path.join(lib, "jupyter_cluster", "agent", ".complete"), "w") as f:
    f.write(marker)
"""


@dataclass
class ViaTarget:
    """A command that runs a program on the head (``argv`` then ``sh``), and the head's Python."""

    argv: list[str]
    python: str = "python3"
    #: What to add to an error of the command whose stderr holds the key (``k8s:``: a refused ``pods/exec``).
    explain: dict[str, str] = field(default_factory=dict)
    #: Asked when the command fails on a reconnect: why the head it reached is gone for good (``k8s:``: its pod
    #: was replaced), or None.
    replaced: Callable[[], Awaitable[str | None]] | None = None
    #: What the user gave, where it was not the command itself (``k8s:ray/raycluster``), for the resume hint.
    given: str = ""

    def failed(self, status: int | None, stderr: str, refused: str = "") -> str:
        """The command's failure in words: its exit status, its last stderr lines, what they call for, and the
        questions it asked that got no answer (``refused``: :meth:`Terminal.refused`)."""
        err = last_lines(stderr)
        said = f"--via `{self.describe()}` failed (exit status {status})" + (f":\n{err}" if err else ", saying nothing")
        hints = [hint for key, hint in self.explain.items() if key in stderr]
        return "\n".join([said, *hints, *([refused] if refused else [])])

    @classmethod
    def parse(cls, command: str | Sequence[str], python: str | None = None) -> ViaTarget:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("--via takes a command that runs a program on the head, e.g. `kubectl exec -i POD --`")
        return cls(argv, python or "python3")

    @property
    def host(self) -> str:
        """The head's name in messages: the command."""
        return f"`{self.describe()}`"

    def describe(self) -> str:
        return shlex.join(self.argv)


def last_lines(text: str, count: int = STDERR_LINES) -> str:
    """The last ``count`` lines of ``text`` that say something."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])


class CommandHead(RemoteHead):
    """Commands run on the head through ``target``'s command, each a process of its own."""

    def __init__(self, target: ViaTarget) -> None:
        super().__init__(target, None)  # type: ignore[arg-type]
        self.via = target

    async def spawn(self, *, interactive: bool = True) -> tuple[asyncio.subprocess.Process, Terminal]:
        """The command, with a shell on the head reading its stdin, and a terminal of its own whose prompts (a
        password, a second factor) are asked in the notebook (``interactive``; else refused at once: a port
        forward's connection, which nobody waits on); a clear error where it cannot start.

        The command leads a session of its own (an interrupt of the kernel is not the command's), with the terminal
        as that session's. When it ends, the terminal's hangup would end whatever it left running on this machine
        (``ip netns exec``, ``sh -c``: a ``ray start``'s daemons): it runs under ``nohup``, as a login shell's
        background work does."""
        program = self.via.argv[0]
        found = shutil.which(program)
        if found is None:
            reason = os.strerror(errno.EACCES if os.path.exists(program) else errno.ENOENT)
            raise ClusterConnectionError(
                f"--via: cannot run {program!r} ({reason}): check the command (`{self.via.describe()}`) and that it is "
                "on this machine's PATH"
            )
        nohup = [shutil.which("nohup") or "nohup"]
        terminal = Terminal(f"`{self.via.describe()}`", interactive=interactive)
        try:
            proc = await asyncio.create_subprocess_exec(
                *nohup,
                found,
                *self.via.argv[1:],
                "sh",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=terminal.preexec,
            )
        except OSError as exc:
            terminal.close()
            raise ClusterConnectionError(f"--via: cannot run {program!r} ({exc.strerror})") from None
        terminal.start(proc.wait(), end=lambda: _kill(proc))
        return proc, terminal

    async def run(self, command: str, *, stdin: str | bytes | None = None, timeout: float = 120.0) -> Any:
        """Run ``command`` (a shell line) on the head, with ``stdin`` as its input.

        A shell may read ahead of the line it runs (dash does, on a pipe), so the input is sent only once the line
        runs: an inner shell says so first (:data:`READY`), and the outer one has run it by then. Nothing relies on
        the end of the command's stdin reaching the head: ``kubectl exec`` over the older exec protocol
        (``v4.channel.k8s.io``) cannot say it. The outer shell is told to ``exit``, and the input's length goes
        with it (:data:`TAKE` passes that many bytes on, then ends the command's input)."""
        proc, terminal = await self.spawn()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if stdin is None:
                out, err = await terminal.within(proc.communicate(f"{command}\nexit\n".encode()), timeout)
            else:
                payload = stdin.encode() if isinstance(stdin, str) else stdin
                take = shlex.join([self.python, "-c", TAKE, str(len(payload))])
                proc.stdin.write(f"exec sh -c {shlex.quote(f'echo {READY}; {take} | {{ {command}; }}')}\n".encode())
                first = await terminal.within(proc.stdout.readline(), timeout)
                out, err = await terminal.within(proc.communicate(payload if first == READY_LINE else b""), timeout)
                if first != READY_LINE:
                    out = first + out
        except asyncio.TimeoutError:
            _kill(proc)
            raise ClusterConnectionError(
                f"--via `{self.via.describe()}` did not end within {timeout:.0f} s running: {command[:80]}"
            ) from None
        return SimpleNamespace(
            exit_status=proc.returncode,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace") + terminal.said,
            refused=terminal.refused(),
        )

    async def boot(self, request: dict[str, Any]) -> dict[str, Any]:
        """The SSH link's boot (:meth:`RemoteHead.boot`), where the command's own failure (kubectl's "Forbidden",
        a pod that is not there, a refused login) is named as the command's, with its last lines."""
        probe = await self.run(
            f"echo jupyter-cluster-shell; command -v {self.python} >/dev/null && echo jupyter-cluster-found",
            timeout=PROBE_TIMEOUT,
        )
        if "jupyter-cluster-found" not in str(probe.stdout):
            if "jupyter-cluster-shell" in str(probe.stdout):  # the head's shell ran the probe: no such Python there
                raise HeadError(
                    f"there is no Python at {self.via.python!r} on the head: pass --python with the path of one "
                    "that has Ray."
                )
            raise ClusterConnectionError(self.via.failed(probe.exit_status, str(probe.stderr), probe.refused))
        return await super().boot(request)

    async def ship_agent(self, lib: str, version: str) -> None:
        """Send the agent's modules to ``lib`` as a tar on stdin (the SSH link copies them over SFTP)."""
        buffer = io.BytesIO()
        stub = f'"""The agent\'s modules, shipped to this head."""\n\n__version__ = "{version}"\n'.encode()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            info = tarfile.TarInfo("jupyter_cluster/__init__.py")
            info.size = len(stub)
            tar.addfile(info, io.BytesIO(stub))
            for name in agent_modules():
                tar.add(str(_AGENT_DIR / name), arcname=f"jupyter_cluster/agent/{name}")
        argv = [self.via.python, "-c", UNPACK, lib, agent_fingerprint()]
        done = await self.run(shlex.join(argv), stdin=buffer.getvalue())
        if done.exit_status != 0:
            raise ClusterConnectionError(
                f"--via `{self.via.describe()}`: could not copy the agent's modules to {lib} on the head:\n"
                + last_lines(done.stderr)
            )


def _kill(proc: asyncio.subprocess.Process) -> None:
    """End the command (and what it started on this machine: it leads a process group of its own)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)


class CommandTransport:
    """The agent's socket on the head, through a relay the command runs: one process per stream, run again on
    each reconnect (the command's own connection, a ``kubectl exec`` or an ``ssh``, goes with it)."""

    def __init__(self, target: ViaTarget, socket_path: str) -> None:
        self.target = target
        self.head = CommandHead(target)
        self.socket_path = socket_path
        #: The agent's process id on the head (from its welcome), to tell "gone" from "unreachable".
        self.agent_pid: int | None = None
        self._gone: str | None = None
        #: Whether the head is gone for good, replaced by another (``k8s:``: a new head pod).
        self.head_replaced = False
        self._proc: asyncio.subprocess.Process | None = None

    async def relay(self, where: str, *, interactive: bool = True) -> tuple[asyncio.subprocess.Process, str, Terminal]:
        """A relay on the head to ``where`` (the agent's socket, or ``tcp:PORT``): the process, once it said it
        reached it, and ``""``; or the process and what it said instead (``""`` too where it said nothing); and the
        command's terminal."""
        proc, terminal = await self.head.spawn(interactive=interactive)
        assert proc.stdin is not None and proc.stdout is not None
        argv = [self.target.python, "-u", "-c", RELAY, where]
        proc.stdin.write(f"exec {shlex.join(argv)}\n".encode())
        try:
            first = await terminal.within(proc.stdout.readline(), RELAY_TIMEOUT)
        except asyncio.TimeoutError:
            _kill(proc)
            raise ClusterConnectionError(
                f"--via `{self.target.describe()}` said nothing within {RELAY_TIMEOUT:.0f} s"
            ) from None
        return proc, "" if first == RELAY_OK else first.decode(errors="replace").strip() or "?", terminal

    async def open_port(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream to ``port`` on the head's loopback (a port forward's connection)."""
        proc, said, _ = await self.relay(f"tcp:{port}", interactive=False)
        if said:
            _kill(proc)
            raise ConnectionRefusedError(said)
        assert proc.stdout is not None and proc.stdin is not None
        return proc.stdout, proc.stdin

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.discard()
        proc, said, terminal = await self.relay(self.socket_path)
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        if not said:
            self._proc = proc
            return proc.stdout, proc.stdin
        if said == "?":  # the command ended before the relay ran: its own error is on stderr
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
            err = (await proc.stderr.read()).decode(errors="replace")
            _kill(proc)
            if self.target.replaced is not None and self.agent_pid is not None:
                gone = await self.target.replaced()
                if gone:
                    self._gone = gone
                    self.head_replaced = True
                    raise ClusterConnectionError(gone)
            raise ClusterConnectionError(self.target.failed(proc.returncode, err + terminal.said, terminal.refused()))
        _kill(proc)
        crash = await self.head.agent_death(self.agent_pid, self.socket_path, timeout=30)
        if crash is not None:
            self._gone = f"the agent on the head died: {how_it_ended(None, crash)} ({said})"
            raise ClusterConnectionError(self._gone)
        raise ClusterConnectionError(f"the agent's socket on the head did not answer ({said})")

    def lost_reason(self) -> str | None:
        return self._gone

    def discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill(proc)

    def describe(self) -> str:
        return f"via {self.target.describe()}"

    def resume_hint(self, session: str) -> str:
        given = self.target.given or f"--via {shlex.quote(self.target.describe())}"
        words = ["%cluster connect", given, "--session", session]
        if self.target.python != "python3":
            words += ["--python", shlex.quote(self.target.python)]
        return " ".join(words)


__all__ = ["CommandHead", "CommandTransport", "ViaTarget"]
