"""What a driver cell's child processes and C code write to the agent's stdout and stderr goes to the cell.

A driver cell's ``print`` reaches the cell through ``sys.stdout`` (see :mod:`._execute`). A process the cell
starts (a ``multiprocessing`` pool, ``subprocess.run``) and C code inherit the agent's file descriptors 1 and 2
instead, which lead to the agent's log: under ``python script.py`` their lines show in the terminal with the
script's own. So, as ipykernel does for a notebook, the agent puts a pipe of its own behind descriptors 1 and
2 once it serves, and a thread reads each: a line that comes while a driver cell runs goes to that cell's
output; any other line, and the lines of Ray's own C++ logging, go where the descriptor led before (the
agent's log). Before a cell's output closes, the pipes are read to their end (:meth:`ProcessOutput.settle`), so
that a child that printed and exited within the cell is shown in it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import termios
import threading
import time
from typing import Any

log = logging.getLogger("jupyter_cluster.agent")

#: A line of Ray's C++ logging: "[2026-11-27 04:47:00,876 W 30911 30911] gcs_client.cc:210: ...".
RAY_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z] \d+ \d+\] ")
#: The longest :meth:`ProcessOutput.settle` waits for the pipes to be read to their end.
SETTLE = 0.5


class ProcessOutput:
    """The agent's descriptors 1 and 2, read by threads of their own, each line to the running driver cell."""

    def __init__(self) -> None:
        #: The running driver cell's output (a :class:`._execute.CellOutput`), or None.
        self.target: Any = None
        self._pipes: list[tuple[str, int, int]] = []  # (stream name, read end, where the descriptor led before)
        self._partial: dict[str, bytes] = {}
        self._busy = 0
        self._lock = threading.Lock()

    def install(self) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            try:
                saved = os.dup(fd)
                read, write = os.pipe()
                os.dup2(write, fd)
                os.close(write)
            except OSError:  # no such descriptor (a daemon started without one): nothing to take
                log.warning("could not put a pipe behind descriptor %d", fd, exc_info=True)
                continue
            self._pipes.append((name, read, saved))
            threading.Thread(
                target=self._read, args=(name, read, saved), daemon=True, name=f"agent-{name}-reader"
            ).start()

    def _read(self, name: str, read: int, saved: int) -> None:
        while True:
            try:
                chunk = os.read(read, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self._busy += 1
            try:
                data = self._partial.pop(name, b"") + chunk
                *lines, rest = data.split(b"\n")
                if rest:
                    self._partial[name] = rest
                for line in lines:
                    self._line(name, line + b"\n", saved)
            except Exception:  # the descriptors must never block: whatever happens, keep reading
                log.debug("could not route a line of descriptor %s", name, exc_info=True)
            finally:
                with self._lock:
                    self._busy -= 1

    def _line(self, name: str, line: bytes, saved: int) -> None:
        target = self.target
        if target is not None and not RAY_LINE.match(line) and target.add_open(name, line.decode(errors="replace")):
            return
        os.write(saved, line)

    def settle(self) -> None:
        """Read the pipes to their end (at most :data:`SETTLE` s), then give the running cell the partial lines."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and (self._busy or any(_unread(read) for _, read, _ in self._pipes)):
            time.sleep(0.002)
        for name, _, saved in self._pipes:
            rest = self._partial.pop(name, b"")
            if rest:
                self._line(name, rest, saved)


def _unread(fd: int) -> int:
    """How many bytes wait in pipe ``fd``."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


#: The agent's one (installed once it serves, see ._main).
PROCESS_OUTPUT = ProcessOutput()

__all__ = ["PROCESS_OUTPUT", "RAY_LINE", "ProcessOutput"]
